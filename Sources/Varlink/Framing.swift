import Glibc

/// Splits a byte stream into Varlink messages, each terminated by a NUL byte.
/// Feed it what `read` returned; take messages out until it has none. It
/// resumes scanning where it stopped and refuses a message over `maximumSize`.
/// Bytes it no longer needs are zeroed, not just dropped: a message handed out
/// by `next()` is zeroed at the following call, and its buffer never moves or
/// grows leaving a copy behind (a call may carry a token).
public struct VarlinkFrameDecoder: Sendable {
    /// The largest message accepted, NUL excluded: 1 MiB by default.
    public let maximumSize: Int
    private var buffer: [UInt8] = []
    private var start = 0
    private var scanned = 0
    /// Bytes before this index and before `start` were handed out and are zeroed.
    private var zeroedTo = 0

    /// Why the stream cannot be decoded further.
    public enum Failure: Error, Equatable, Sendable {
        /// A message grew past the size cap before its NUL arrived.
        case messageTooLarge(limit: Int)
    }

    /// A decoder with the given size cap.
    public init(maximumSize: Int = 1 << 20) { self.maximumSize = maximumSize }

    /// Appends bytes read from the stream.
    public mutating func append<C: Collection>(_ bytes: C) where C.Element == UInt8 {
        reserve(bytes.count)
        buffer.append(contentsOf: bytes)
    }

    /// Appends bytes read from the stream.
    public mutating func append(_ bytes: UnsafeRawBufferPointer) {
        reserve(bytes.count)
        buffer.append(contentsOf: bytes)
    }

    /// Zeroes every byte held, read or not, and starts over: for a connection
    /// that is closed.
    public mutating func wipe() {
        VarlinkFrameDecoder.zero(&buffer, 0..<buffer.count)
        buffer.removeAll(keepingCapacity: true)
        start = 0
        scanned = 0
        zeroedTo = 0
    }

    /// Makes room for `extra` more bytes; a buffer that must grow is copied
    /// and the old one zeroed before it is freed (Array's own growth would
    /// free it as it is).
    private mutating func reserve(_ extra: Int) {
        guard buffer.count + extra > buffer.capacity else { return }
        var grown: [UInt8] = []
        grown.reserveCapacity(max(buffer.capacity * 2, buffer.count + extra, 4096))
        grown.append(contentsOf: buffer)
        VarlinkFrameDecoder.zero(&buffer, 0..<buffer.count)
        buffer = grown
    }

    private static func zero(_ bytes: inout [UInt8], _ range: Range<Int>) {
        guard !range.isEmpty else { return }
        bytes.withUnsafeMutableBytes { raw in
            // memset, not explicit_bzero: the array still owns the bytes at
            // this store, so the compiler must assume they are read again.
            _ = memset(raw.baseAddress! + range.lowerBound, 0, range.count)
        }
    }

    /// True when bytes of an unfinished message are waiting.
    public var hasPartialMessage: Bool { start < buffer.count }

    /// The next complete message without its NUL, or nil when none is complete yet.
    public mutating func next() throws(Failure) -> ArraySlice<UInt8>? {
        // The message handed out last was parsed by now: zero it.
        VarlinkFrameDecoder.zero(&buffer, zeroedTo..<start)
        zeroedTo = start
        if let nul = firstNUL() {
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

    /// The index of the first NUL at or after `scanned`, found with memchr.
    private func firstNUL() -> Int? {
        guard scanned < buffer.count else { return nil }
        return buffer.withUnsafeBytes { raw -> Int? in
            guard let found = memchr(raw.baseAddress! + scanned, 0, buffer.count - scanned) else { return nil }
            return raw.baseAddress!.distance(to: UnsafeRawPointer(found))
        }
    }

    private mutating func compactIfDrained() {
        if start == buffer.count {
            buffer.removeAll(keepingCapacity: buffer.capacity <= 64 * 1024)
            start = 0
            scanned = 0
            zeroedTo = 0
        } else if start > 64 * 1024 {
            // Move the unfinished message down and zero where it was, rather
            // than leave a copy of it past the end.
            let rest = buffer.count - start
            let consumed = start
            buffer.withUnsafeMutableBytes { raw in
                _ = memmove(raw.baseAddress!, raw.baseAddress! + consumed, rest)
            }
            VarlinkFrameDecoder.zero(&buffer, rest..<buffer.count)
            buffer.removeLast(consumed)
            scanned -= start
            start = 0
            zeroedTo = 0
        }
    }
}
