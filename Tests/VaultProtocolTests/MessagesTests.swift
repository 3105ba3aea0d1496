import Testing
import Varlink
import VaultCore
import VaultProtocol

private func reader(_ parameters: [String: JSON]) -> ParameterReader { ParameterReader(parameters) }

/// The parameter a reading is refused for.
private func invalidParameter<T>(_ read: () throws(ParameterReader.Invalid) -> T) -> String? {
    do {
        _ = try read()
        return nil
    } catch {
        return error.parameter
    }
}

@Suite("ParameterReader", .timeLimit(.minutes(5)))
struct ParameterReaderTests {
    @Test("Should read present values of the right type")
    func present() throws {
        let p = reader(["s": "x", "i": 42, "o": ["k": 1]])
        #expect(try p.string("s") == "x")
        #expect(try p.optionalString("s") == "x")
        #expect(try p.optionalInt("i") == 42)
        #expect(try p.optionalObject("o") == ["k": 1])
    }

    @Test("Should treat null as absent")
    func null() throws {
        let p = reader(["s": nil, "i": nil, "o": nil])
        #expect(try p.optionalString("s") == nil)
        #expect(try p.optionalInt("i") == nil)
        #expect(try p.optionalObject("o") == nil)
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try p.string("s") } == "s")
    }

    @Test("Should name a missing required parameter")
    func missing() {
        let p = reader([:])
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try p.string("provider") } == "provider")
    }

    @Test("Should name a parameter of the wrong type")
    func wrongType() {
        let p = reader(["s": 1, "i": "1", "f": .number(1.5), "o": []])
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try p.optionalString("s") } == "s")
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try p.optionalInt("i") } == "i")
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try p.optionalInt("f") } == "f")
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try p.optionalObject("o") } == "o")
    }
}

@Suite("LoginRequest", .timeLimit(.minutes(5)))
struct LoginRequestTests {
    @Test("Should read every parameter")
    func full() throws {
        let request = try LoginRequest(
            reader([
                "provider": "demo", "user": "alice", "token": "tok", "tokenResponse": ["access_token": "at"],
                "profile": ["uid": "alice"], "expiresAt": .int(1_900_000_000),
            ]))
        #expect(request.provider == "demo")
        #expect(request.user == "alice")
        #expect(request.token == "tok")
        #expect(request.tokenResponse == ["access_token": "at"])
        #expect(request.profile == ["uid": "alice"])
        #expect(request.expiresAt == 1_900_000_000)
    }

    @Test("Should treat null optional parameters as absent")
    func nulls() throws {
        let request = try LoginRequest(
            reader([
                "provider": "demo", "user": "alice", "token": nil, "tokenResponse": nil, "profile": nil,
                "expiresAt": nil,
            ]))
        #expect(request.token == nil)
        #expect(request.tokenResponse == nil)
        #expect(request.profile == nil)
        #expect(request.expiresAt == nil)
    }

    @Test(
        "Should name the first bad parameter",
        arguments: [
            (["user": "alice"], "provider"),
            (["provider": nil, "user": "alice"], "provider"),
            ([:], "provider"),
            (["provider": "demo", "user": 1000], "user"),
            (["provider": "demo"], "user"),
            (["provider": "demo", "user": "alice", "token": 5], "token"),
            (["provider": "demo", "user": "alice", "tokenResponse": "{}"], "tokenResponse"),
            (["provider": "demo", "user": "alice", "profile": ["alice"]], "profile"),
            (["provider": "demo", "user": "alice", "expiresAt": "tomorrow"], "expiresAt"),
        ] as [([String: JSON], String)])
    func invalid(parameters: [String: JSON], name: String) {
        #expect(invalidParameter { () throws(ParameterReader.Invalid) in try LoginRequest(reader(parameters)) } == name)
    }
}

