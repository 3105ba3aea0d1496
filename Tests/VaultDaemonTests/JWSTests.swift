import Foundation
import Glibc
import Testing
import Varlink
import VaultCore

@testable import VaultDaemon

/// Runs `openssl` with `arguments`; its exit status.
private func openssl(_ arguments: [String]) throws -> Int32 {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
    process.arguments = arguments
    process.standardOutput = FileHandle.nullDevice
    process.standardError = FileHandle.nullDevice
    try process.run()
    process.waitUntilExit()
    return process.terminationStatus
}

/// A key made by `openssl genpkey` in `directory` (mode 600): its path.
private func makeKey(_ directory: TemporaryDirectory, _ name: String, _ options: [String]) throws -> String {
    let path = directory.path + "/" + name
    #expect(try openssl(["genpkey", "-out", path] + options) == 0)
    chmod(path, 0o600)
    return path
}

/// The DER `ECDSA-Sig-Value` of a raw r || s signature: what `openssl dgst -verify` reads.
private func der(raw: [UInt8]) -> [UInt8] {
    func integer(_ bytes: ArraySlice<UInt8>) -> [UInt8] {
        var value = Array(bytes.drop { $0 == 0 })
        if value.isEmpty || value[0] & 0x80 != 0 { value.insert(0, at: 0) }
        return [0x02, UInt8(value.count)] + value
    }
    let body = integer(raw[0..<32]) + integer(raw[32..<64])
    return [0x30, UInt8(body.count)] + body
}

/// The JWS pieces vaultd signs with (issue 32, items 1 and 4): base64url,
/// the header and claims, ES256's DER-to-raw conversion, and signatures by
/// real keys that openssl verifies.
@Suite("JWT assertions", .timeLimit(.minutes(5)))
struct JWSTests {
    @Test(
        "Should write base64url without padding, '-' and '_' for '+' and '/'",
        arguments: [
            ([], ""), ([0x66], "Zg"), ([0x66, 0x6F], "Zm8"), ([0x66, 0x6F, 0x6F], "Zm9v"),
            ([0xFB, 0xFF, 0xBF], "-_-_"), ([0xFF, 0xFE], "__4"),
        ] as [([UInt8], String)])
    func base64url(bytes: [UInt8], expected: String) {
        #expect(JWS.base64url(bytes) == expected)
        #expect(Base64.decode(expected) == bytes)
    }

