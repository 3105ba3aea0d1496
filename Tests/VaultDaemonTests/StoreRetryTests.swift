import Synchronization
import Testing
import Varlink
import VaultCore
import VaultDaemon

/// An in-memory store whose next writes fail as if the store were gone
/// (`StoreUnavailable`) while its probe answers that it is there: a Secret
/// Service restarted under a stale D-Bus connection, or an etcd call that
/// tried every endpoint and found none.
final class FlakyStore: SessionStore, Sendable {
    private let inner = MemoryStore()
    private let state = Mutex((failing: 0, writes: 0))
    let profile: StoreProfile

    init(retriesOnFreshConnection: Bool) {
        profile = StoreProfile(location: "flaky store (tests)", retriesOnFreshConnection: retriesOnFreshConnection)
    }

    /// The next `count` writes fail with `StoreUnavailable`.
    func failNext(_ count: Int) { state.withLock { $0.failing = count } }
    /// Writes that reached the store, failed or not.
    var writes: Int { state.withLock { $0.writes } }

    private func write() throws(VaultError) {
        let fails = state.withLock { state -> Bool in
            state.writes += 1
            guard state.failing > 0 else { return false }
            state.failing -= 1
            return true
        }
        if fails { throw VaultError(.storeUnavailable, "the store could not be reached (injected)") }
    }

    func loadAll() async throws(VaultError) -> StoreContents { try await inner.loadAll() }
    /// A record's save or delete may fail; the rest always reach the store.
    func apply(_ change: StoreChange) async throws(VaultError) {
        switch change {
        case .save, .delete: try write()
        case .saveProviderSecret, .savePendingRevocation, .deletePendingRevocation: break
        }
        try await inner.apply(change)
    }
    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try await inner.loadProviderSecret(provider)
    }
    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await inner.loadPendingRevocations()
    }
}

@Suite("The store gate's second try on a fresh connection", .timeLimit(.minutes(5)))
struct StoreRetryTests {
    func manager(_ store: FlakyStore) throws -> SessionManager {
        SessionManager(
            store: store, config: try TestConfig.make(), clock: ManualClock(),
            log: Logger(level: .error, target: .discard), random: { 0.5 }, events: { _ in })
    }

    func login(_ manager: SessionManager) async throws(VaultError) {
        _ = try await manager.login(
            LoginRequest(provider: "demo", user: "alice", token: "tok_alice_0123456789"),
            caller: Caller(uid: 1000, gid: 1000, pid: 7))
    }

    /// Should make a write that found the store gone once more when the
    /// probe finds it there (the Secret Service's stale connection).
    @Test func retriedWhereTheStoreAsksForIt() async throws {
        let store = FlakyStore(retriesOnFreshConnection: true)
        let manager = try manager(store)
        store.failNext(1)
        try await login(manager)
        #expect(store.writes == 2)
        #expect(manager.storeState == .available)
    }

    /// Should refuse at once, with one write only, on a store whose client
    /// tried every way in already (etcd): no probe and second try that would
    /// take as long again.
    @Test func notRetriedWhereTheClientTriedEveryWayIn() async throws {
        let store = FlakyStore(retriesOnFreshConnection: false)
        let manager = try manager(store)
        store.failNext(1)
        await #expect(throws: VaultError(.storeUnavailable, "")) { try await login(manager) }
        #expect(store.writes == 1, "the gate tried \(store.writes) times")
    }
}
