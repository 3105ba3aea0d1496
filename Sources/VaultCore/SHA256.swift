/// SHA-256 (FIPS 180-4), in pure Swift: `ReportRejected` names a token by its
/// hash, so that the token itself never travels to say "this one was
/// rejected". Incremental: `update` as often as needed, then `finalize`.
/// Tested against the NIST test vectors (Tests/VaultCoreTests/SHA256Tests.swift).
public struct SHA256: Sendable {
    /// The length of a digest, in bytes.
    public static let digestLength = 32

    private static let k: [UInt32] = [
        0x428a_2f98, 0x7137_4491, 0xb5c0_fbcf, 0xe9b5_dba5, 0x3956_c25b, 0x59f1_11f1, 0x923f_82a4, 0xab1c_5ed5,
        0xd807_aa98, 0x1283_5b01, 0x2431_85be, 0x550c_7dc3, 0x72be_5d74, 0x80de_b1fe, 0x9bdc_06a7, 0xc19b_f174,
        0xe49b_69c1, 0xefbe_4786, 0x0fc1_9dc6, 0x240c_a1cc, 0x2de9_2c6f, 0x4a74_84aa, 0x5cb0_a9dc, 0x76f9_88da,
        0x983e_5152, 0xa831_c66d, 0xb003_27c8, 0xbf59_7fc7, 0xc6e0_0bf3, 0xd5a7_9147, 0x06ca_6351, 0x1429_2967,
        0x27b7_0a85, 0x2e1b_2138, 0x4d2c_6dfc, 0x5338_0d13, 0x650a_7354, 0x766a_0abb, 0x81c2_c92e, 0x9272_2c85,
        0xa2bf_e8a1, 0xa81a_664b, 0xc24b_8b70, 0xc76c_51a3, 0xd192_e819, 0xd699_0624, 0xf40e_3585, 0x106a_a070,
        0x19a4_c116, 0x1e37_6c08, 0x2748_774c, 0x34b0_bcb5, 0x391c_0cb3, 0x4ed8_aa4a, 0x5b9c_ca4f, 0x682e_6ff3,
        0x748f_82ee, 0x78a5_636f, 0x84c8_7814, 0x8cc7_0208, 0x90be_fffa, 0xa450_6ceb, 0xbef9_a3f7, 0xc671_78f2,
    ]

    private var h: [UInt32] = [
        0x6a09_e667, 0xbb67_ae85, 0x3c6e_f372, 0xa54f_f53a, 0x510e_527f, 0x9b05_688c, 0x1f83_d9ab, 0x5be0_cd19,
    ]
    /// Input not yet hashed: less than one 64-byte block.
    private var pending: [UInt8] = []
    /// Bytes taken so far.
    private var length: UInt64 = 0
    /// The message schedule, kept to be wiped with the rest (it holds input bits).
    private var w = [UInt32](repeating: 0, count: 64)

    /// A hash of nothing yet.
    public init() { pending.reserveCapacity(64) }

