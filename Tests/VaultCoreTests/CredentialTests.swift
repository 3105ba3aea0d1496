import Foundation
import Testing
import Varlink
import VaultCore

/// Encodes bytes as unpadded base64url (RFC 4648 section 5), as JWTs carry them.
private func base64URL(_ text: String) -> String {
    Data(text.utf8).base64EncodedString()
        .replacingOccurrences(of: "+", with: "-")
        .replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

/// A JWT with the given payload JSON and a dummy signature.
private func jwt(payload: String) -> String {
    base64URL(#"{"alg":"HS256","typ":"JWT"}"#) + "." + base64URL(payload) + ".c2lnbmF0dXJl"
}

private func credential(_ json: JSON) throws(VaultError) -> LoginCredential {
    try LoginCredential(tokenResponse: json)
}

@Suite("LoginCredential from a raw token", .timeLimit(.minutes(5)))
struct RawTokenCredentialTests {
    @Test("Should take the text as the access token, surrounding whitespace removed")
    func trimmed() throws {
        let c = try LoginCredential(text: "  \t tok_123.abc-XYZ\n\r\n")
        #expect(c.tokens.accessToken.revealed == "tok_123.abc-XYZ")
        #expect(c.tokens.refreshToken == nil)
        #expect(c.tokens.tokenType == nil)
        #expect(c.expiresIn == nil)
    }

    @Test("Should accept a bare token as given")
    func bare() throws {
        #expect(try LoginCredential(token: "abc").tokens == TokenSet(accessToken: Secret("abc")))
    }

    @Test("Should refuse an empty or whitespace-only token as invalidCredential", arguments: ["", " ", "\n\t \r\n"])
    func empty(text: String) throws {
        let error = try #require(throws: VaultError.self) { try LoginCredential(text: text) }
        #expect(error.code == .invalidCredential)
        #expect(error.message.hasPrefix("token is empty"))
    }

    @Test("Should refuse a token with inner whitespace, naming it only masked")
    func innerSpace() throws {
        let raw = "abcdefghij klmnopqrstuvwxyz"
        let error = try #require(throws: VaultError.self) { try LoginCredential(text: raw) }
        #expect(error.code == .invalidCredential)
        #expect(error.message.contains("ab********yz"))
        #expect(!error.message.contains(raw))
        #expect(!error.description.contains(raw))
    }

    @Test("Should refuse a token with a control character", arguments: ["abc\u{0}def", "abc\u{7F}def", "a\u{1B}b"])
    func controlCharacter(token: String) throws {
        let error = try #require(throws: VaultError.self) { try LoginCredential(token: token) }
        #expect(error.code == .invalidCredential)
    }

    @Test("Should accept a token of 16 KiB and refuse one byte more as invalidParameter")
    func length() throws {
        let limit = LoginCredential.maximumTokenLength
        #expect(limit == 16384)
        #expect(
            try LoginCredential(token: String(repeating: "a", count: limit)).tokens.accessToken.revealed.count == limit)
        let error = try #require(throws: VaultError.self) {
            try LoginCredential(token: String(repeating: "a", count: limit + 1))
        }
        #expect(error.code == .invalidParameter)
    }

    @Test("Should read a text starting with '{' as a token response")
    func textAsJSON() throws {
        let c = try LoginCredential(text: "\n {\"access_token\":\"at\",\"expires_in\":60}\n")
        #expect(c.tokens.accessToken.revealed == "at")
        #expect(c.expiresIn == 60)
    }

    @Test("Should refuse a text that looks like JSON but is not, as invalidParameter")
    func textBadJSON() throws {
        let error = try #require(throws: VaultError.self) { try LoginCredential(text: #"{"access_token":"#) }
        #expect(error.code == .invalidParameter)
        #expect(error.message.contains("invalid JSON at byte"))
    }
}

