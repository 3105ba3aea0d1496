import Foundation
import Testing
import Varlink

/// A real OAuth 2.0 server (Tests/servers/authlib_server.py, on Authlib) in
/// the venv scripts/test makes (scripts/authlib-venv), with three clients,
/// one registered for each client authentication method vaultd speaks:
/// Authlib itself refuses a client that authenticates any other way.
final class AuthlibServer {
    /// A client as the server registers it.
    struct Registration: Sendable, CustomStringConvertible {
        var id: String
        var secret: String?
        /// Its `token_endpoint_auth_method` (RFC 7591).
        var method: String
        /// The PEM public key that checks its JWTs, and the key's kind (RSA or EC).
        var publicKey: (path: String, type: String)? = nil
        /// True when it may use the JWT bearer grant.
        var jwtBearer = false
        var description: String { method }
    }

    /// Characters that form-urlencoding must carry: ':' in the id (the Basic
    /// pair's separator), '%', '+', '/', '&', '=', a space and non-ASCII.
    static let basic = Registration(id: "vaultd:basic+1", secret: "b4s:ic %41s3c+ret/é", method: "client_secret_basic")
    static let post = Registration(id: "vaultd-post", secret: "p0st&s=cr+t é%41", method: "client_secret_post")
    static let publicClient = Registration(id: "vaultd-public", secret: nil, method: "none")
    static let all = [basic, post, publicClient]

    /// The venv's python: `VAULTD_AUTHLIB_PYTHON` (scripts/test), else the
    /// venv scripts/authlib-venv keeps in .build, when it was made.
    static let python: String? = {
        if let path = ProcessInfo.processInfo.environment["VAULTD_AUTHLIB_PYTHON"] { return path }
        let path = Binaries.packageRoot.appendingPathComponent(".build/authlib-venv/bin/python").path
        return FileManager.default.isExecutableFile(atPath: path) ? path : nil
    }()

    private let server: PythonServer
    var url: String { server.url }

    /// Starts the server, its list of clients (`all` and `extra`) written in
    /// `directory`, its access tokens living `lifetime` seconds, with
    /// `arguments` of its own (`--device-interval 1`).
    init(directory: TemporaryDirectory, extra: [Registration] = [], lifetime: Int = 600, arguments: [String] = [])
        throws
    {
        guard let python = AuthlibServer.python else { throw HarnessError("no Authlib venv: run scripts/authlib-venv") }
        let clients = JSON.array(
            (AuthlibServer.all + extra).map { client in
                var entry: [String: JSON] = ["client_id": .string(client.id), "method": .string(client.method)]
                if let secret = client.secret { entry["client_secret"] = .string(secret) }
                if let key = client.publicKey {
                    entry["public_key"] = .string(key.path)
                    entry["key_type"] = .string(key.type)
                }
                if client.jwtBearer { entry["jwt_bearer"] = true }
                return .object(entry)
            })
        let path = directory.path("clients.json")
        try clients.text.write(toFile: path, atomically: true, encoding: .utf8)
        server = try PythonServer(
            "authlib_server.py", ["--clients", path, "--lifetime", String(lifetime)] + arguments, python: python)
    }

    /// A token response with a refresh token for `client`, as an
    /// authorization code login gives: what `vaultctl login` is handed.
    func issue(_ client: Registration) throws -> JSON {
        let body = JSON.object(["client_id": .string(client.id)]).serialized()
        let response = try LoopbackHTTP.request("POST", url: url, path: "/control/issue", body: body)
        guard response.status == 200 else { throw HarnessError("/control/issue answered \(response.status)") }
        return try JSON.parse(response.body)
    }

    /// Every token and revocation request the server took, oldest first.
    func requests() throws -> [JSON] { try stats()["requests"]?.arrayValue ?? [] }

    /// The requests to `endpoint` the server took, with `grant_type` `grant` for the token endpoint.
    func requests(_ endpoint: String, grant: String? = nil) throws -> [JSON] {
        try requests().filter {
            $0["endpoint"]?.stringValue == endpoint && (grant == nil || $0["grant_type"]?.stringValue == grant)
        }
    }

    /// What `heldRefreshTokenCycle` went through.
    struct HeldCycle {
        /// The token response `vaultctl login` was handed, and its refresh token.
        var issued: JSON
        var firstRefresh: String
        /// The access token after the refresh, and the refresh tokens live then.
        var token: String
        var live: [String]
        /// The revocation requests the logout made.
        var revoked: [JSON]
        /// What vaultctl wrote at the login and the refresh.
        var output: String
    }

