import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// A revocation at logout that the provider has not acknowledged when vaultd
/// stops (SIGTERM or SIGKILL) waits in the store and is finished by the next
/// start: real vaultd, real token server, on each engine (the private
/// keyring, or SQLite) in every run.
@Suite("Revocation across restarts", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct RevocationTests {
    /// A fixture whose one provider, `oauth`, revokes at `server`'s /revoke.
    func start(_ server: TokenServer, engine: StoreEngine) throws -> (DaemonFixture, RunningDaemon) {
        let fixture = try DaemonFixture(config: server.providerSection(revocation: true), engine: engine)
        return (fixture, fixture.daemon!)
    }

    /// Every item of one account in the keyring, whatever its schema (a
    /// session, a session being logged out, a queued revocation): their
    /// labels and attributes, never their secrets.
    func storedItems(user: String) throws -> [String] {
        let search = try runCommand(
            URL(fileURLWithPath: "/usr/bin/secret-tool"), ["search", "--all", "provider", "oauth", "user", user])
        let lines = (search.stdout + search.stderr).split(separator: "\n").map(String.init)
        return lines.filter { $0.hasPrefix("label =") || $0.hasPrefix("attribute.") }
    }

    /// The number of items among `storedItems`.
    func itemCount(_ items: [String]) -> Int { items.filter { $0.hasPrefix("label =") }.count }

    /// What the store holds of one account, whatever its kind (a session, a
    /// session being logged out, a queued revocation): how many, and a
    /// description without secrets.
    func stored(_ fixture: DaemonFixture, user: String) async throws -> (count: Int, text: String) {
        switch fixture.engine {
        case .secretService:
            let items = try storedItems(user: user)
            return (itemCount(items), "\(items)")
        case .sqlite:
            let sessions = try await fixture.store.records(provider: "oauth", user: user)
            let revocations = try await fixture.store.queuedRevocations(user: user)
            return (
                sessions.count + revocations,
                "sessions \(sessions.map(\.phase)), queued revocations \(revocations)"
            )
        case .etcd: throw HarnessError("the etcd suites read etcd with EtcdStore, not through StoreReader")
        }
    }

    /// Logs in, logs out while the revocation endpoint hangs, stops vaultd with
    /// `signal` while the first attempt is out, and restarts it with the
    /// endpoint healthy: the provider must receive the revocation.
    func revocationSurvives(_ signal: Int32, engine: StoreEngine) async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, daemon) = try start(server, engine: engine)
        let user = uniqueName(signal == SIGKILL ? "revkill" : "revterm")
        let grant = try await server.grant()
        let tokens = try JSON.parse(grant)
        let refreshToken = try #require(tokens["refresh_token"]?.stringValue, "the grant has a refresh token")
        let accessToken = try #require(tokens["access_token"]?.stringValue)
        let login = try vaultctl(fixture.socketPath, ["login", "oauth", user], input: grant)
        try #require(login.status == 0, "\(login.stderr)")
        let loggedIn = try await stored(fixture, user: user)
        try #require(loggedIn.count == 1, "the search finds the session's item: \(loggedIn.text)")

        // Every revocation request hangs, far longer than the test.
        try await server.post(
            "/control/mode", json: ["mode": "hang", "target": "revoke", "hang_seconds": 300])
        let started = Date()
        let logout = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
        let took = Date().timeIntervalSince(started)
        #expect(logout.status == 0, "a hanging revocation does not fail the logout: \(logout.stderr)")
        #expect(took < 10, "a hanging revocation does not block the logout: it took \(took) s")

        // The first attempt has reached the server, which holds it unanswered.
        let out = try await eventually(
            tries: 250, { try await server.stats() }, until: { ($0["revoke_requests"]?.integerValue ?? 0) >= 1 })
        try #require(out["revoke_requests"]?.integerValue ?? 0 >= 1, "the revocation went out: \(out)")
        #expect(out["revocations"]?.arrayValue?.isEmpty == true, "none completed: \(out)")

        let stopping = Date()
        let status = daemon.stop(signal: signal)
        let stopTook = Date().timeIntervalSince(stopping)
        if signal == SIGKILL {
            // Foundation reports the signal itself; a waitpid of the harness, 128 + the signal.
            #expect(status == SIGKILL || status == 128 + SIGKILL, "vaultd was killed: \(status)")
        } else {
            #expect(status == 0, "vaultd stops by itself on SIGTERM: status \(status) after \(stopTook) s")
            #expect(stopTook < 20, "vaultd drains within its deadline: \(stopTook) s")
        }

        // While vaultd is down, what the provider has not acknowledged waits in the store.
        let whileDown = try await stored(fixture, user: user)
        #expect(
            whileDown.count >= 1,
            "the unacknowledged revocation is queued in the store while vaultd is down: \(whileDown.text)")

        try await server.post("/control/mode", json: ["mode": "normal"])
        let restarted = try fixture.start()
        let prefix = String(refreshToken.prefix(6))
        let revoked = try await eventually(
            tries: 150, interval: .milliseconds(200), { try await server.revocations() },
            until: { list in list.contains { $0["token"]?.stringValue == prefix } })
        let stats = try await server.stats().text
        let log = String(restarted.allOutput.suffix(3000))
        #expect(
            revoked.contains { $0["token"]?.stringValue == prefix && $0["kind"]?.stringValue == "refresh_token" },
            "the restarted vaultd revoked the session's refresh token: \(stats)\nvaultd after the restart:\n\(log)")
        #expect(try await server.accepts(accessToken) == false, "the session's grant is revoked at the provider")

        // Once the provider took it, nothing of the session stays in the store.
        let left = try await eventually(
            tries: 50, interval: .milliseconds(200), { try await stored(fixture, user: user) },
            until: { $0.count == 0 })
        #expect(left.count == 0, "nothing of the session is left in the store: \(left.text)")
        #expect(try await fixture.store.holds(provider: "oauth", user: user) == false)
    }

    @Test("Should send within SIGTERM's drain the revocations queued just before it, one per pacing interval")
    func queuedRevocationsSentAtStop() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let (fixture, daemon) = try start(server, engine: .sqlite)
        var prefixes: [String] = []
        let users = (0..<3).map { uniqueName("revstop\($0)") }
        for user in users {
            let grant = try await server.grant()
            let refreshToken = try #require(try JSON.parse(grant)["refresh_token"]?.stringValue)
            prefixes.append(String(refreshToken.prefix(6)))
            let login = try vaultctl(fixture.socketPath, ["login", "oauth", user], input: grant)
            try #require(login.status == 0, "\(login.stderr)")
        }
        // Back to back: the queue sends one revocation every RevocationQueue.spacingSeconds,
        // so the later ones are due after SIGTERM.
        for user in users { #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0) }
        #expect(daemon.stop() == 0)
        let sent = Set(try await server.revocations().compactMap { $0["token"]?.stringValue })
        #expect(Set(prefixes).isSubset(of: sent), "every logout's revocation went out before vaultd exited: \(sent)")
    }

    @Test(
        "Should finish at the next start a revocation still hanging at the provider when vaultd got SIGTERM",
        arguments: TestStore.crashEngines)
    func revocationSurvivesSIGTERM(engine: StoreEngine) async throws {
        try await revocationSurvives(SIGTERM, engine: engine)
    }

    @Test(
        "Should finish at the next start a revocation still hanging at the provider when vaultd got SIGKILL",
        arguments: TestStore.crashEngines)
    func revocationSurvivesSIGKILL(engine: StoreEngine) async throws {
        try await revocationSurvives(SIGKILL, engine: engine)
    }
}