@Suite("GetTokenRequest", .timeLimit(.minutes(5)))
struct GetTokenRequestTests {
    @Test("Should default minValidSeconds to zero, also for null")
    func defaults() throws {
        #expect(try GetTokenRequest(reader(["provider": "demo", "user": "alice"])).minValidSeconds == 0)
        #expect(
            try GetTokenRequest(reader(["provider": "demo", "user": "alice", "minValidSeconds": nil])).minValidSeconds
                == 0)
    }

    @Test("Should read the account and minValidSeconds")
    func full() throws {
        let request = try GetTokenRequest(reader(["provider": "demo", "user": "alice", "minValidSeconds": 300]))
        #expect(request.provider == "demo")
        #expect(request.user == "alice")
        #expect(request.minValidSeconds == 300)
    }

    @Test(
        "Should name the bad parameter",
        arguments: [
            (["user": "alice"], "provider"),
            (["provider": "demo", "user": 7], "user"),
            (["provider": "demo", "user": "alice", "minValidSeconds": -1], "minValidSeconds"),
            (["provider": "demo", "user": "alice", "minValidSeconds": .number(0.5)], "minValidSeconds"),
            (["provider": "demo", "user": "alice", "minValidSeconds": "60"], "minValidSeconds"),
        ] as [([String: JSON], String)])
    func invalid(parameters: [String: JSON], name: String) {
        #expect(
            invalidParameter { () throws(ParameterReader.Invalid) in try GetTokenRequest(reader(parameters)) } == name)
    }
}

@Suite("VaultMethod", .timeLimit(.minutes(5)))
struct VaultMethodTests {
    @Test("Should name every method in io.vaultd.Vault")
    func names() {
        #expect(VaultMethod.allCases.allSatisfy { $0.rawValue.hasPrefix("io.vaultd.Vault.") })
        // One case per method the interface declares, and no other.
        #expect(
            Set(VaultMethod.allCases.map(\.rawValue))
                == Set(VaultInterface.declaration.methods.map { "\(VaultInterface.name).\($0.name)" }))
        #expect(ServiceMethod.allCases.allSatisfy { $0.rawValue.hasPrefix("org.varlink.service.") })
    }
}

@Suite("Session wire JSON", .timeLimit(.minutes(5)))
struct WireJSONTests {
    private let rawToken = "invalid_token_abcdefghij_xyz"

    private func record(refresh: String? = nil) -> SessionRecord {
        var tokens = TokenSet(accessToken: Secret(rawToken))
        tokens.refreshToken = refresh.map(Secret.init)
        tokens.tokenType = "Bearer"
        tokens.scope = "api"
        tokens.instanceURL = "https://example.my.salesforce.com"
        tokens.clientID = "client"
        var profile = UserProfile(uid: "alice")
        profile.name = "Alice"
        return SessionRecord(
            account: Account(provider: "demo", user: "alice"), user: profile, tokens: tokens,
            createdAt: UnixTime(seconds: 1_700_000_000), expiresAt: UnixTime(seconds: 1_700_003_600), ownerUID: 1000)
    }

    @Test("Should show the token masked, never raw, and no refresh token")
    func masked() {
        let json = record(refresh: "refresh_secret_value_123456").wireJSON(state: .logged)
        #expect(json["token"] == "in********yz")
        #expect(!json.text.contains(rawToken))
        #expect(!json.text.contains("refresh_secret_value_123456"))
        #expect(!json.text.contains("client"))
    }

    @Test("Should tell whether a refresh token exists")
    func hasRefreshToken() {
        #expect(record(refresh: "r").wireJSON(state: .logged)["hasRefreshToken"] == true)
        #expect(record().wireJSON(state: .logged)["hasRefreshToken"] == false)
    }

    @Test("Should carry the session's metadata with the interface's member names")
    func members() {
        let json = record().wireJSON(state: .logging)
        #expect(
            json == [
                "provider": "demo", "user": "alice", "state": "logging", "profile": ["uid": "alice", "name": "Alice"],
                "createdAt": .int(1_700_000_000), "expiresAt": .int(1_700_003_600), "ownerUid": 1000,
                "hasRefreshToken": false, "token": "in********yz", "tokenType": "Bearer", "scope": "api",
                "instanceUrl": "https://example.my.salesforce.com",
            ])
    }

    @Test("Should describe a pending login with account, owner, state and no refresh token")
    func pending() {
        let json = pendingSessionJSON(
            SessionKey(owner: 1000, account: Account(provider: "demo", user: "alice")), state: .logging)
        #expect(
            json == [
                "provider": "demo", "user": "alice", "state": "logging", "ownerUid": 1000, "hasRefreshToken": false,
            ])
    }
}
