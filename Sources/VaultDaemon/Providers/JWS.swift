import Varlink
import VaultCore

/// The algorithms vaultd signs JWTs with (RFC 7518 section 3.1).
enum JWTAlgorithm: String, Sendable {
    /// RSASSA-PKCS1-v1_5 with SHA-256, of an RSA key.
    case rs256 = "RS256"
    /// ECDSA on P-256 with SHA-256, of an EC key; the signature is r || s, 32 bytes each.
    case es256 = "ES256"
}

/// The claims of a JWT assertion vaultd signs (RFC 7523 section 3): the
/// JWT bearer grant's, whose subject is the session's user, and a
/// `private_key_jwt` client assertion's, whose issuer and subject are the
/// client id.
struct JWTClaims: Sendable, Equatable {
    /// `iss`.
    var issuer: String
    /// `sub`.
    var subject: String
    /// `aud`.
    var audience: String
    /// `iat`, Unix seconds.
    var issuedAt: Int64
    /// `exp`, Unix seconds: `lifetime` after `issuedAt`.
    var expiresAt: Int64
    /// `jti`: a new random id for every assertion, so a server can refuse a replay.
    var id: String

    /// How long an assertion is valid, in seconds: under the 3 minutes
    /// Salesforce allows, and short enough that a stolen one is soon useless.
    static let lifetime: Int64 = 150

    /// Claims issued at `now`, expiring `lifetime` later, with a fresh `jti`.
    init(issuer: String, subject: String, audience: String, now: Int64, id: String = JWS.newID()) {
        self.issuer = issuer
        self.subject = subject
        self.audience = audience
        self.issuedAt = now
        self.expiresAt = now + JWTClaims.lifetime
        self.id = id
    }

    /// The claims set as JSON.
    var json: JSON {
        .object([
            "iss": .string(issuer), "sub": .string(subject), "aud": .string(audience), "iat": .int(issuedAt),
            "exp": .int(expiresAt), "jti": .string(id),
        ])
    }
}

/// The pieces of a JWS in compact serialization (RFC 7515 section 7.1) that
/// need no key: base64url, the signing input, ES256's signature form
/// (`JWT` of VaultCore reads a token's claims back).
enum JWS {
    /// `bytes` in base64url without padding (RFC 7515 section 2).
    static func base64url(_ bytes: [UInt8]) -> String {
        var encoded = Base64.encodedBytes(bytes)
        while encoded.last == UInt8(ascii: "=") { encoded.removeLast() }
        for index in encoded.indices {
            if encoded[index] == UInt8(ascii: "+") { encoded[index] = UInt8(ascii: "-") }
            if encoded[index] == UInt8(ascii: "/") { encoded[index] = UInt8(ascii: "_") }
        }
        return String(decoding: encoded, as: UTF8.self)
    }

    /// The JOSE header and the claims, each base64url, joined by '.': what is signed.
    static func signingInput(_ algorithm: JWTAlgorithm, _ claims: JWTClaims) -> [UInt8] {
        let header = JSON.object(["alg": .string(algorithm.rawValue), "typ": "JWT"])
        return Array((base64url(header.serialized()) + "." + base64url(claims.json.serialized())).utf8)
    }

    /// The compact JWS: the signing input, '.', the signature in base64url.
    static func compact(signingInput: [UInt8], signature: [UInt8]) -> String {
        String(decoding: signingInput, as: UTF8.self) + "." + base64url(signature)
    }

    /// A fresh `jti`: 16 random bytes in base64url.
    static func newID() -> String {
        var generator = SystemRandomNumberGenerator()
        return base64url((0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }

    /// An ECDSA signature as JWS carries it (RFC 7518 section 3.4): r and s
    /// each as `size` big-endian bytes, one after the other, from the DER
    /// `ECDSA-Sig-Value` (`SEQUENCE { r INTEGER, s INTEGER }`) libcrypto
    /// gives. Nil when `der` is not such a sequence of two non-negative
    /// integers of at most `size` bytes, with nothing after it.
    static func rawECDSASignature(der: [UInt8], size: Int = 32) -> [UInt8]? {
        var index = 0
        func length() -> Int? {
            guard index < der.count else { return nil }
            let first = Int(der[index])
            index += 1
            if first < 0x80 { return first }
            let count = first & 0x7F
            guard (1...2).contains(count), index + count <= der.count else { return nil }
            var value = 0
            for _ in 0..<count {
                value = value << 8 | Int(der[index])
                index += 1
            }
            return value
        }
        func integer() -> [UInt8]? {
            guard index < der.count, der[index] == 0x02 else { return nil }
            index += 1
            guard let count = length(), count > 0, index + count <= der.count else { return nil }
            var bytes = Array(der[index..<index + count])
            index += count
            guard bytes[0] & 0x80 == 0 else { return nil }
            while bytes.count > 1, bytes[0] == 0 { bytes.removeFirst() }
            guard bytes.count <= size else { return nil }
            return [UInt8](repeating: 0, count: size - bytes.count) + bytes
        }
        guard der.first == 0x30 else { return nil }
        index = 1
        guard let total = length(), index + total == der.count, let r = integer(), let s = integer(),
            index == der.count
        else { return nil }
        return r + s
    }
}
