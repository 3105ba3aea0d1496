/// Splits a byte stream into Varlink messages, each terminated by a NUL byte.
/// Feed it what `read` returned; take messages out until it has none. It
/// resumes scanning where it stopped and refuses a message over `maximumSize`.
public struct VarlinkFrameDecoder: Sendable {
    /// The largest message accepted, NUL excluded: 1 MiB by default.
    public let maximumSize: Int
    private var buffer: [UInt8] = []
    private var start = 0
    private var scanned = 0

    /// Why the stream cannot be decoded further.
    public enum Failure: Error, Equatable, Sendable {
        /// A message grew past the size cap before its NUL arrived.
        case messageTooLarge(limit: Int)
    }

    /// A decoder with the given size cap.
    public init(maximumSize: Int = 1 << 20) { self.maximumSize = maximumSize }

    /// Appends bytes read from the stream.
    public mutating func append<C: Collection>(_ bytes: C) where C.Element == UInt8 {
        buffer.append(contentsOf: bytes)
    }

    /// Appends bytes read from the stream.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        buffer.append(contentsOf: bytes)
    }

    /// True when bytes of an unfinished message are waiting.
    public var hasPartialMessage: Bool { start < buffer.count }

    /// The next complete message without its NUL, or nil when none is complete yet.
    public mutating func next() throws(Failure) -> ArraySlice<UInt8>? {
        if let nul = buffer[scanned...].firstIndex(of: 0) {
            let message = buffer[start..<nul]
            start = nul + 1
            scanned = start
            if message.count > maximumSize { throw .messageTooLarge(limit: maximumSize) }
            return message
        }
        scanned = buffer.count
        if buffer.count - start > maximumSize { throw .messageTooLarge(limit: maximumSize) }
        compactIfDrained()
        return nil
    }

    private mutating func compactIfDrained() {
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 64 * 1024)
            start = 0
            scanned = 0
        } else if start > 64 * 1024 {
            buffer.removeFirst(start)
            scanned -= start
            start = 0
        }
    }
}