@Suite("LoginCredential from an OAuth 2.0 token response", .timeLimit(.minutes(5)))
struct TokenResponseCredentialTests {
    @Test("Should read every member of a token response")
    func fullResponse() throws {
        let c = try credential([
            "access_token": "00Dxx!AQ4", "refresh_token": "5Aep861", "expires_in": 7200, "token_type": "Bearer",
            "scope": "api refresh_token", "instance_url": "https://example.my.salesforce.com", "client_id": "3MVG9",
            "issued_at": 1_700_000_000, "id": "https://login.salesforce.com/id/00D/005", "signature": "ignored",
        ])
        #expect(c.tokens.accessToken.revealed == "00Dxx!AQ4")
        #expect(c.tokens.refreshToken?.revealed == "5Aep861")
        #expect(c.expiresIn == 7200)
        #expect(c.tokens.tokenType == "Bearer")
        #expect(c.tokens.scope == "api refresh_token")
        #expect(c.tokens.instanceURL == "https://example.my.salesforce.com")
        #expect(c.tokens.clientID == "3MVG9")
        #expect(c.tokens.issuedAt == UnixTime(seconds: 1_700_000_000))
    }

    @Test("Should read only the access token of a minimal response")
    func minimal() throws {
        let c = try credential(["access_token": "at"])
        #expect(c.tokens == TokenSet(accessToken: Secret("at")))
        #expect(c.expiresIn == nil)
    }

    @Test("Should treat null optional members as absent")
    func nullMembers() throws {
        let c = try credential([
            "access_token": "at", "refresh_token": nil, "expires_in": nil, "issued_at": nil, "scope": nil,
        ])
        #expect(c.tokens == TokenSet(accessToken: Secret("at")))
        #expect(c.expiresIn == nil)
    }

    @Test("Should read Salesforce's issued_at, a string of milliseconds, as seconds")
    func salesforceIssuedAt() throws {
        let c = try credential(["access_token": "at", "issued_at": "1700000000123"])
        #expect(c.tokens.issuedAt == UnixTime(seconds: 1_700_000_000))
        let n = try credential(["access_token": "at", "issued_at": .int(1_700_000_000_999)])
        #expect(n.tokens.issuedAt == UnixTime(seconds: 1_700_000_000))
    }

    @Test("Should accept expires_in as a string of digits")
    func expiresInString() throws {
        #expect(try credential(["access_token": "at", "expires_in": "3600"]).expiresIn == 3600)
    }

    @Test(
        "Should refuse a negative or non-numeric expires_in",
        arguments: [JSON.int(-1), "soon", "1.5", .number(1.5), true])
    func badExpiresIn(value: JSON) throws {
        let error = try #require(throws: VaultError.self) {
            try credential(["access_token": "at", "expires_in": value])
        }
        #expect(error.code == .invalidParameter)
    }

    @Test("Should refuse an error response as invalidCredential, naming the error")
    func errorResponse() throws {
        let error = try #require(throws: VaultError.self) {
            try credential(["error": "invalid_grant", "error_description": "expired authorization code"])
        }
        #expect(error.code == .invalidCredential)
        #expect(error.message.contains("'invalid_grant'"))
    }

    @Test("Should refuse a response without access_token as invalidCredential")
    func missingAccessToken() throws {
        let error = try #require(throws: VaultError.self) { try credential(["token_type": "Bearer"]) }
        #expect(error.code == .invalidCredential)
    }

    @Test("Should refuse an access_token that is not a string as invalidParameter")
    func accessTokenNumber() throws {
        let error = try #require(throws: VaultError.self) { try credential(["access_token": 12345]) }
        #expect(error.code == .invalidParameter)
        #expect(error.message == "access_token must be a string, not number")
    }

    @Test("Should refuse an empty access_token as invalidCredential")
    func emptyAccessToken() throws {
        let error = try #require(throws: VaultError.self) { try credential(["access_token": ""]) }
        #expect(error.code == .invalidCredential)
        #expect(error.message.hasPrefix("access_token is empty"))
    }

    @Test("Should refuse a refresh_token with whitespace, masked in the message")
    func badRefreshToken() throws {
        let raw = "refresh token with spaces inside"
        let error = try #require(throws: VaultError.self) {
            try credential(["access_token": "at", "refresh_token": .string(raw)])
        }
        #expect(error.code == .invalidCredential)
        #expect(error.message.hasPrefix("refresh_token "))
        #expect(!error.message.contains(raw))
    }

    @Test("Should refuse an optional member of the wrong type, naming it")
    func wrongOptionalType() throws {
        let error = try #require(throws: VaultError.self) { try credential(["access_token": "at", "scope": ["api"]]) }
        #expect(error.code == .invalidParameter)
        #expect(error.message == "scope must be a string, not array")
    }

    @Test("Should refuse a response that is not an object as invalidParameter")
    func notAnObject() throws {
        let error = try #require(throws: VaultError.self) { try credential(["access_token"]) }
        #expect(error.code == .invalidParameter)
        #expect(error.message.contains("not array"))
    }
}

