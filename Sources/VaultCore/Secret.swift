/// A secret value (a token). Printing it, interpolating it or dumping it shows
/// only the masked form, so a secret cannot slip into a log line or an error.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible,
    CustomReflectable
{
    /// The secret itself. Read it only where it must leave the process: the
    /// secret store, a GetToken reply, a provider request.
    public let revealed: String

    /// Wraps a secret value.
    public init(_ value: String) { self.revealed = value }

    /// The masked form: `in********yz` for a token of 16 characters or more.
    public var masked: String { Secret.mask(revealed) }

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
