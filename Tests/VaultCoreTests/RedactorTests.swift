import Testing
import VaultCore

@Suite("Redactor", .timeLimit(.minutes(5)))
struct RedactorTests {
    private let token = "SECRETMARKER_0123456789abcdef"

    @Test("Should mask the values of secret-looking keys in JSON, key=value and key: value forms")
    func keyForms() {
        let text =
            #"{"access_token": "AAAAbbbbCCCCdddd1", "refreshToken":"RRRRssssTTTTuuuu2"} token=TTTTkkkkLLLLmmmm3 "#
            + "apiKey: KKKKeeeeYYYYzzzz4 Client_Secret = 'SSSSeeeeCCCCrrrr5' X-API-KEY: XXXXyyyyZZZZwwww6 password=hunter2"
        let out = Redactor.redact(text)
        for secret in [
            "AAAAbbbbCCCCdddd1", "RRRRssssTTTTuuuu2", "TTTTkkkkLLLLmmmm3", "KKKKeeeeYYYYzzzz4", "SSSSeeeeCCCCrrrr5",
            "XXXXyyyyZZZZwwww6", "hunter2",
        ] {
            #expect(!out.contains(secret), "\(secret) in \(out)")
        }
        #expect(out.contains(#""access_token": "AA********d1""#), "\(out)")
        #expect(out.contains("password=********"), "\(out)")
    }

    @Test("Should leave text without secrets as it is")
    func plainText() {
        let text = #"{"error": "ERR_UID_NOT_FOUND", "message": "no user alice", "token_type": "Bearer"} exit=1"#
        #expect(Redactor.redact(text) == text)
    }

    @Test("Should mask a JSON value with escaped quotes whole")
    func escapedQuotes() {
        let out = Redactor.redact(#"{"secret": "ab\"cd\\\"ef-ghijklmnop", "next": 1}"#)
        #expect(!out.contains("cd"), "\(out)")
        #expect(!out.contains("ghijk"), "\(out)")
        #expect(out.hasSuffix(#"", "next": 1}"#), "\(out)")
    }

    @Test("Should mask several secrets, known ones anywhere and long words after a bare key")
    func multipleSecrets() {
        let text = "login failed: bad token \(token), retried with \(token) and Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig"
        let out = Redactor.redact(text, knownSecrets: [token])
        #expect(!out.contains("MARKER"), "\(out)")
        #expect(!out.contains("eyJhbGciOiJIUzI1NiJ9"), "\(out)")
        #expect(out.hasPrefix("login failed: bad token SE********ef"), "\(out)")
    }

    @Test("Should mask before truncating, so that a secret at the cut is not shown")
    func truncationBoundary() {
        for offset in 2030...2050 {
            let padding = String(repeating: "x", count: offset)
            let keyed = Redactor.redact(padding + #" "access_token":"\#(token)""#, limit: 2048)
            #expect(!keyed.contains("MARKER") && !keyed.contains("0123"), "offset \(offset): \(keyed.suffix(40))")
            #expect(keyed.utf8.count <= 2048 + Redactor.truncationMark.utf8.count)
            let known = Redactor.redact(padding + " " + token, knownSecrets: [token], limit: 2048)
            let captured = Array((padding + " " + token).utf8.prefix(2048))
            let cut = Redactor.redact(utf8: captured, cut: true, knownSecrets: [token], limit: 2040)
            #expect(!cut.contains("MARKER") && !cut.contains("SECR"), "offset \(offset): \(cut.suffix(40))")
            #expect(!known.contains("MARKER") && !known.contains("0123"), "offset \(offset): \(known.suffix(40))")
        }
    }

    @Test("Should mask a known secret that the text ends in the middle of (output cut at its size limit)")
    func partialSecretAtEnd() {
        let out = Redactor.redact(utf8: Array(("stderr: " + token.prefix(15)).utf8), cut: true, knownSecrets: [token])
        #expect(out == "stderr: S********1", "\(out)")
    }

    @Test("Should cut unicode text on a scalar boundary and mask unicode secrets by scalars")
    func unicode() {
        let out = Redactor.redact("é" + String(repeating: "é", count: 10), limit: 4)
        #expect(out == "éé" + Redactor.truncationMark)
        let secret = "😀ééééééééééééééé😀"
        #expect(Redactor.redact("password=\(secret) ok") == "password=😀é********é😀 ok")
        #expect(Redactor.redact("note \(secret)", knownSecrets: [secret]) == "note 😀é********é😀")
    }

    @Test("Should tell secret-looking keys by their name, in any case and with _ or -")
    func secretKeys() {
        for key in [
            "access_token", "ACCESS_TOKEN", "accessToken", "refresh-token", "token", "authToken", "auth_token",
            "secret",
            "client_secret", "apiKey", "api_key", "X-Api-Key", "password", "PASSWORD", "passwd",
        ] {
            #expect(Redactor.isSecretKey(key.utf8), "\(key)")
        }
        for key in ["token_type", "expires_in", "message", "error", "user", "tokens"] {
            #expect(!Redactor.isSecretKey(key.utf8), "\(key)")
        }
    }

    @Test("Should hand every buffer of its own that held a secret to the wipe function")
    func wipesBuffers() {
        nonisolated(unsafe) var wiped: [[UInt8]] = []
        _ = Redactor.redact(utf8: Array("a \(token) b".utf8), knownSecrets: [token]) { buffer in
            wiped.append(buffer)
            buffer = []
        }
        #expect(wiped.contains { String(decoding: $0, as: UTF8.self).contains(token) })
    }
}