@Suite("LoginCredential expiry", .timeLimit(.minutes(5)))
struct CredentialExpiryTests {
    private let now = UnixTime(seconds: 1_700_000_000)

    @Test("Should prefer an explicit expiry over expires_in and the JWT's exp")
    func explicitWins() throws {
        let c = try credential(["access_token": .string(jwt(payload: #"{"exp":1900000000}"#)), "expires_in": 60])
        #expect(c.expiry(explicit: UnixTime(seconds: 1_750_000_000), now: now) == UnixTime(seconds: 1_750_000_000))
    }

    @Test("Should prefer expires_in over the JWT's exp, counted from now")
    func expiresInWins() throws {
        let c = try credential(["access_token": .string(jwt(payload: #"{"exp":1900000000}"#)), "expires_in": 60])
        #expect(c.expiry(explicit: nil, now: now) == UnixTime(seconds: 1_700_000_060))
    }

    @Test("Should count expires_in from issued_at when the response has it")
    func expiresInFromIssuedAt() throws {
        let c = try credential(["access_token": "at", "expires_in": 7200, "issued_at": "1600000000000"])
        #expect(c.expiry(explicit: nil, now: now) == UnixTime(seconds: 1_600_007_200))
    }

    @Test("Should fall back to the JWT's exp claim")
    func jwtExp() throws {
        let token = jwt(payload: #"{"exp":1900000000}"#)
        #expect(try LoginCredential(token: token).expiry(explicit: nil, now: now) == UnixTime(seconds: 1_900_000_000))
    }

    @Test("Should have no expiry for a token that is not a JWT")
    func noExpiry() throws {
        #expect(try LoginCredential(token: "opaque_token_123").expiry(explicit: nil, now: now) == nil)
    }
}

@Suite("JWT", .timeLimit(.minutes(5)))
struct JWTTests {
    @Test("Should read exp from a base64url payload without padding")
    func exp() {
        let payload = #"{"sub":"alice>>>???","exp":1900000000,"iat":1}"#
        let encoded = base64URL(payload)
        #expect(encoded.contains("-") || encoded.contains("_"), "payload should exercise the url alphabet")
        #expect(encoded.utf8.count % 4 != 0, "payload should exercise missing padding")
        #expect(JWT.expiry(of: jwt(payload: payload)) == UnixTime(seconds: 1_900_000_000))
    }

    @Test("Should read a fractional exp as whole seconds")
    func fractionalExp() {
        #expect(JWT.expiry(of: jwt(payload: #"{"exp":1900000000.75}"#)) == UnixTime(seconds: 1_900_000_000))
    }

    @Test(
        "Should find no expiry in a token that is not a JWT with exp",
        arguments: [
            "opaque", "a.b", "a.b.c.d", "x.!!!.y", "x." + "bm90IGpzb24" + ".y",  // "not json"
            "x." + "eyJzdWIiOiJhIn0" + ".y",  // {"sub":"a"}
            "x." + "eyJleHAiOiJzb29uIn0" + ".y",  // {"exp":"soon"}
        ])
    func notAJWT(token: String) {
        #expect(JWT.expiry(of: token) == nil)
    }

    @Test("Should decode base64url and tolerate padding")
    func decode() {
        #expect(Base64.decode("aGVsbG8") == Array("hello".utf8))
        #expect(Base64.decode("aGVsbG8=") == Array("hello".utf8))
        #expect(Base64.decode("-_8") == [0xFB, 0xFF])
        #expect(Base64.decode("") == [])
        #expect(Base64.decode("a b") == nil)
    }

    @Test(
        "Should refuse a malformed base64url part: a length no encoding gives, '=' before the end, three '='",
        arguments: ["aGVsb", "aGV=sbG8", "aGVsbA==="])
    func malformedBase64(text: String) {
        #expect(Base64.decode(text) == nil)
    }

    @Test("Should read no claims from a JWT whose payload is malformed base64url")
    func malformedPayload() {
        // {"exp":1} is eyJleHAiOjF9; one more character makes a length no encoding gives.
        #expect(JWT.expiry(of: "e30.eyJleHAiOjF9.sig") == UnixTime(seconds: 1))
        #expect(JWT.claims(of: "e30.eyJleHAiOjF9A.sig") == nil)
    }
}
