import Foundation
import Synchronization
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// vaultd as its users meet it: the real binary, the real keyring on the
/// session bus, the real socket, vaultctl and an independent Python client.
/// In the SQLite run this suite's database key is the Secret Service item
/// (`io.vaultd.DataKey` in the fixture's scope), where the other suites use
/// a credential.
@Suite("vaultd against the real keyring", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct DaemonTests {
    static let token = "tok_live_8f3k2m9q7w1e5r4t6y0u"

    /// A fixture whose SQLite key (in the SQLite run) lives in the keyring.
    func fixture(start: Bool = true, engine: StoreEngine = TestStore.engine) throws -> DaemonFixture {
        try DaemonFixture(start: start, engine: engine, dataKey: .secretService)
    }

    @Test("Should keep a session through a restart, in the store, and delete it at logout")
    func loginRestartLogout() async throws {
        let fixture = try fixture()
        let user = uniqueName("alice")
        let login = try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token + "\n"))
        #expect(login.stdout.contains("logged in: \(user) @ demo"))

        let status = try vaultctl(fixture.socketPath, ["--json", "status", "demo", user])
        #expect(status.status == 0)
        let session = try JSON.parse(status.stdout)["session"]
        #expect(session?["state"]?.stringValue == "logged")
        #expect(session?["token"]?.stringValue == Secret.mask(DaemonTests.token))

        #expect(fixture.daemon?.stop() == 0)
        try fixture.start()
        let after = try expectSuccess(vaultctl(fixture.socketPath, ["--json", "status", "demo", user]))
        #expect(try JSON.parse(after.stdout)["session"]?["state"]?.stringValue == "logged")
        let token = try vaultctl(fixture.socketPath, ["token", "demo", user])
        #expect(token.stdout == DaemonTests.token + "\n")

        let stored = try await fixture.store.records(provider: "demo", user: user)
        #expect(stored.map(\.tokens.accessToken.revealed) == [DaemonTests.token])
        if fixture.engine == .secretService {
            #expect(try secretToolSearch(provider: "demo", user: user).contains("label = vaultd: \(user) @ demo"))
        }

        try expectSuccess(vaultctl(fixture.socketPath, ["logout", "demo", user]))
        #expect(try await fixture.store.holds(provider: "demo", user: user) == false)
        try expectFailure(vaultctl(fixture.socketPath, ["status", "demo", user]), saying: "ERR_NOT_LOGGED_IN")
    }

    @Test("Should lose no acknowledged session when vaultd is killed", arguments: TestStore.crashEngines)
    func acknowledgedLoginSurvivesSIGKILL(engine: StoreEngine) throws {
        let fixture = try fixture(engine: engine)
        let user = uniqueName("kill")
        let login = try vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token)
        #expect(login.status == 0)
        fixture.daemon?.stop(signal: SIGKILL)
        try fixture.start()
        let token = try vaultctl(fixture.socketPath, ["token", "demo", user])
        #expect(token.stdout == DaemonTests.token + "\n")
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should answer a logout of a logged-out account with ERR_NOT_LOGGED_IN")
    func logoutWhenLoggedOut() throws {
        let fixture = try fixture()
        let user = uniqueName("nobody")
        try expectFailure(vaultctl(fixture.socketPath, ["logout", "demo", user]), saying: "(ERR_NOT_LOGGED_IN)")
        let reply = try fixture.client().call(
            VaultMethod.logout.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(reply.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(reply.parameters["code"]?.stringValue == "ERR_NOT_LOGGED_IN")
    }

    @Test("Should make one session of concurrent logins of one account")
    func concurrentLoginsJoin() async throws {
        let fixture = try fixture()
        let user = uniqueName("race")
        let count = 16
        let replies = Mutex<[VarlinkReply]>([])
        let socket = fixture.socketPath
        DispatchQueue.concurrentPerform(iterations: count) { i in
            let reply = try? VarlinkClient(path: socket, timeoutSeconds: 60).call(
                VaultMethod.login.rawValue,
                ["provider": "demo", "user": .string(user), "token": .string("token-\(i)-abcdefghijklmnopqrstuvwxyz")])
            if let reply { replies.withLock { $0.append(reply) } }
        }
        let all = replies.withLock { $0 }
        #expect(all.count == count)
        #expect(all.allSatisfy { $0.error == nil })
        let masked = Set(all.compactMap { $0.parameters["session"]?["token"]?.stringValue })
        #expect(masked.count == 1, "every login answered with the same session")
        let list = try fixture.client().call(VaultMethod.listSessions.rawValue)
        let mine = list.parameters["sessions"]?.arrayValue?.filter { $0["user"]?.stringValue == user } ?? []
        #expect(mine.count == 1)
        #expect(try await fixture.store.records(provider: "demo", user: user).count == 1)
        if fixture.engine == .secretService {
            let stored = try secretToolSearch(provider: "demo", user: user)
            #expect(stored.components(separatedBy: "label = ").count - 1 == 1)
        }
        let token = try fixture.client().call(
            VaultMethod.getToken.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(token.parameters["token"]?.stringValue.map { Secret.mask($0) } == masked.first)
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should never write a token to vaultd's output")
    func tokenNeverLogged() throws {
        let fixture = try fixture()
        let user = uniqueName("secret")
        let secret = "sk_never_in_logs_93jf83hf93hf9"
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: secret).status == 0)
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", user]).stdout.contains(secret))
        // A rejected token (inner whitespace) is reported masked, never raw.
        let badSecret = "bad secret with spaces 1234567890"
        let bad = try fixture.client().call(
            VaultMethod.login.rawValue, ["provider": "demo", "user": "other", "token": .string(badSecret)])
        #expect(bad.error == "io.vaultd.Vault.InvalidCredential")
        #expect(bad.parameters["message"]?.stringValue?.contains(badSecret) == false)
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
        let daemon = try #require(fixture.daemon)
        daemon.stop()
        #expect(daemon.allOutput.contains("logged in"))
        #expect(!daemon.allOutput.contains(secret))
        #expect(!daemon.allOutput.contains(badSecret))
    }

    @Test("Should read an OAuth 2.0 token response from stdin")
    func oauthTokenResponse() throws {
        let fixture = try fixture()
        let user = uniqueName("sf")
        let response = """
            {"access_token":"00Dxx0000001gPL!AR8AQJXg5oj8jXSgxJfA0lBog","refresh_token":"5Aep861TSESvWeug_xvFHRBTTbf",\
            "instance_url":"https://example.my.salesforce.com","issued_at":"\(Int(Date().timeIntervalSince1970) * 1000)",\
            "expires_in":7200,"token_type":"Bearer","scope":"api refresh_token"}
            """
        let login = try expectSuccess(vaultctl(fixture.socketPath, ["--json", "login", "demo", user], input: response))
        let session = try JSON.parse(login.stdout)["session"]
        #expect(session?["hasRefreshToken"]?.boolValue == true)
        #expect(session?["instanceUrl"]?.stringValue == "https://example.my.salesforce.com")
        let expiresAt = try #require(session?["expiresAt"]?.integerValue)
        let now = Int64(Date().timeIntervalSince1970)
        #expect(abs(expiresAt - (now + 7200)) <= 5)
        let token = try vaultctl(fixture.socketPath, ["token", "demo", user])
        #expect(token.stdout == "00Dxx0000001gPL!AR8AQJXg5oj8jXSgxJfA0lBog\n")
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should refuse an expired token and a token valid for less than asked")
    func expiry() throws {
        let fixture = try fixture()
        let user = uniqueName("exp")
        let now = Int64(Date().timeIntervalSince1970)
        try expectFailure(
            vaultctl(
                fixture.socketPath, ["login", "demo", user, "--expires-at", String(now - 10)], input: DaemonTests.token),
            saying: "ERR_TOKEN_EXPIRED")
        let ok = try vaultctl(
            fixture.socketPath, ["login", "demo", user, "--expires-at", String(now + 600)], input: DaemonTests.token)
        #expect(ok.status == 0)
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", user, "--min-valid", "60"]).status == 0)
        try expectFailure(
            vaultctl(fixture.socketPath, ["token", "demo", user, "--min-valid", "3600"]), saying: "ERR_TOKEN_EXPIRED")
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    // Secret Service only: it writes a keyring item by hand (SQLiteEngineTests
    // has the SQLite form: a damaged row).
    @Test(
        "Should start past a stored item that is not a session record, naming it by its label, and keep the rest",
        .secretServiceOnly)
    func unreadableItemIsReported() throws {
        let fixture = try DaemonFixture(start: false)
        let good = uniqueName("good")
        let broken = uniqueName("broken")
        let record = storedSession("demo", good, tokens: TokenSet(accessToken: Secret(DaemonTests.token)))
        #expect(try storeRecordWithSecretTool(record, scope: fixture.scope).status == 0)
        try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/secret-tool"),
                [
                    "store", "--label=vaultd: \(broken) @ demo", "xdg:schema", "io.vaultd.Session", "provider", "demo",
                    "user", broken, "owner_uid", String(getuid()), "scope", fixture.scope,
                ], input: "not a record"))
        let daemon = try fixture.start()
        #expect(
            daemon.output.text.contains(
                #"a stored item could not be read as a session and is ignored item="vaultd: \#(broken) @ demo""#),
            "\(daemon.output.text)")
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", good]).stdout.hasPrefix(DaemonTests.token))
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", good]).status == 0)
        _ = try runCommand(
            URL(fileURLWithPath: "/usr/bin/secret-tool"), ["clear", "provider", "demo", "user", broken])
    }

    @Test("Should finish at start-up a logout that a crash interrupted")
    func halfLoggedOutRecordIsFinished() async throws {
        let fixture = try fixture(start: false)
        let user = uniqueName("half")
        var record = storedSession("demo", user, tokens: TokenSet(accessToken: Secret(DaemonTests.token)))
        record.phase = .loggingOut
        try await fixture.store.seed(record)
        #expect(try await fixture.store.holds(provider: "demo", user: user))
        let daemon = try fixture.start()
        #expect(daemon.output.text.contains("finished a logout that was interrupted"))
        #expect(try await fixture.store.holds(provider: "demo", user: user) == false)
        #expect(try vaultctl(fixture.socketPath, ["status", "demo", user]).status == 1)
    }
}
