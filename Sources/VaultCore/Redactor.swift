/// Masks the secrets in text vaultd did not write itself (what a helper prints
/// on stdout or stderr, the `message` of its answer) before it is logged, kept
/// as a session's last error or put in an error message. The one place that
/// decides what such text may show.
///
/// Masked, each with `Secret.mask`:
/// - the values of secret-looking keys (`access_token`, `refresh_token`,
///   `token`, `authToken`, `secret`, `apiKey`, `password`, `client_secret`:
///   any key that, lowercased without `_` and `-`, is or ends in `token`,
///   `secret`, `apikey`, `password` or `passwd`) in the forms `"key": "value"`
///   (JSON, escaped quotes included), `key=value` and `key: value`, quoted or
///   not;
/// - a long word right after such a key or `Bearer` and a space (`bad token
///   abcd1234efgh5678`);
/// - every known secret wherever it shows, and, in text that was cut at a
///   size limit (`cut`), a start of one that the text ends with.
///
/// Masking comes before truncating, so that a cut never splits a secret out
/// of its key.
public enum Redactor {
    /// The fewest bytes of a known secret that are masked where they show.
    public static let shortestKnownSecret = 4
    /// The fewest characters of a word after a bare key (`token abcd...`)
    /// that are taken for a secret.
    public static let shortestBareSecret = 12
    /// What ends text cut by `limit`.
    public static let truncationMark = "...[truncated]"

    /// `text` with its secrets masked, then cut to at most `limit` bytes of
    /// UTF-8 (on a scalar boundary, the truncation mark added).
    public static func redact(_ text: String, knownSecrets: [String] = [], limit: Int = .max) -> String {
        redact(utf8: Array(text.utf8), knownSecrets: knownSecrets, limit: limit)
    }

    /// `redact(_:knownSecrets:limit:)` on raw bytes (a helper's output, never
    /// made into a `String` unmasked), which were cut at a size limit when
    /// `cut`. Invalid UTF-8 shows as U+FFFD. `wipe` is called on every buffer
    /// of its own that held a secret, before it is freed (the daemon passes
    /// `explicit_bzero`; this module has no C).
    public static func redact(
        utf8 bytes: [UInt8], cut: Bool = false, knownSecrets: [String] = [], limit: Int = .max,
        wipe: (inout [UInt8]) -> Void = { _ in }
    ) -> String {
        var masked = maskKeyValues(bytes)
        maskKnown(&masked, knownSecrets, cut: cut, wipe: wipe)
        let text = String(decoding: truncated(masked, limit: limit), as: UTF8.self)
        wipe(&masked)
        return text
    }

    /// True for a key whose value is a secret: lowercased and without `_`
    /// and `-`, one of or ending in `token`, `secret`, `apikey`, `password`,
    /// `passwd`.
    public static func isSecretKey<C: Collection<UInt8>>(_ key: C) -> Bool {
        var normalized: [UInt8] = []
        for byte in key where byte != UInt8(ascii: "_") && byte != UInt8(ascii: "-") {
            normalized.append(byte >= 0x41 && byte <= 0x5A ? byte + 0x20 : byte)
        }
        return secretKeySuffixes.contains {
            normalized.count >= $0.count && normalized.suffix($0.count).elementsEqual($0)
        }
    }

    private static let secretKeySuffixes = ["token", "secret", "apikey", "password", "passwd"].map { Array($0.utf8) }
    private static let bearer = Array("bearer".utf8)

