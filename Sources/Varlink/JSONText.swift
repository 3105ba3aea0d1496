/// Writes JSON values straight into a byte buffer, for replies built by hand
/// on the serving path: the same bytes as `JSON.write(into:)`, with the
/// common cases (a string that needs no escape, a whole number) copied or
/// formatted without going through `JSON` values.
public enum JSONText {
    /// Appends `s` as a quoted JSON string, as `JSON.writeString` writes it.
    public static func appendString(_ s: String, to out: inout [UInt8]) {
        let copied = s.utf8.withContiguousStorageIfAvailable { appendPlain($0, to: &out) }
        if copied != true { JSON.writeString(s, into: &out) }
    }

    /// Appends UTF-8 `bytes` (a secret's, say, with no String made of them)
    /// as a quoted JSON string, as `JSON.writeString(utf8:into:)` writes it.
    public static func appendString(utf8 bytes: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) {
        if !appendPlain(bytes, to: &out) { JSON.writeString(utf8: bytes, into: &out) }
    }

    /// Appends `bytes` quoted when none needs an escape; false (and nothing
    /// appended) otherwise.
    private static func appendPlain(_ bytes: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) -> Bool {
        // One pass without early exit, which vectorises.
        var escaped: UInt8 = 0
        for b in bytes { escaped |= (b < 0x20 ? 1 : 0) | (b == 0x22 ? 1 : 0) | (b == 0x5C ? 1 : 0) }
        guard escaped == 0 else { return false }
        out.append(UInt8(ascii: "\""))
        out.append(contentsOf: bytes)
        out.append(UInt8(ascii: "\""))
        return true
    }

    /// Appends the bytes of `text` (JSON punctuation and member names), copied whole.
    public static func appendLiteral(_ text: StaticString, to out: inout [UInt8]) {
        out.append(contentsOf: UnsafeBufferPointer(start: text.utf8Start, count: text.utf8CodeUnitCount))
    }

    /// Appends `n` as a JSON number, as `JSON.int(n).write(into:)` writes it
    /// for the whole numbers a `JSON` number holds exactly (|n| < 9e15).
    public static func appendNumber(_ n: Int64, to out: inout [UInt8]) {
        guard n > -9_000_000_000_000_000 && n < 9_000_000_000_000_000 else {
            JSON.int(n).write(into: &out)
            return
        }
        if n < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = n.magnitude
        var digits: (UInt64, UInt64) = (0, 0)  // 16 bytes of room, filled from the end
        var count = 0
        withUnsafeMutableBytes(of: &digits) { room in
            repeat {
                count += 1
                room[16 - count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
            } while magnitude > 0
            out.append(contentsOf: room[(16 - count)...])
        }
    }
}