    /// The steps of a refresh token a login brings: issues one for
    /// `client`, logs `user` of provider `oauth` in with it, refreshes,
    /// checks that the new access token works and that the refresh token
    /// rotated, logs out and checks that the rotated one was revoked.
    func heldRefreshTokenCycle(
        _ fixture: DaemonFixture, _ client: Registration, user: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> HeldCycle {
        let issued = try issue(client)
        let firstRefresh = try #require(issued["refresh_token"]?.stringValue, sourceLocation: sourceLocation)
        let login = try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "oauth", user], input: issued.text), sourceLocation: sourceLocation)
        let refreshed = try expectSuccess(
            vaultctl(fixture.socketPath, ["refresh", "oauth", user]), sourceLocation: sourceLocation)
        let token = try fixture.token("oauth", user)
        #expect(try accepts(token), sourceLocation: sourceLocation)
        // Rotation: the held refresh token works no more, the new one does.
        let live = try liveRefreshTokens()
        #expect(
            live.count == 1 && live.first != firstRefresh, "rotated: \(live.count) live", sourceLocation: sourceLocation
        )
        try expectSuccess(vaultctl(fixture.socketPath, ["logout", "oauth", user]), sourceLocation: sourceLocation)
        let revoked = try await eventually(tries: 250, { try requests("revoke") }, until: { !$0.isEmpty })
        #expect(revoked.count == 1, sourceLocation: sourceLocation)
        #expect(
            try liveRefreshTokens().isEmpty, "the rotated refresh token was revoked", sourceLocation: sourceLocation)
        return HeldCycle(
            issued: issued, firstRefresh: firstRefresh, token: token, live: live, revoked: revoked,
            output: login.stdout + login.stderr + refreshed.stdout + refreshed.stderr)
    }

    /// A running vaultd whose provider `oauth` is `client` here, refreshing
    /// as often as asked (`MinRefreshInterval=0`), with `vault` in its
    /// `[Vault]` section, revoking here when `revocation`, the client's
    /// secret in a `ClientSecretFile=` when it has one, `lines` added to the
    /// provider's section, and `after` after it.
    func daemon(
        _ client: Registration, vault: String = "", revocation: Bool = true, lines: [String] = [], after: String = ""
    ) throws -> DaemonFixture {
        let fixture = try DaemonFixture(start: false)
        var text = "[Vault]\nMinRefreshInterval=0\n\(vault)\n[Provider oauth]\nType=oauth2\n"
        text += "TokenURL=\(url)/token\nClientID=\(client.id)\n" + (revocation ? "RevocationURL=\(url)/revoke\n" : "")
        if let secret = client.secret {
            let path = fixture.directory.path("client-secret")
            try secret.write(toFile: path, atomically: true, encoding: .utf8)
            text += "ClientSecretFile=\(path)\n"
        }
        text += lines.map { $0 + "\n" }.joined() + after
        try fixture.configure(text)
        try fixture.start()
        return fixture
    }

    /// The refresh tokens that still work.
    func liveRefreshTokens() throws -> [String] {
        try stats()["live_refresh_tokens"]?.arrayValue?.compactMap(\.stringValue) ?? []
    }

    private func stats() throws -> JSON {
        try JSON.parse(LoopbackHTTP.request("GET", url: url, path: "/control/stats").body)
    }

    /// The user `token` was issued to, when it works at the protected resource.
    func user(of token: String) throws -> String? {
        let response = try LoopbackHTTP.request(
            "GET", url: url, path: "/resource", headers: ["Authorization": "Bearer \(token)"])
        guard response.status == 200 else { return nil }
        return try JSON.parse(response.body)["user"]?.stringValue
    }

    /// True when `token` works at the protected resource.
    func accepts(_ token: String) throws -> Bool {
        try LoopbackHTTP.request("GET", url: url, path: "/resource", headers: ["Authorization": "Bearer \(token)"])
            .status == 200
    }
}

extension Trait where Self == ConditionTrait {
    /// Runs the suite where the Authlib venv is (scripts/test makes it, and
    /// there a broken one fails the suite); skipped, saying how, elsewhere.
    static var requiresAuthlib: Self {
        .enabled(
            if: AuthlibServer.python != nil, "no Authlib venv: run scripts/test, or scripts/authlib-venv once")
    }
}

/// `TokenEndpointAuthMethod=` against a real OAuth 2.0 server (issue 32,
/// item 1): for each method a login, a refresh that rotates the refresh
/// token and a logout that revokes it, each authenticated the way the
/// client is registered; a client that uses another method is refused.
@Suite(
    "Client authentication against Authlib", .requiresKeyring, .requiresAuthlib, .ownThreads,
    .timeLimit(.minutes(5)))