    @Test("Should sign a header with alg and typ, and the claims iss, sub, aud, iat, exp and jti")
    func claims() throws {
        let claims = JWTClaims(issuer: "client", subject: "alice", audience: "https://as.example", now: 1_700_000_000)
        let input = String(decoding: JWS.signingInput(.es256, claims), as: UTF8.self)
        let parts = input.split(separator: ".", omittingEmptySubsequences: false)
        #expect(parts.count == 2)
        let header = try JSON.parse(try #require(Base64.decode(String(parts[0]))))
        #expect(header == ["alg": "ES256", "typ": "JWT"])
        let payload = try JSON.parse(try #require(Base64.decode(String(parts[1]))))
        #expect(payload["iss"]?.stringValue == "client")
        #expect(payload["sub"]?.stringValue == "alice")
        #expect(payload["aud"]?.stringValue == "https://as.example")
        #expect(payload["iat"]?.integerValue == 1_700_000_000)
        let exp = try #require(payload["exp"]?.integerValue)
        #expect(exp > 1_700_000_000 && exp <= 1_700_000_000 + 180, "expires within 3 minutes")
        #expect(payload["jti"]?.stringValue == claims.id)
        #expect(payload.objectValue?.count == 6)
    }

    @Test("Should give every assertion a jti of its own")
    func uniqueIDs() {
        let ids = (0..<1000).map { _ in JWTClaims(issuer: "c", subject: "u", audience: "a", now: 0).id }
        #expect(Set(ids).count == 1000)
        #expect(ids.allSatisfy { $0.count == 22 })
    }

    @Test(
        "Should turn a DER ECDSA signature into r || s of 32 bytes each",
        arguments: [
            // Short integers are left-padded; a leading 0 that keeps one positive is dropped.
            (
                [0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x02],
                [UInt8](repeating: 0, count: 31) + [1] + Array(repeating: 0, count: 31) + [2]
            ),
            (
                [0x30, 0x45, 0x02, 0x21, 0x00] + Array(repeating: 0x80, count: 32) + [0x02, 0x20]
                    + Array(repeating: 0x7F, count: 32),
                Array(repeating: 0x80, count: 32) + Array(repeating: 0x7F, count: 32)
            ),
        ] as [([UInt8], [UInt8])])
    func derToRaw(der: [UInt8], raw: [UInt8]) {
        #expect(JWS.rawECDSASignature(der: der) == raw)
    }

    @Test(
        "Should refuse what is not a DER sequence of two integers that fit",
        arguments: [
            [], [0x30], [0x31, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x02],  // not a sequence
            [0x30, 0x06, 0x02, 0x01, 0x01, 0x02, 0x01, 0x02, 0x00],  // a byte after it
            [0x30, 0x07, 0x02, 0x01, 0x01, 0x02, 0x01, 0x02],  // a length past the end
            [0x30, 0x06, 0x02, 0x01, 0x01, 0x04, 0x01, 0x02],  // s not an integer
            [0x30, 0x06, 0x02, 0x01, 0x81, 0x02, 0x01, 0x02],  // r negative
            // r of 33 bytes; s empty.
            [0x30, 0x25, 0x02, 0x21, 0x01] + Array(repeating: 0x01, count: 32) + [0x02, 0x00],
        ] as [[UInt8]])
    func derRefused(der: [UInt8]) {
        #expect(JWS.rawECDSASignature(der: der) == nil)
    }

    @Test(
        "Should sign with an RSA key as RS256 and an EC P-256 key as ES256, verified by openssl",
        arguments: [
            ("rsa.pem", ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"], JWTAlgorithm.rs256),
            ("ec.pem", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"], .es256),
        ])
    func sign(name: String, options: [String], algorithm: JWTAlgorithm) throws {
        let directory = try TemporaryDirectory("jws")
        let key = try makeKey(directory, name, options)
        let claims = JWTClaims(issuer: "client", subject: "alice", audience: "https://as.example", now: 1_700_000_000)
        let jws = try JWTSigner.sign(claims, keyFile: key)
        let parts = jws.split(separator: ".", omittingEmptySubsequences: false)
        try #require(parts.count == 3)
        let header = try JSON.parse(try #require(Base64.decode(String(parts[0]))))
        #expect(header["alg"]?.stringValue == algorithm.rawValue)
        #expect(JWT.claims(of: jws)?["sub"]?.stringValue == "alice")
        var signature = try #require(Base64.decode(String(parts[2])))
        if algorithm == .es256 {
            #expect(signature.count == 64, "ES256 is r || s, not DER")
            signature = der(raw: signature)
        } else {
            #expect(signature.count == 256)
        }
        let input = directory.path + "/input"
        let signed = directory.path + "/signature"
        let publicKey = directory.path + "/public.pem"
        try Data((parts[0] + "." + parts[1]).utf8).write(to: URL(fileURLWithPath: input))
        try Data(signature).write(to: URL(fileURLWithPath: signed))
        #expect(try openssl(["pkey", "-in", key, "-pubout", "-out", publicKey]) == 0)
        #expect(try openssl(["dgst", "-sha256", "-verify", publicKey, "-signature", signed, input]) == 0)
        // A changed signing input does not verify: the check can fail.
        try Data((parts[0] + ".x" + parts[1]).utf8).write(to: URL(fileURLWithPath: input))
        #expect(try openssl(["dgst", "-sha256", "-verify", publicKey, "-signature", signed, input]) != 0)
    }

    @Test(
        "Should refuse a key of another kind, a small RSA key, and a key on another curve",
        arguments: [
            (["-algorithm", "ED25519"], "neither RSA (RS256) nor EC on P-256"),
            (["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"], "RSA of 1024 bits"),
            (["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"], "neither RSA (RS256) nor EC on P-256"),
        ])
    func unsupportedKey(options: [String], reason: String) throws {
        let directory = try TemporaryDirectory("jws")
        let key = try makeKey(directory, "key.pem", options)
        let claims = JWTClaims(issuer: "c", subject: "u", audience: "a", now: 0)
        let error = try #require(throws: JWTSigner.Failure.self) { try JWTSigner.sign(claims, keyFile: key) }
        #expect(error.reason.contains(reason), "\(error.reason)")
    }

    @Test("Should refuse a key file others may read, one that is no key, and a missing one, saying no key bytes")
    func keyFile() throws {
        let directory = try TemporaryDirectory("jws")
        let key = try makeKey(directory, "key.pem", ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"])
        let pem = try String(contentsOfFile: key, encoding: .utf8)
        let claims = JWTClaims(issuer: "c", subject: "u", audience: "a", now: 0)
        chmod(key, 0o644)
        var error = try #require(throws: JWTSigner.Failure.self) { try JWTSigner.sign(claims, keyFile: key) }
        #expect(error.reason.contains("is readable by others (mode 644)"), "\(error.reason)")
        chmod(key, 0o666)
        error = try #require(throws: JWTSigner.Failure.self) { try JWTSigner.sign(claims, keyFile: key) }
        #expect(error.reason.contains("is writable by others"), "\(error.reason)")
        let garbage = directory.path + "/garbage.pem"
        try "-----BEGIN PRIVATE KEY-----\nnot a key\n-----END PRIVATE KEY-----\n".write(
            toFile: garbage, atomically: true, encoding: .utf8)
        chmod(garbage, 0o600)
        error = try #require(throws: JWTSigner.Failure.self) { try JWTSigner.sign(claims, keyFile: garbage) }
        #expect(error.reason.contains("holds no private key"), "\(error.reason)")
        error = try #require(throws: JWTSigner.Failure.self) {
            try JWTSigner.sign(claims, keyFile: directory.path + "/absent.pem")
        }
        #expect(error.reason.contains("does not exist"), "\(error.reason)")
        let body = pem.split(separator: "\n").dropFirst().first.map(String.init) ?? "?"
        #expect(!error.reason.contains(body))
    }

    @Test("Should take a relative key file in $CREDENTIALS_DIRECTORY, and refuse one when it is not set")
    func relativePath() throws {
        let error = try #require(throws: JWTSigner.Failure.self) { try JWTSigner.path("key.pem", credentials: nil) }
        #expect(error.reason.contains("$CREDENTIALS_DIRECTORY"))
        let credentials = "/run/credentials/vaultd.service"
        #expect(try JWTSigner.path("key.pem", credentials: credentials) == credentials + "/key.pem")
        #expect(try JWTSigner.path("/etc/vaultd/key.pem", credentials: credentials) == "/etc/vaultd/key.pem")
        #expect(try JWTSigner.path("/etc/vaultd/key.pem", credentials: nil) == "/etc/vaultd/key.pem")
    }
}
