import Foundation
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultDaemon
import VaultProtocol

/// The in-memory store (`vaultd --memory-store`): what it keeps, that vaultd
/// runs on it with no D-Bus at all, and that nothing outlives the process.
@Suite("In-memory store", .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct MemoryStoreTests {
    static let token = "tok_memory_4j8d2k6m1q9w3e7r5t0y"
    static let warning = "will not survive a restart; this mode is meant for benchmarks and tests"

    /// A record of `user` at `provider` holding `token`.
    static func record(_ provider: String, _ user: String, token: String) -> SessionRecord {
        SessionRecord(
            account: Account(provider: provider, user: user), user: UserProfile(uid: user),
            tokens: TokenSet(accessToken: Secret(token)), createdAt: UnixTime(seconds: 1_700_000_000),
            expiresAt: nil, ownerUID: 1000)
    }

    /// vaultd with `--memory-store` on `socketPath`, with neither a session bus
    /// address nor a runtime directory where a default bus could be found.
    static func startWithoutDBus(socketPath: String, configPath: String, runtime: String) throws -> RunningDaemon {
        try RunningDaemon(
            socketPath: socketPath, configPath: configPath, environment: ["XDG_RUNTIME_DIR": runtime],
            extraArguments: ["--memory-store"], unsetEnvironment: ["DBUS_SESSION_BUS_ADDRESS", "DISPLAY"])
    }

    @Test("Should keep, replace and delete records, client secrets and queued revocations")
    func storeRoundTrip() async throws {
        let store = MemoryStore()
        #expect(store.profile.location == "memory (sessions are lost when vaultd stops)")
        #expect(try await store.loadAll().records.isEmpty)

        try await store.apply(.save(Self.record("demo", "bob", token: "first")))
        try await store.apply(.save(Self.record("demo", "alice", token: "a")))
        try await store.apply(.save(Self.record("demo", "bob", token: "second")))
        let loaded = try await store.loadAll()
        #expect(loaded.records.map(\.account.user) == ["alice", "bob"])
        #expect(loaded.records.last?.tokens.accessToken.revealed == "second")
        #expect(loaded.unreadable.isEmpty)

        var otherOwners = Self.record("demo", "alice", token: "b")
        otherOwners.ownerUID = 1001
        try await store.apply(.save(otherOwners))
        try await store.apply(.delete(SessionKey(owner: 1000, account: Account(provider: "demo", user: "bob"))))
        try await store.apply(.delete(SessionKey(owner: 1000, account: Account(provider: "demo", user: "nobody"))))
        try await store.apply(.delete(SessionKey(owner: 1001, account: Account(provider: "demo", user: "alice"))))
        #expect(try await store.loadAll().records.map(\.account.user) == ["alice"])

        #expect(try await store.loadProviderSecret("oauth") == nil)
        try await store.apply(.saveProviderSecret("oauth", Secret("client-secret")))
        #expect(try await store.loadProviderSecret("oauth")?.revealed == "client-secret")

        // Two revocations of one account are both kept, and removed one at a time.
        let first = PendingRevocation(queueing: Self.record("oauth", "carol", token: "c1"))
        let second = PendingRevocation(queueing: Self.record("oauth", "carol", token: "c2"))
        #expect(first.id != second.id)
        try await store.apply(.savePendingRevocation(first))
        try await store.apply(.savePendingRevocation(second))
        #expect(Set(try await store.loadPendingRevocations().map(\.id)) == [first.id, second.id])
        try await store.apply(.deletePendingRevocation(first))
        #expect(try await store.loadPendingRevocations() == [second])
        try await store.apply(.deletePendingRevocation(second))
        #expect(try await store.loadPendingRevocations().isEmpty)
        #expect(try await store.loadAll().records.count == 1, "revocations are kept apart from sessions")
    }

    @Test("Should serve sessions with no D-Bus at all, warn at start-up, and forget them at a restart")
    func memoryOnlyDaemon() throws {
        let fixture = try DaemonFixture(start: false)
        let runtime = fixture.directory.path("runtime")
        let user = uniqueName("mem")
        var daemon = try Self.startWithoutDBus(
            socketPath: fixture.socketPath, configPath: fixture.configPath, runtime: runtime)
        let warnings = daemon.output.text.split(separator: "\n").filter { $0.contains("warning:") }
        #expect(warnings.contains { $0.contains("--memory-store") && $0.contains(Self.warning) }, "\(warnings)")
        #expect(daemon.output.text.contains("store=\"memory (sessions are lost when vaultd stops)\""))

        let client = try fixture.client()
        let login = try client.call(
            VaultMethod.login.rawValue, ["provider": "demo", "user": .string(user), "token": .string(Self.token)])
        #expect(login.error == nil, "\(login.parameters)")
        #expect(login.parameters["created"] == .bool(true))
        let token = try client.call(VaultMethod.getToken.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(token.error == nil, "\(token.parameters)")
        #expect(token.parameters["token"]?.stringValue == Self.token)

        #expect(daemon.stop() == 0)
        daemon = try Self.startWithoutDBus(
            socketPath: fixture.socketPath, configPath: fixture.configPath, runtime: runtime)
        #expect(daemon.output.text.contains("sessions=0"), "\(daemon.output.text)")
        let after = try fixture.client().call(
            VaultMethod.getToken.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(after.parameters["code"]?.stringValue == "ERR_NOT_LOGGED_IN", "\(after.parameters)")
        #expect(daemon.stop() == 0)
    }

    @Test("Should show when an oauth2 session's refresh is due right after its login")
    func refreshAtAfterLogin() throws {
        let fixture = try DaemonFixture(start: false)
        // Port 9 (discard) on loopback: nothing answers, and no refresh falls due during the test.
        try fixture.configure(
            "[Provider oauth]\nType=oauth2\nTokenURL=http://127.0.0.1:9/token\nClientID=vaultd-test\n")
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath, extraArguments: ["--memory-store"])
        defer { daemon.stop() }
        let user = uniqueName("sched")
        let lifetime: Int64 = 86_400
        let before = Int64(Date().timeIntervalSince1970)
        let response: JSON = [
            "access_token": .string(Self.token), "refresh_token": "refresh_memory_0123456789",
            "token_type": "Bearer", "expires_in": .int(lifetime),
        ]
        let login = try fixture.client().call(
            VaultMethod.login.rawValue, ["provider": "oauth", "user": .string(user), "tokenResponse": response])
        #expect(login.error == nil, "\(login.parameters)")
        let reply = try fixture.client().call(
            VaultMethod.getSession.rawValue, ["provider": "oauth", "user": .string(user)])
        let session = try #require(reply.parameters["session"])
        #expect(session["hasRefreshToken"] == .bool(true))
        let refreshAt = try #require(session["refreshAt"]?.integerValue, "\(session)")
        // 80-90% of the lifetime after the login.
        #expect(refreshAt >= before + lifetime * 8 / 10)
        #expect(refreshAt <= Int64(Date().timeIntervalSince1970) + lifetime * 9 / 10)
    }
}
