/// Base64 (RFC 4648): the bytes etcd's gateway carries, HTTP Basic client
/// authentication's credentials, and the parts of a JWT. It encodes the
/// standard alphabet, padded (section 4), and decodes both alphabets, padded
/// or not (section 5's base64url too).
public enum Base64 {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".utf8)

    /// `bytes` in base64.
    public static func encode(_ bytes: [UInt8]) -> String { String(decoding: encodedBytes(bytes), as: UTF8.self) }

    /// `bytes` in base64, as bytes: for a secret, whose copy the caller can wipe.
    public static func encodedBytes(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count + 2) / 3 * 4)
        var index = 0
        while index < bytes.count {
            let b0 = bytes[index]
            let b1 = index + 1 < bytes.count ? bytes[index + 1] : 0
            let b2 = index + 2 < bytes.count ? bytes[index + 2] : 0
            out.append(alphabet[Int(b0 >> 2)])
            out.append(alphabet[Int((b0 & 0x03) << 4 | b1 >> 4)])
            out.append(index + 1 < bytes.count ? alphabet[Int((b1 & 0x0F) << 2 | b2 >> 6)] : UInt8(ascii: "="))
            out.append(index + 2 < bytes.count ? alphabet[Int(b2 & 0x3F)] : UInt8(ascii: "="))
            index += 3
        }
        return out
    }

    /// The bytes of base64 or base64url `text`, padded or not; nil when it is
    /// neither (a character of neither alphabet, `=` before the end, more than
    /// two of them, or a length no encoding gives).
    public static func decode(_ text: String) -> [UInt8]? {
        var values: [UInt8] = []
        var padding = 0
        for char in text.utf8 {
            if char == UInt8(ascii: "=") {
                padding += 1
                continue
            }
            guard padding == 0 else { return nil }
            switch char {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"): values.append(char - UInt8(ascii: "A"))
            case UInt8(ascii: "a")...UInt8(ascii: "z"): values.append(char - UInt8(ascii: "a") + 26)
            case UInt8(ascii: "0")...UInt8(ascii: "9"): values.append(char - UInt8(ascii: "0") + 52)
            case UInt8(ascii: "+"), UInt8(ascii: "-"): values.append(62)
            case UInt8(ascii: "/"), UInt8(ascii: "_"): values.append(63)
            default: return nil
            }
        }
        guard padding <= 2, values.count % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(values.count * 3 / 4)
        var index = 0
        while index < values.count {
            let v0 = values[index]
            let v1 = index + 1 < values.count ? values[index + 1] : 0
            out.append(v0 << 2 | v1 >> 4)
            if index + 2 < values.count {
                let v2 = values[index + 2]
                out.append(v1 << 4 | v2 >> 2)
                if index + 3 < values.count { out.append(v2 << 6 | values[index + 3]) }
            }
            index += 4
        }
        return out
    }
}
