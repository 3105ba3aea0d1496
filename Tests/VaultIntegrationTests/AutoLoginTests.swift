import Foundation
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// Accounts vaultd keeps logged in (`[Account PROVIDER USER] AutoLogin=yes`),
/// against the real vaultd, the real keyring and the token server's client
/// credentials grant, with its fault injection and request counters.
@Suite("Automatic login and login backoff", .serialized, .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct AutoLoginTests {
    /// A fixture whose provider `oauth` logs in at `server` by client
    /// credentials, and whose account `oauth USER` vaultd keeps logged in;
    /// started unless `start` is false.
    func fixture(_ server: TokenServer, user: String, extra: String = "", start: Bool = true) throws -> DaemonFixture {
        let fixture = try DaemonFixture(
            oauthServer: server, extra: "\n[Account oauth \(user)]\nAutoLogin=yes\n\(extra)\n")
        if start { try fixture.start() }
        return fixture
    }

    /// How many client-credentials requests the server took.
    func logins(_ server: TokenServer) async throws -> Int64 {
        try await server.stats()["client_credentials_requests"]?.integerValue ?? -1
    }

    /// The session of `user` as `vaultctl --json status` shows it.
    func status(_ fixture: DaemonFixture, _ user: String) throws -> JSON {
        let result = try vaultctl(fixture.socketPath, ["--json", "status", "oauth", user])
        return (try? JSON.parse(Array(result.stdout.utf8)))?["session"] ?? .null
    }

    /// A subscription to the events of `oauth USER`.
    func subscribe(_ socket: String, _ user: String) throws -> VarlinkClient {
        try subscription(socket, provider: "oauth", user: user, timeoutSeconds: 60).watcher
    }

    /// The kinds of the next `count` events on `watcher`.
    func kinds(_ count: Int, on watcher: VarlinkClient) throws -> [String] {
        var kinds: [String] = []
        for _ in 0..<count {
            guard let event = try watcher.nextReply()?.parameters["event"] else { break }
            kinds.append(event["kind"]?.stringValue ?? "?")
        }
        return kinds
    }

    @Test("Should answer a GetToken that waits for a login still hanging at the provider when its wait ends")
    func waitEndsWhileTheLoginHangs() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user, start: false)
        try await server.post("/control/mode", json: ["mode": "hang", "target": "token", "hang_seconds": 60])
        try fixture.start()
        let vault = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60)
        let started = Date()
        let refused = #expect(throws: VaultClientError.self) {
            try vault.token(provider: "oauth", user: user, waitSeconds: 2)
        }
        let took = Date().timeIntervalSince(started)
        #expect(refused?.vaultCode == .notLoggedIn, "\(String(describing: refused))")
        // The login's request hangs far longer: the wait's own end answered.
        #expect(took >= 1.5 && took < 10, "answered after \(took) s")
        try await server.post("/control/mode", json: ["mode": "normal"])
    }

    @Test("Should log an AutoLogin account in at start, with no client asking")
    func loggedInAtStart() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user)
        #expect(try await server.accepts(fixture.awaitToken("oauth", user)))
        #expect(try await logins(server) == 1)
        let session = try status(fixture, user)
        #expect(session["state"]?.stringValue == "logged")
        // The session is in the store like any other.
        #expect(try await fixture.store.holds(provider: "oauth", user: user))
        // A restart restores it: no second login.
        fixture.daemon?.stop()
        try fixture.start()
        #expect(try vaultctl(fixture.socketPath, ["token", "oauth", user]).status == 0)
        #expect(try await logins(server) == 1)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should log the account in again after tokenInvalid, and not after a client's logout")
    func reloginAfterTokenInvalid() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user)
        let first = try await eventually(
            { try vaultctl(fixture.socketPath, ["token", "oauth", user]) }, until: { $0.status == 0 })
        let watcher = try subscribe(fixture.socketPath, user)
        try await server.post("/control/mode", json: ["mode": "invalid_grant", "count": 1])
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 1)
        #expect(try kinds(3, on: watcher) == ["connectionChanged", "tokenInvalid", "loginSuccess"])
        let second = try expectSuccess(vaultctl(fixture.socketPath, ["token", "oauth", user]))
        #expect(second.stdout != first.stdout, "a new grant")
        #expect(try await logins(server) == 2)
        // A logout a client asks for is left alone.
        #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
        #expect(try kinds(1, on: watcher) == ["logoutSuccess"])
        let after = try vaultctl(fixture.socketPath, ["token", "oauth", user])
        #expect(after.stderr.contains("ERR_NOT_LOGGED_IN"), "\(after.stderr)")
        #expect(try await logins(server) == 2)
    }

    @Test("Should back off failed logins per account, shared by clients, honouring Retry-After, shown in status")
    func backoffSharedAndShown() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        try await server.post("/control/mode", json: ["mode": "error429", "retry_after": 4])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user)
        let started = Date()
        let failed = try await eventually(
            { try status(fixture, user) }, until: { $0["consecutiveFailures"]?.integerValue == 1 })
        #expect(failed["state"]?.stringValue == "logout")
        #expect(failed["lastErrorCode"]?.stringValue == "ERR_NETWORK_ERROR", "\(failed)")
        #expect(failed["lastError"]?.stringValue?.contains("429") == true, "\(failed)")
        let retryAt = try #require(failed["nextRetryAt"]?.integerValue)
        #expect(retryAt >= Int64(started.timeIntervalSince1970) + 4 - 1, "Retry-After: 4 is honoured")
        // A client's login during the backoff is refused without asking the server.
        try expectFailure(
            vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]), saying: "ERR_LOGIN_BACKING_OFF",
            "the next login is allowed from")
        let human = try vaultctl(fixture.socketPath, ["status", "oauth", user]).stdout
        #expect(human.contains("Next retry"), "\(human)")
        #expect(human.contains("ERR_NETWORK_ERROR"), "\(human)")
        #expect(try await logins(server) == 1)
        // vaultd tries again once the wait is over (and not before).
        let again = try await eventually(
            tries: 600, interval: .milliseconds(50), { try await logins(server) }, until: { $0 >= 2 })
        let waited = Date().timeIntervalSince(started)
        // A loaded machine may see the third try (4 s later again) before this poll does.
        #expect(again >= 2)
        #expect(waited >= 3, "the second login came after \(waited)s, before Retry-After")
        try await server.post("/control/mode", json: ["mode": "normal"])
        _ = try await fixture.awaitToken("oauth", user, tries: 600, interval: .milliseconds(50))
        #expect(try await logins(server) >= again + 1)
        let logged = try status(fixture, user)
        #expect(logged["state"]?.stringValue == "logged")
        #expect(logged["lastErrorCode"] == nil, "the backoff ends with the login")
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test(
        "Should not list an account whose logins failed, show its backoff in status, and end the backoff when the provider's secret is stored or its configuration reloaded"
    )
    func backoffEndsWithNewCredentials() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user, start: false)
        for (round, change) in ["provider-secret", "reload"].enumerated() {
            // Ten minutes of Retry-After: only a change of credentials brings the next login sooner.
            try await server.post("/control/mode", json: ["mode": "error429", "count": 1, "retry_after": 600])
            if round == 0 {
                try fixture.start()
            } else {
                #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
                #expect(try vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]).status == 1)
            }
            let parked = try await eventually(
                { try status(fixture, user) }, until: { $0["consecutiveFailures"]?.integerValue == 1 })
            let retryAt = try #require(parked["nextRetryAt"]?.integerValue, "\(change): \(parked)")
            #expect(retryAt >= Int64(Date().timeIntervalSince1970) + 500, "\(change): \(parked)")
            let listed = try expectSuccess(vaultctl(fixture.socketPath, ["--json", "list"]))
            #expect(!listed.stdout.contains(user), "a failed login is no session: \(listed.stdout)")
            let logins = try await logins(server)
            if change == "provider-secret" {
                try expectSuccess(vaultctl(fixture.socketPath, ["provider-secret", "oauth"], input: "new-secret"))
            } else {
                kill(try #require(fixture.daemon).process.processIdentifier, SIGHUP)
            }
            // AutoLogin: logged in again at once, not in ten minutes.
            let again = try await eventually(
                tries: 500, { try status(fixture, user) }, until: { $0["state"]?.stringValue == "logged" })
            #expect(again["state"]?.stringValue == "logged", "\(change) ends the backoff: \(again)")
            #expect(try await self.logins(server) == logins + 1, "\(change)")
        }
        fixture.daemon?.stop()
    }

    @Test("Should make failed logins wait longer and longer, not storm the server")
    func backoffGrows() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        try await server.post("/control/mode", json: ["mode": "error500"])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user)
        let started = Date()
        _ = try await eventually({ try await logins(server) }, until: { $0 >= 1 })
        // Waits of 1..2, 1..4, 1..8 s: in 8 s at most 8 requests even at the
        // shortest waits (1 s each); without a backoff there would be hundreds.
        var samples: [Int64] = []
        for _ in 0..<200 where Date().timeIntervalSince(started) < 8 {
            samples.append(try await logins(server))
            try await Task.sleep(for: .milliseconds(40))
        }
        let count = try await logins(server)
        print("AUTOLOGIN backoff: \(count) logins in \(Date().timeIntervalSince(started))s while the server failed")
        #expect(count >= 2, "vaultd retried")
        #expect(count <= 9, "\(count) logins in 8 s")
        // Read after the count: at most one request the server took is still
        // on its way back to vaultd, and more may have failed since.
        let failures = try status(fixture, user)["consecutiveFailures"]?.integerValue ?? 0
        #expect(failures >= count - 1, "\(failures) failures shown, \(count) requests taken")
        fixture.daemon?.stop()
    }

    @Test("Should have GetToken wait for the automatic login in flight instead of failing at once")
    func getTokenWaits() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        // The login at start is held 3 s by the server.
        try await server.post("/control/mode", json: ["mode": "slow", "count": 1, "hang_seconds": 3])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user)
        let asked = Date()
        let token = try vaultctl(fixture.socketPath, ["token", "oauth", user])
        let waited = Date().timeIntervalSince(asked)
        #expect(token.status == 0, "\(token.stderr)")
        #expect(waited >= 1, "answered after the login, \(waited)s")
        print("AUTOLOGIN GetToken waited \(waited)s for the login in flight")
        #expect(try await logins(server) == 1)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
        // Logged out by a client, nothing is coming: no wait.
        let again = Date()
        let refused = try vaultctl(fixture.socketPath, ["token", "oauth", user])
        #expect(refused.stderr.contains("ERR_NOT_LOGGED_IN"), "\(refused.stderr)")
        #expect(Date().timeIntervalSince(again) < 2)
    }

    @Test("Should have GetToken wait through a failed automatic login for the retry after its backoff")
    func getTokenWaitsThroughBackoff() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        try await server.post("/control/mode", json: ["mode": "error500", "count": 1])
        let user = uniqueName("bot")
        let fixture = try fixture(server, user: user)
        try expectSuccess(vaultctl(fixture.socketPath, ["token", "oauth", user]))
        #expect(try await logins(server) == 2, "the failed login and its retry")
        let client = try fixture.client()
        // waitSeconds 0: no waiting (here there is a session, so it is served).
        let reply = try client.call(
            VaultMethod.getToken.rawValue, ["provider": "oauth", "user": .string(user), "waitSeconds": 0])
        #expect(reply.parameters["token"]?.stringValue != nil)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should log an exec account in at start through its helper's own credential (OpenIM's admin secret)")
    func execHelperAtStart() async throws {
        let standIns = try ChatStandIns()
        let fixture = try DaemonFixture(start: false)
        let examples = Binaries.packageRoot.appendingPathComponent("config/examples").path
        let openim = fixture.directory.path("openim.json")
        try
            #"{"api_url": "\#(standIns.url)/openim", "admin_user_id": "imAdmin", "secret": "openIM123", "platform_id": 5}"#
            .write(toFile: openim, atomically: true, encoding: .utf8)
        // The stand-in knows alice and bob; the fixture's own store scope keeps this bob apart.
        let user = "bob"
        try fixture.configure(
            """
            [Provider openim]
            Type=exec
            Command=\(examples)/openim-helper --config \(openim)
            Timeout=15s

            [Account openim \(user)]
            AutoLogin=yes
            """)
        try fixture.start()
        #expect(try await !fixture.awaitToken("openim", user, tries: 500).isEmpty)
        _ = try vaultctl(fixture.socketPath, ["logout", "openim", user])
    }

    @Test("Should refuse AutoLogin for a static provider at --check-config, naming file, line and key")
    func checkConfigRefusesStatic() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("vaultd.conf")
        let result = try checkConfigText(
            "[Provider demo]\nType=static\n\n[Account demo bot]\nAutoLogin=yes\n", at: path)
        #expect(result.status != 0)
        #expect(result.stderr.contains("\(path):5: key 'AutoLogin'"), "\(result.stderr)")
        #expect(result.stderr.contains("Type=static"), "\(result.stderr)")
    }
}
