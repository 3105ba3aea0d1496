import Testing
import Varlink
import VaultCore
import VaultDaemon

/// Client connection reports and the end events' code and message, in
/// process: a fake provider, a manual clock, the serving loop's side of the
/// connection registry called by hand.
@Suite("SessionManager: client reports and end events, in process", .timeLimit(.minutes(5)))
struct ConnectionReportTests {
    func caller(connection: UInt64) -> Caller {
        var caller = ManagerHarness.alice
        caller.connection = connection
        return caller
    }

    @Test("Should list a report, then drop it with clientGone when its connection closes")
    func reportThenClose() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.manager.reporting.opened(5)
        try await h.manager.setConnectionState(
            h.key("u"), state: .connected, client: "bot", caller: caller(connection: 5))
        #expect(h.manager.table.view(of: h.key("u"))?.clients.map(\.name) == ["bot"])
        let keys = try #require(h.manager.reporting.closed(5))
        await h.manager.clientGone(5, from: keys)
        #expect(h.manager.table.view(of: h.key("u"))?.clients.isEmpty == true)
        let changes = h.events.all.filter { $0.kind == .connectionChanged }
        #expect(changes.map(\.reason) == ["connected", "clientGone"])
        #expect(changes.allSatisfy { $0.source == .client && $0.client == "bot" })
    }

    @Test("Should keep no report whose connection closed before the manager got to it")
    func reportAfterClose() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.manager.reporting.opened(6)
        #expect(h.manager.reporting.closed(6) == [])
        try await h.manager.setConnectionState(
            h.key("u"), state: .connected, client: "late", caller: caller(connection: 6))
        #expect(h.manager.table.view(of: h.key("u"))?.clients.isEmpty == true)
        #expect(h.events.all.filter { $0.kind == .connectionChanged }.isEmpty)
        #expect(h.manager.reporting.count == 0)
    }

    @Test("Should refuse a report from another uid than the owner, and take root's")
    func ownerOrRoot() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        let bob = Caller(uid: 1001, gid: 1001, pid: 7, connection: 8)
        h.manager.reporting.opened(8)
        await #expect(throws: VaultError(.accessDenied, "")) {
            try await h.manager.setConnectionState(h.key("u"), state: .connected, client: "x", caller: bob)
        }
        let root = Caller(uid: 0, gid: 0, pid: 1, connection: 9)
        h.manager.reporting.opened(9)
        try await h.manager.setConnectionState(h.key("u"), state: .connecting, client: "root", caller: root)
        #expect(h.manager.table.view(of: h.key("u"))?.clients.map(\.name) == ["root"])
    }

    @Test("Should end the session with tokenInvalid carrying vaultd's code and the provider's code and message")
    func tokenInvalidCarriesCause() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.provider.state.withLock { $0.mode = .refused }
        var refused: VaultError?
        do throws(VaultError) { _ = try await h.manager.refresh(h.key("u"), caller: ManagerHarness.alice) } catch {
            refused = error
        }
        #expect(refused?.code == .grantRevoked)
        #expect(refused?.providerCode == "invalid_grant")
        await h.settle()
        let invalid = try #require(h.events.all.first { $0.kind == .tokenInvalid })
        // The same pair as the error: vaultd's code, the provider's code and words.
        #expect(invalid.code == "ERR_GRANT_REVOKED")
        #expect(invalid.providerCode == "invalid_grant")
        #expect(invalid.providerMessage == "refused (injected)")
        #expect(invalid.message == refused?.message)
    }
}
