import Varlink

/// A secret value (a token). Printing it, interpolating it or dumping it shows
/// only the masked form, so a secret cannot slip into a log line or an error.
///
/// The bytes live in storage of their own that is zeroed when the last copy of
/// the secret is released, not in a `String` buffer that is freed as it is.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    private let storage: Storage

    /// Wraps a secret value; its UTF-8 bytes are copied into wiped storage.
    public init(_ value: String) { storage = Storage(value.utf8) }

    /// Wraps secret UTF-8 bytes (copied into wiped storage).
    public init<C: Collection<UInt8>>(utf8 bytes: C) { storage = Storage(bytes) }

    /// The secret as a `String`, made for a caller that needs one (a form field,
    /// a JSON value). Prefer `withUTF8(_:)`, which makes no copy.
    public var revealed: String { withUTF8 { String(decoding: $0, as: UTF8.self) } }

    /// Calls `body` with the secret's UTF-8 bytes, without copying them.
    public func withUTF8<R>(_ body: (UnsafeBufferPointer<UInt8>) throws -> R) rethrows -> R {
        try body(UnsafeBufferPointer(storage.bytes))
    }

    /// The secret's length in UTF-8 bytes.
    public var utf8Count: Int { storage.bytes.count }

    /// True for an empty secret.
    public var isEmpty: Bool { storage.bytes.isEmpty }

    /// Appends the secret as a quoted JSON string, without an intermediate copy.
    public func writeJSONString(into out: inout [UInt8]) {
        withUTF8 { JSON.writeString(utf8: $0, into: &out) }
    }

    public static func == (lhs: Secret, rhs: Secret) -> Bool {
        lhs.storage === rhs.storage || lhs.storage.bytes.elementsEqual(rhs.storage.bytes)
    }

    /// The bytes, zeroed before they are released. Immutable after init, so
    /// sharing it between threads is safe.
    private final class Storage: @unchecked Sendable {
        let bytes: UnsafeMutableBufferPointer<UInt8>

        init<C: Collection<UInt8>>(_ source: C) {
            bytes = .allocate(capacity: source.count)
            _ = bytes.initialize(fromContentsOf: source)
        }

        deinit {
            Secret.wipe(UnsafeMutableRawBufferPointer(bytes))
            bytes.deallocate()
        }
    }

    /// Zeroes `memory` in a way the optimizer keeps: the stores go through a
    /// volatile-like opaque pointer so they are not dropped as dead before the
    /// memory is released.
    public static func wipe(_ memory: UnsafeMutableRawBufferPointer) {
        guard let base = memory.baseAddress, memory.count > 0 else { return }
        wipeHook(base, memory.count)
    }

    /// Kept behind a mutable global so the compiler cannot see, and elide, the
    /// zeroing it performs.
    nonisolated(unsafe) private static var wipeHook: (UnsafeMutableRawPointer, Int) -> Void = { base, count in
        base.initializeMemory(as: UInt8.self, repeating: 0, count: count)
    }

    /// The masked form: `in********yz` for a token of 16 characters or more.
    public var masked: String { withUTF8 { String(decoding: Secret.mask(utf8: $0), as: UTF8.self) } }

    public var description: String { masked }
    public var debugDescription: String { "Secret(\(masked))" }

    /// `dump` and debuggers see the masked form only.
    public var customMirror: Mirror { Mirror(self, children: ["masked": masked]) }

    /// The stars that stand for the hidden part; always eight, so that the
    /// mask does not tell the secret's length either.
    public static let stars = "********"

    /// Masks a secret, showing at most four of its characters and never more
    /// than a quarter of them: the first and last two around eight stars from
    /// 16 characters on, the first and last one from 8, stars only below.
    public static func mask(_ value: String) -> String {
        String(decoding: mask(utf8: value.utf8), as: UTF8.self)
    }

    /// `mask(_:)` on UTF-8 bytes, counting Unicode scalars (a partial scalar
    /// counts as one): for text that is never made into a `String` before it is
    /// masked, such as a helper's output.
    public static func mask<C: Collection<UInt8>>(utf8 value: C) -> [UInt8] {
        // Scalars start at every byte that is not a continuation byte. No copy
        // of the secret is made: only the shown bytes are.
        let count = value.reduce(0) { $1 & 0xC0 != 0x80 ? $0 + 1 : $0 }
        let shown = count >= 16 ? 2 : count >= 8 ? 1 : 0
        var out: [UInt8] = []
        out.reserveCapacity(stars.utf8.count + 8 * shown)
        var seen = 0
        for byte in value {
            if byte & 0xC0 != 0x80 { seen += 1 }
            if seen > shown { break }
            out.append(byte)
        }
        out.append(contentsOf: stars.utf8)
        seen = 0
        var tailStart = value.endIndex
        var index = value.startIndex
        while shown > 0, index != value.endIndex {
            if value[index] & 0xC0 != 0x80 {
                seen += 1
                if seen == count - shown + 1 {
                    tailStart = index
                    break
                }
            }
            index = value.index(after: index)
        }
        out.append(contentsOf: value[tailStart...])
        return out
    }
}
