import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore
import VaultProtocol

/// A static provider cannot refresh: when the token's expiry passes, vaultd
/// ends the session itself, once, for every client.
@Suite("Expiry of static sessions", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ExpiryTests {
    @Test("Should end a session when its token expires and tell subscribers tokenExpired")
    func expiresOnSchedule() async throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("expiring")
        let (watcher, snapshot) = try subscription(fixture.socketPath, provider: "demo", user: user)
        #expect(snapshot?.parameters["sessions"] != nil)

        let expiresAt = Int64(Date().timeIntervalSince1970) + 2
        try expectSuccess(
            vaultctl(
                fixture.socketPath, ["login", "demo", user, "--expires-at", String(expiresAt)], input: DaemonTests.token
            ))
        #expect(try watcher.nextReply()?.parameters["event"]?["kind"]?.stringValue == "loginSuccess")

        // The next event comes when the daemon's timer fires: bounded by the socket's 10 s receive timeout.
        let expired = try #require(try watcher.nextReply()?.parameters["event"])
        #expect(expired["kind"]?.stringValue == "tokenExpired")
        #expect(expired["reason"]?.stringValue == "tokenExpired")
        #expect((expired["time"]?.integerValue ?? 0) >= expiresAt)

        let token = try vaultctl(fixture.socketPath, ["token", "demo", user])
        #expect(token.stderr.contains("ERR_NOT_LOGGED_IN"))
        // The event goes out when the logout starts, before the store's delete
        // has finished: wait for the item to be gone rather than assume the order.
        let left = try await eventually(
            tries: 200, interval: .milliseconds(50), { try await fixture.store.holds(provider: "demo", user: user) },
            until: { !$0 })
        #expect(left == false, "the session is still in the store")
        let daemon = try #require(fixture.daemon)
        #expect(daemon.output.wait(for: "action=Expire"))
    }

    @Test("Should end at start-up a stored session whose token expired while vaultd was down")
    func expiredWhileDown() async throws {
        let fixture = try DaemonFixture(start: false)
        let user = uniqueName("stale")
        let record = storedSession(
            "demo", user, tokens: TokenSet(accessToken: Secret(DaemonTests.token)),
            expiresAt: UnixTime(seconds: Int64(Date().timeIntervalSince1970) - 60))
        try await fixture.store.seed(record)
        let daemon = try fixture.start()
        #expect(daemon.output.wait(for: "event=tokenExpired"), "\(daemon.output.text)")
        #expect(try await fixture.store.holds(provider: "demo", user: user) == false)
        #expect(try vaultctl(fixture.socketPath, ["status", "demo", user]).stderr.contains("ERR_NOT_LOGGED_IN"))
    }
}