struct TokenEndpointAuthTests {
    /// A running vaultd whose provider `oauth` is `client` at `server`,
    /// with `TokenEndpointAuthMethod=method` when given.
    func start(_ server: AuthlibServer, _ client: AuthlibServer.Registration, method: String?) throws -> DaemonFixture {
        try server.daemon(client, lines: method.map { ["TokenEndpointAuthMethod=\($0)"] } ?? [])
    }

    /// Checks that every request of `seen` authenticated `client` by its method, on the wire too.
    func expectAuthenticated(
        _ seen: [JSON], as client: AuthlibServer.Registration, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        for request in seen {
            #expect(request["status"]?.integerValue == 200, "\(request.text)", sourceLocation: sourceLocation)
            #expect(request["client_id"]?.stringValue == client.id, "\(request.text)", sourceLocation: sourceLocation)
            #expect(
                request["auth_method"]?.stringValue == client.method, "\(request.text)", sourceLocation: sourceLocation)
            #expect(
                request["basic"]?.boolValue == (client.method == "client_secret_basic"), "\(request.text)",
                sourceLocation: sourceLocation)
            #expect(
                request["secret_in_body"]?.boolValue == (client.method == "client_secret_post"), "\(request.text)",
                sourceLocation: sourceLocation)
        }
    }

    /// Checks that nothing secret is in vaultd's output or vaultctl's answers.
    func expectNoSecrets(
        _ output: String, _ client: AuthlibServer.Registration, tokens: [String],
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        for secret in tokens + (client.secret.map { [$0] } ?? []) {
            #expect(!output.contains(secret), "a secret in the output", sourceLocation: sourceLocation)
        }
        #expect(!output.contains("Basic "), "an Authorization header in the output", sourceLocation: sourceLocation)
    }

    @Test(
        "Should log in with a held refresh token, refresh with rotation and revoke at logout, by each method",
        arguments: [
            (AuthlibServer.basic, nil), (AuthlibServer.basic, "client_secret_basic"),
            (AuthlibServer.post, "client_secret_post"), (AuthlibServer.publicClient, nil),
            (AuthlibServer.publicClient, "none"),
        ] as [(AuthlibServer.Registration, String?)])
    func heldRefreshToken(client: AuthlibServer.Registration, method: String?) async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory)
        let fixture = try start(server, client, method: method)
        let cycle = try await server.heldRefreshTokenCycle(fixture, client, user: uniqueName("auth"))
        #expect(cycle.token != cycle.issued["access_token"]?.stringValue, "the refresh gave a new access token")
        let refreshes = try server.requests("token", grant: "refresh_token")
        #expect(refreshes.count == 1)
        expectAuthenticated(refreshes, as: client)
        expectAuthenticated(cycle.revoked, as: client)
        let daemon = try #require(fixture.daemon)
        expectNoSecrets(daemon.allOutput + cycle.output, client, tokens: [cycle.firstRefresh] + cycle.live)
    }

    @Test(
        "Should log in from the provider with client_credentials, by each method with a secret",
        arguments: [(AuthlibServer.basic, nil), (AuthlibServer.post, "client_secret_post")]
            as [(AuthlibServer.Registration, String?)])
    func clientCredentials(client: AuthlibServer.Registration, method: String?) throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory)
        let fixture = try start(server, client, method: method)
        let user = uniqueName("cc")
        let login = try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]))
        let token = try fixture.token("oauth", user)
        #expect(try server.accepts(token))
        let grants = try server.requests("token", grant: "client_credentials")
        #expect(grants.count == 1)
        expectAuthenticated(grants, as: client)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
        let daemon = try #require(fixture.daemon)
        expectNoSecrets(daemon.allOutput + login.stdout + login.stderr, client, tokens: [token])
    }

    @Test(
        "Should be refused by a server whose client is registered for another method",
        arguments: [
            // The default with a secret is client_secret_basic; this client is registered for post.
            (AuthlibServer.post, nil, true), (AuthlibServer.basic, "client_secret_post", false),
        ] as [(AuthlibServer.Registration, String?, Bool)])
    func wrongMethod(client: AuthlibServer.Registration, method: String?, sentBasic: Bool) throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory)
        let fixture = try start(server, client, method: method)
        let user = uniqueName("wrong")
        let login = try expectFailure(vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]))
        let grants = try server.requests("token", grant: "client_credentials")
        #expect(grants.count == 1)
        for request in grants {
            #expect(request["status"]?.integerValue == 401, "\(request.text)")
            #expect(request["error"]?.stringValue == "invalid_client", "\(request.text)")
            #expect(request["basic"]?.boolValue == sentBasic, "\(request.text)")
            #expect(request["secret_in_body"]?.boolValue == !sentBasic, "\(request.text)")
        }
        let daemon = try #require(fixture.daemon)
        expectNoSecrets(daemon.allOutput + login.stdout + login.stderr, client, tokens: [])
    }
}