    private static func isKeyByte(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "_"), UInt8(ascii: "-"):
            return true
        default: return false
        }
    }

    /// Bytes that end an unquoted value.
    private static func endsValue(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x20, 0x09, 0x0A, 0x0D, UInt8(ascii: ","), UInt8(ascii: ";"), UInt8(ascii: "&"), UInt8(ascii: "}"),
            UInt8(ascii: "]"), UInt8(ascii: ")"), UInt8(ascii: "\""), UInt8(ascii: "'"):
            return true
        default: return false
        }
    }

    /// Bytes of a bare token word (base64, base64url, hex, JWT, ids).
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        isKeyByte(byte) || byte == UInt8(ascii: ".") || byte == UInt8(ascii: "~") || byte == UInt8(ascii: "+")
            || byte == UInt8(ascii: "/") || byte == UInt8(ascii: "=")
    }

    private static func isBlank(_ byte: UInt8) -> Bool { byte == 0x20 || byte == 0x09 }

    /// Where the value after a secret key that ends before `index` lies, if
    /// one follows: after `:` or `=` (quoted or not), or a long word after blanks.
    private static func value(after index: Int, in bytes: [UInt8], bareAllowed: Bool) -> Range<Int>? {
        var j = index
        while j < bytes.count, isBlank(bytes[j]) { j += 1 }
        guard j < bytes.count else { return nil }
        if bytes[j] == UInt8(ascii: ":") || bytes[j] == UInt8(ascii: "=") {
            j += 1
            while j < bytes.count, isBlank(bytes[j]) { j += 1 }
            guard j < bytes.count else { return nil }
            let quote = bytes[j]
            if quote == UInt8(ascii: "\"") || quote == UInt8(ascii: "'") {
                let start = j + 1
                var end = start
                while end < bytes.count, bytes[end] != quote {
                    end += bytes[end] == UInt8(ascii: "\\") ? 2 : 1
                }
                end = min(end, bytes.count)
                return end > start ? start..<end : nil
            }
            var end = j
            while end < bytes.count, !endsValue(bytes[end]) { end += 1 }
            return end > j ? j..<end : nil
        }
        guard bareAllowed, j > index else { return nil }
        var end = j
        while end < bytes.count, isTokenByte(bytes[end]) { end += 1 }
        return end - j >= shortestBareSecret ? j..<end : nil
    }

    /// Masks the values of secret-looking keys.
    static func maskKeyValues(_ bytes: [UInt8]) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = 0
        while i < bytes.count {
            let byte = bytes[i]
            let quoted = byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "'")
            let keyStart = quoted ? i + 1 : i
            let atBoundary = quoted || i == 0 || !isKeyByte(bytes[i - 1])
            if atBoundary, keyStart < bytes.count, isKeyByte(bytes[keyStart]) {
                var keyEnd = keyStart
                while keyEnd < bytes.count, isKeyByte(bytes[keyEnd]) { keyEnd += 1 }
                let key = bytes[keyStart..<keyEnd]
                let closed = !quoted || (keyEnd < bytes.count && bytes[keyEnd] == byte)
                let isBearer =
                    key.count == bearer.count
                    && key.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }.elementsEqual(bearer)
                if closed, isSecretKey(key) || isBearer,
                    let range = value(after: quoted ? keyEnd + 1 : keyEnd, in: bytes, bareAllowed: !quoted)
                {
                    out.append(contentsOf: bytes[i..<range.lowerBound])
                    out.append(contentsOf: Secret.mask(utf8: bytes[range]))
                    i = range.upperBound
                    continue
                }
                if !quoted {
                    // A key that is not secret: copy it whole, so that its tail is not read as a key.
                    out.append(contentsOf: key)
                    i = keyEnd
                    continue
                }
            }
            out.append(byte)
            i += 1
        }
        return out
    }

    /// Masks every known secret, longest first, and, when `cut`, a start of
    /// one that `bytes` ends with.
    static func maskKnown(_ bytes: inout [UInt8], _ secrets: [String], cut: Bool, wipe: (inout [UInt8]) -> Void) {
        let known = Set(secrets).filter { $0.utf8.count >= shortestKnownSecret }.sorted {
            $0.utf8.count > $1.utf8.count
        }
        for secret in known {
            let needle = secret.utf8
            guard bytes.count >= needle.count,
                let at = bytes.indices.first(where: { bytes[$0...].starts(with: needle) })
            else { continue }
            var next: [UInt8] = []
            next.reserveCapacity(bytes.count)
            next.append(contentsOf: bytes[..<at])
            var i = at
            while i < bytes.count {
                if bytes[i...].starts(with: needle) {
                    next.append(contentsOf: Secret.mask(utf8: needle))
                    i += needle.count
                } else {
                    next.append(bytes[i])
                    i += 1
                }
            }
            wipe(&bytes)
            bytes = next
        }
        // Output cut at a size limit may end in the first part of a secret.
        for secret in known where cut {
            let needle = secret.utf8
            let longest = min(needle.count - 1, bytes.count)
            guard longest >= shortestKnownSecret else { continue }
            for length in stride(from: longest, through: shortestKnownSecret, by: -1)
            where bytes.suffix(length).elementsEqual(needle.prefix(length)) {
                let mask = Secret.mask(utf8: needle.prefix(length))
                let start = bytes.count - length
                // In place (the mask may be longer, so first overwrite, then add).
                for k in 0..<length { bytes[start + k] = k < mask.count ? mask[k] : 0 }
                bytes.removeLast(max(0, length - mask.count))
                if mask.count > length { bytes.append(contentsOf: mask[length...]) }
                break
            }
        }
    }

    /// The first `limit` bytes, cut back to a scalar boundary, with the
    /// truncation mark when anything was cut.
    static func truncated(_ bytes: [UInt8], limit: Int) -> [UInt8] {
        guard bytes.count > limit else { return bytes }
        var end = max(0, limit)
        while end > 0, bytes[end] & 0xC0 == 0x80 { end -= 1 }
        return Array(bytes[..<end]) + Array(truncationMark.utf8)
    }
}
