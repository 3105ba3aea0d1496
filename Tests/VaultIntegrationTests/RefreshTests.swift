import Foundation
import Glibc
import Synchronization
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// The test OAuth 2.0 server (Tests/servers/token_server.py), a real process on loopback.
final class TokenServer {
    private let server: PythonServer
    var url: String { server.url }

    init(_ arguments: [String] = []) throws { server = try PythonServer("token_server.py", arguments) }

    /// The configuration section of a provider `oauth` that gets its tokens
    /// here (and, with `revocation`, revokes them here).
    func providerSection(revocation: Bool = false) -> String {
        "[Provider oauth]\nType=oauth2\nTokenURL=\(url)/token\nClientID=vaultd-test\n"
            + (revocation ? "RevocationURL=\(url)/revoke\n" : "")
    }

    /// POSTs `body` to `path` and returns the JSON answer.
    @discardableResult
    func post(_ path: String, form: String? = nil, json: JSON? = nil) async throws -> JSON {
        var headers: [String: String] = [:]
        var body: [UInt8] = []
        if let form {
            body = Array(form.utf8)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        } else if let json {
            body = json.serialized()
            headers["Content-Type"] = "application/json"
        }
        let response = try LoopbackHTTP.request("POST", url: url, path: path, headers: headers, body: body)
        return (try? JSON.parse(response.body)) ?? .null
    }

    /// The revocations the server has taken, oldest first.
    func revocations() async throws -> [JSON] { try await stats()["revocations"]?.arrayValue ?? [] }

    func stats() async throws -> JSON {
        try JSON.parse(LoopbackHTTP.request("GET", url: url, path: "/control/stats").body)
    }

    /// True when `token` works at the protected resource.
    func accepts(_ token: String) async throws -> Bool {
        try LoopbackHTTP.request("GET", url: url, path: "/resource", headers: ["Authorization": "Bearer \(token)"])
            .status == 200
    }

    /// A fresh grant, as the token endpoint answers client_credentials: the text `curl … | vaultctl login` pipes.
    func grant() async throws -> String {
        try await post("/token", form: "grant_type=client_credentials&client_id=vaultd-test").text
    }
}