    /// Takes more input.
    public mutating func update<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        for byte in bytes {
            pending.append(byte)
            length &+= 1
            if pending.count == 64 {
                compress(pending)
                wipe(&pending)
            }
        }
    }

    /// The digest of everything taken; the hash's state is wiped afterwards.
    public mutating func finalize() -> [UInt8] {
        let bits = length &* 8
        var tail = pending
        tail.append(0x80)
        while tail.count % 64 != 56 { tail.append(0) }
        for shift in stride(from: 56, through: 0, by: -8) {
            tail.append(UInt8(truncatingIfNeeded: bits >> UInt64(shift)))
        }
        for start in stride(from: 0, to: tail.count, by: 64) { compress(tail[start..<start + 64]) }
        wipe(&tail)
        var digest: [UInt8] = []
        digest.reserveCapacity(Self.digestLength)
        for word in h {
            digest += [
                UInt8(truncatingIfNeeded: word >> 24), UInt8(truncatingIfNeeded: word >> 16),
                UInt8(truncatingIfNeeded: word >> 8), UInt8(truncatingIfNeeded: word),
            ]
        }
        wipe(&pending)
        for i in w.indices { w[i] = 0 }
        for i in h.indices { h[i] = 0 }
        return digest
    }

    /// The digest of `bytes`.
    public static func hash<Bytes: Sequence>(_ bytes: Bytes) -> [UInt8] where Bytes.Element == UInt8 {
        var hasher = SHA256()
        hasher.update(bytes)
        return hasher.finalize()
    }

    /// The lowercase hex digest of a secret's bytes (how `ReportRejected` names a token).
    public static func hexDigest(of secret: Secret) -> String {
        var hasher = SHA256()
        secret.withUTF8 { hasher.update($0) }
        return hex(hasher.finalize())
    }

    /// The lowercase hex digest of `text`'s UTF-8 bytes.
    public static func hexDigest(of text: String) -> String { hex(hash(text.utf8)) }

    /// `bytes` as lowercase hex.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0f)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of a lowercase hex digest; nil unless `text` is exactly 64
    /// lowercase hex digits.
    public static func digest(hex text: String) -> [UInt8]? {
        let chars = Array(text.utf8)
        guard chars.count == digestLength * 2 else { return nil }
        func value(_ c: UInt8) -> UInt8? {
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): return c - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): return c - UInt8(ascii: "a") + 10
            default: return nil
            }
        }
        var out: [UInt8] = []
        out.reserveCapacity(digestLength)
        for i in stride(from: 0, to: chars.count, by: 2) {
            guard let high = value(chars[i]), let low = value(chars[i + 1]) else { return nil }
            out.append(high << 4 | low)
        }
        return out
    }

    /// True when `a` and `b` are equal, in a time that depends on their
    /// lengths only (not on where they first differ): a caller probing hashes
    /// learns nothing from how long the answer took.
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        var difference: UInt8 = 0
        for i in a.indices { difference |= a[i] ^ b[i] }
        return difference == 0
    }

    private func wipe(_ bytes: inout [UInt8]) {
        for i in bytes.indices { bytes[i] = 0 }
        bytes.removeAll(keepingCapacity: true)
    }

    @inline(__always)
    private static func rotr(_ x: UInt32, _ n: UInt32) -> UInt32 { (x >> n) | (x << (32 - n)) }

    /// One 64-byte block (FIPS 180-4 6.2.2).
    private mutating func compress<Block: Collection>(_ block: Block) where Block.Element == UInt8, Block.Index == Int {
        let base = block.startIndex
        for t in 0..<16 {
            let i = base + t * 4
            w[t] =
                UInt32(block[i]) << 24 | UInt32(block[i + 1]) << 16 | UInt32(block[i + 2]) << 8 | UInt32(block[i + 3])
        }
        for t in 16..<64 {
            let s0 = Self.rotr(w[t - 15], 7) ^ Self.rotr(w[t - 15], 18) ^ (w[t - 15] >> 3)
            let s1 = Self.rotr(w[t - 2], 17) ^ Self.rotr(w[t - 2], 19) ^ (w[t - 2] >> 10)
            w[t] = w[t - 16] &+ s0 &+ w[t - 7] &+ s1
        }
        var (a, b, c, d, e, f, g, hh) = (h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7])
        for t in 0..<64 {
            let s1 = Self.rotr(e, 6) ^ Self.rotr(e, 11) ^ Self.rotr(e, 25)
            let ch = (e & f) ^ (~e & g)
            let t1 = hh &+ s1 &+ ch &+ Self.k[t] &+ w[t]
            let s0 = Self.rotr(a, 2) ^ Self.rotr(a, 13) ^ Self.rotr(a, 22)
            let maj = (a & b) ^ (a & c) ^ (b & c)
            let t2 = s0 &+ maj
            hh = g
            g = f
            f = e
            e = d &+ t1
            d = c
            c = b
            b = a
            a = t1 &+ t2
        }
        h[0] &+= a
        h[1] &+= b
        h[2] &+= c
        h[3] &+= d
        h[4] &+= e
        h[5] &+= f
        h[6] &+= g
        h[7] &+= hh
    }
}