/// Refresh against a real token endpoint: ahead of expiry, once for all
/// clients, with backoff on transient failures and logout on permanent ones.
@Suite("Token refresh", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct RefreshTests {
    func start(_ server: TokenServer, revocation: Bool = false, extra: String = "") throws -> (
        DaemonFixture, RunningDaemon
    ) {
        let fixture = try DaemonFixture(config: server.providerSection(revocation: revocation) + extra)
        return (fixture, fixture.daemon!)
    }

    /// A server whose tokens live `lifetime` seconds, a daemon of `start`'s
    /// on it, and a user named after `prefix` logged in there with a grant.
    func loggedIn(
        _ prefix: String, lifetime: Int = 600, revocation: Bool = false, extra: String = "",
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> (TokenServer, DaemonFixture, String) {
        let server = try TokenServer(["--lifetime", String(lifetime)])
        let (fixture, _) = try start(server, revocation: revocation, extra: extra)
        let user = uniqueName(prefix)
        try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()),
            sourceLocation: sourceLocation)
        return (server, fixture, user)
    }

    func subscribe(_ socket: String, _ user: String) throws -> VarlinkClient {
        // Generous: a refresh or a retry may be tens of seconds away on a loaded machine.
        try subscription(socket, provider: "oauth", user: user, timeoutSeconds: 90).watcher
    }

    /// The next event of `kind`, skipping others; bounded by the socket timeout and a count.
    func next(_ kind: String, on watcher: VarlinkClient) throws -> JSON? {
        for _ in 0..<20 {
            guard let event = try watcher.nextReply()?.parameters["event"] else { return nil }
            if event["kind"]?.stringValue == kind { return event }
        }
        return nil
    }

    @Test("Should refresh before expiry without any client asking, with a working token")
    func refreshesAheadOfExpiry() async throws {
        // issued_at (Salesforce style) lets vaultd count the lifetime from the
        // server's clock rather than from the moment of the login.
        // 45 s leaves a loaded machine time between the grant and the login
        // (8 s and 20 s were seen to expire on the way, with the suite running
        // beside two busy loops on 2 cores).
        let server = try TokenServer(["--lifetime", "45", "--salesforce"])
        let (fixture, _) = try start(server)
        let user = uniqueName("auto")
        let watcher = try subscribe(fixture.socketPath, user)
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let first = try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout
        let refreshed = try #require(try next("tokenRefreshed", on: watcher))
        #expect(refreshed["expiresAt"]?.integerValue != nil)
        let second = try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout
        #expect(first != second)
        #expect(try await server.accepts(second.trimmingCharacters(in: .whitespacesAndNewlines)))
        let stats = try await server.stats()
        #expect(stats["refresh_requests"]?.integerValue ?? 0 >= 1)
        #expect(stats["refresh_after_expiry"]?.integerValue == 0, "refreshed ahead of expiry")
        #expect(stats["reused_refresh_tokens"]?.integerValue == 0)
        let status = try JSON.parse(try vaultctl(fixture.socketPath, ["--json", "status", "oauth", user]).stdout)
        #expect(status["session"]?["connection"]?.stringValue == "connected")
        #expect(status["session"]?["lastRefreshAt"]?.integerValue != nil)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should not let GetToken past the token's lifetime, or Refresh, storm the token endpoint")
    func noRefreshStorm() async throws {
        // Tokens live 600 s; the login's own token expires in 120 s.
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, _) = try start(server)
        let user = uniqueName("storm")
        let soon = Int64(Date().timeIntervalSince1970) + 120
        try expectSuccess(
            vaultctl(
                fixture.socketPath, ["login", "oauth", user, "--expires-at", String(soon)],
                input: try await server.grant()))
        _ = try await server.post("/control/reset")
        // 200 calls asking for more than any token of this provider lives.
        let client = try VarlinkClient(path: fixture.socketPath, timeoutSeconds: 60)
        var codes: [String: Int] = [:]
        for _ in 0..<200 {
            let reply = try client.call(
                VaultMethod.getToken.rawValue,
                ["provider": "oauth", "user": .string(user), "minValidSeconds": 100_000])
            codes[reply.parameters["code"]?.stringValue ?? "ok", default: 0] += 1
        }
        #expect(codes == ["ERR_TOKEN_EXPIRED": 200], "\(codes)")
        var stats = try await server.stats()
        #expect(stats["refresh_requests"]?.integerValue == 1, "one refresh, then the lifetime is known: \(stats)")
        // Within MinRefreshInterval= (60 s by default) an explicit refresh sends nothing either.
        let again = try expectFailure(
            vaultctl(fixture.socketPath, ["refresh", "oauth", user]), saying: "ERR_REFRESH_TOO_SOON")
        #expect(again.stderr.contains("MinRefreshInterval"))
        stats = try await server.stats()
        #expect(stats["refresh_requests"]?.integerValue == 1)
        // The token itself is still served.
        #expect(try vaultctl(fixture.socketPath, ["token", "oauth", user]).status == 0)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should send one token request for 50 concurrent GetToken calls that need a refresh")
    func singleFlight() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, _) = try start(server)
        let user = uniqueName("flight")
        let soon = Int64(Date().timeIntervalSince1970) + 120
        #expect(
            try vaultctl(
                fixture.socketPath, ["login", "oauth", user, "--expires-at", String(soon)],
                input: try await server.grant()
            ).status == 0)
        _ = try await server.post("/control/reset")
        let tokens = Mutex<[String]>([])
        let socket = fixture.socketPath
        DispatchQueue.concurrentPerform(iterations: 50) { _ in
            let reply = try? VarlinkClient(path: socket, timeoutSeconds: 60).call(
                VaultMethod.getToken.rawValue,
                ["provider": "oauth", "user": .string(user), "minValidSeconds": 300])
            if let token = reply?.parameters["token"]?.stringValue { tokens.withLock { $0.append(token) } }
        }
        let all = tokens.withLock { $0 }
        #expect(all.count == 50)
        #expect(Set(all).count == 1, "everyone got the one refreshed token")
        let stats = try await server.stats()
        #expect(stats["refresh_requests"]?.integerValue == 1)
        #expect(stats["reused_refresh_tokens"]?.integerValue == 0)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should back off after a transient failure, keep serving the token, and recover")
    func transientFailure() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, _) = try start(server)
        let user = uniqueName("flaky")
        let watcher = try subscribe(fixture.socketPath, user)
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        // Retry-After: 20 leaves the eager call below a wide margin before the
        // scheduled retry, even on a loaded machine (2 s and 6 s were seen too short).
        try await server.post("/control/mode", json: ["mode": "error429", "count": 1, "retry_after": 20])
        try expectFailure(vaultctl(fixture.socketPath, ["refresh", "oauth", user]), saying: "ERR_NETWORK_ERROR")
        // A client asking for a fresher token than it has sends no request before the retry time.
        let requests = try await server.stats()["refresh_requests"]?.integerValue
        try expectFailure(
            vaultctl(fixture.socketPath, ["token", "oauth", user, "--min-valid", "100000"]),
            saying: "the next try is at")
        #expect(try await server.stats()["refresh_requests"]?.integerValue == requests)
        let status = try JSON.parse(try vaultctl(fixture.socketPath, ["--json", "status", "oauth", user]).stdout)
        let session = try #require(status["session"])
        #expect(session["connection"]?.stringValue == "connectFailed")
        #expect(session["consecutiveFailures"]?.integerValue == 1)
        let retryAt = try #require(session["nextRetryAt"]?.integerValue)
        #expect(retryAt >= Int64(Date().timeIntervalSince1970) + 1, "Retry-After: 20 is honoured")
        try expectSuccess(vaultctl(fixture.socketPath, ["token", "oauth", user]), "the old token is still served")
        // The scheduled retry succeeds by itself.
        #expect(try next("tokenRefreshed", on: watcher) != nil)
        let after = try JSON.parse(try vaultctl(fixture.socketPath, ["--json", "status", "oauth", user]).stdout)
        #expect(after["session"]?["consecutiveFailures"]?.integerValue == 0)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should give up on a token endpoint that does not answer within Timeout=, keeping the session")
    func unansweredRequestTimesOut() async throws {
        let (server, fixture, user) = try await loggedIn("stalled", extra: "Timeout=1s\n")
        try await server.post("/control/mode", json: ["mode": "hang", "count": 1, "hang_seconds": 30])
        let started = Date()
        try expectFailure(
            vaultctl(fixture.socketPath, ["refresh", "oauth", user]), saying: "ERR_NETWORK_ERROR", "timed out")
        #expect(Date().timeIntervalSince(started) < 10, "the 1 s timeout ends the request, not the server's 30 s")
        #expect(try vaultctl(fixture.socketPath, ["token", "oauth", user]).status == 0, "the session stays")
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should log the session out when the token endpoint answers invalid_grant")
    func permanentFailure() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, _) = try start(server)
        let user = uniqueName("revoked")
        let watcher = try subscribe(fixture.socketPath, user)
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        try await server.post("/control/mode", json: ["mode": "invalid_grant", "count": 1])
        try expectFailure(vaultctl(fixture.socketPath, ["refresh", "oauth", user]))
        let event = try #require(try next("tokenInvalid", on: watcher))
        #expect(event["reason"]?.stringValue == "tokenInvalid")
        #expect(try vaultctl(fixture.socketPath, ["token", "oauth", user]).stderr.contains("ERR_NOT_LOGGED_IN"))
        #expect(try await fixture.store.holds(provider: "oauth", user: user) == false)
    }

    @Test("Should keep the client secret in the secret store, never in the config, across restarts")
    func clientSecretInStore() async throws {
        let server = try TokenServer(["--lifetime", "600", "--client-secret", "s3cr3t-client"])
        let (fixture, _) = try start(server)
        let user = uniqueName("cc")
        let refused = try vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"])
        #expect(refused.status == 1, "no client secret yet: invalid_client")
        try expectSuccess(vaultctl(fixture.socketPath, ["provider-secret", "oauth"], input: "s3cr3t-client\n"))
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]))
        // After a restart the secret comes back from the store: a refresh authenticates.
        fixture.daemon?.stop()
        let daemon = try fixture.start()
        try expectSuccess(vaultctl(fixture.socketPath, ["refresh", "oauth", user]))
        #expect(!daemon.allOutput.contains("s3cr3t-client"))
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should end a session at MaxSessionLifetime whatever its tokens say")
    func maxSessionLifetime() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, _) = try start(server, extra: "MaxSessionLifetime=2s\n")
        let user = uniqueName("capped")
        let watcher = try subscribe(fixture.socketPath, user)
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let ended = try #require(try next("tokenInvalid", on: watcher))
        #expect(ended["reason"]?.stringValue == "maxSessionLifetime")
        #expect(try vaultctl(fixture.socketPath, ["token", "oauth", user]).stderr.contains("ERR_NOT_LOGGED_IN"))
    }

    @Test("Should queue failed revocations in the store, two of one account as two, and finish them after a restart")
    func queuedRevocation() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, _) = try start(server, revocation: true)
        let user = uniqueName("queued")
        func queued() async throws -> Int { try await fixture.store.queuedRevocations(user: user) }
        try await server.post("/control/mode", json: ["mode": "error500", "target": "revoke"])
        // Two sessions of the same account end while the revocation endpoint fails.
        for cycle in 1...2 {
            try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
            #expect(
                try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0,
                "a failed revocation does not block")
            let count = try await eventually({ try await queued() }, until: { $0 >= cycle })
            #expect(count == cycle, "every failed revocation waits in the secret store")
        }
        fixture.daemon?.stop()
        try await server.post("/control/mode", json: ["mode": "normal"])
        try fixture.start()
        let revoked = try await eventually({ try await server.revocations() }, until: { $0.count >= 2 })
        #expect(revoked.count == 2, "the restarted daemon finished both")
        #expect(revoked.allSatisfy { $0["kind"]?.stringValue == "refresh_token" })
        #expect(try await eventually({ try await queued() }, until: { $0 == 0 }) == 0)
    }

    // Secret Service only: the old format was an item of that engine; SQLite's rows always had ids.
    @Test(
        "Should take over a revocation queued before revocations had ids, revoke it, and leave none queued",
        .secretServiceOnly)
    func legacyQueuedRevocation() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try DaemonFixture(config: server.providerSection(revocation: true), start: false)
        let user = uniqueName("legacy")
        var tokens = TokenSet(accessToken: Secret("legacy_access_abcdefghijklmnop"))
        tokens.refreshToken = Secret("lgcyrt_refresh_abcdefghijklmnop")
        let record = storedSession("oauth", user, tokens: tokens)
        // As an earlier vaultd queued it: no revocation id, in its attributes or its document.
        try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/secret-tool"),
                [
                    "store", "--label=vaultd: revocation pending", "xdg:schema", "io.vaultd.PendingRevocation",
                    "provider", "oauth", "user", user, "scope", fixture.scope,
                ], input: record.storedJSON().text))
        try fixture.start()
        let revoked = try await eventually({ try await server.revocations() }, until: { !$0.isEmpty })
        #expect(revoked.first?["token"]?.stringValue == "lgcyrt", "\(revoked)")
        let left = try await eventually(
            {
                let search = try runCommand(
                    URL(fileURLWithPath: "/usr/bin/secret-tool"),
                    ["search", "--all", "xdg:schema", "io.vaultd.PendingRevocation", "user", user])
                return search.stdout + search.stderr
            }, until: { !$0.contains("label =") })
        #expect(!left.contains("label ="), "nothing stays queued: \(left)")
    }

    @Test("Should revoke the tokens of a refresh that finished after its session was logged out")
    func refreshOutlivingItsSession() async throws {
        let (server, fixture, user) = try await loggedIn("orphan", revocation: true)
        // The token endpoint issues new tokens at once but answers only once
        // released, after the logout below (a fixed 8 s hold was seen too short
        // for the logout on a loaded CI machine).
        try await server.post("/control/mode", json: ["mode": "held", "count": 1, "hang_seconds": 120])
        let socket = fixture.socketPath
        let refresh = Task.detached { try vaultctl(socket, ["refresh", "oauth", user]) }
        let held = try await eventually(
            { try await server.stats()["held_answers"]?.integerValue ?? 0 }, until: { $0 > 0 })
        #expect(held == 1, "the refresh is out, its answer held")
        #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
        try await server.post("/control/release", json: [:])
        let refreshed = try await refresh.value
        #expect(refreshed.status == 1, "the session ended meanwhile: \(refreshed.stdout)")
        // The logout revokes the old refresh token; the refresh's new one is revoked too.
        let revoked = try await eventually({ try await server.revocations() }, until: { $0.count >= 2 })
        #expect(revoked.count == 2, "\(revoked)")
        #expect(Set(revoked.compactMap { $0["token"]?.stringValue }).count == 2, "two different refresh tokens")
        #expect(revoked.allSatisfy { $0["kind"]?.stringValue == "refresh_token" })
    }

    @Test("Should revoke the refresh token at the provider at logout")
    func revocationAtLogout() async throws {
        let (server, fixture, user) = try await loggedIn("bye", revocation: true)
        #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
        // Revocation runs after the logout is acknowledged: wait for it, bounded.
        let revoked = try await eventually({ try await server.revocations() }, until: { !$0.isEmpty })
        #expect(revoked.first?["kind"]?.stringValue == "refresh_token")
    }

    @Test("Should show when the refresh is due, right after login and after a restart")
    func refreshAtShownAfterLoginAndRestore() async throws {
        let (_, fixture, user) = try await loggedIn("due", lifetime: 3600)
        func refreshAt() throws -> Int64? {
            let status = try vaultctl(fixture.socketPath, ["--json", "status", "oauth", user])
            return try JSON.parse(status.stdout)["session"]?["refreshAt"]?.integerValue
        }
        let afterLogin = try #require(try refreshAt(), "refreshAt right after login")
        #expect(afterLogin > Int64(Date().timeIntervalSince1970) + 2000)
        #expect(fixture.daemon?.stop() == 0)
        try fixture.start()
        // Restored from the record's creation time: the same point, give or take the second of the login.
        let restored = try #require(try refreshAt(), "refreshAt after a restart")
        #expect(abs(restored - afterLogin) <= 1)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }
}
