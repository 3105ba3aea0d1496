import Synchronization
import Testing
import Varlink
import VaultCore

@testable import VaultDaemon

/// A session manager over a faulty in-memory store, a fake token endpoint and
/// a manual clock: no processes, no real time.
struct ManagerHarness {
    let clock = ManualClock()
    let store: FaultyStore
    let provider: FakeProvider
    let events = EventLog()
    let manager: SessionManager
    static let alice = Caller(uid: 1000, gid: 1000, pid: 42)

    init(store: FaultyStore = FaultyStore(), provider: FakeProvider = FakeProvider(), config: VaultConfig? = nil)
        throws
    {
        self.store = store
        self.provider = provider
        let events = self.events
        manager = SessionManager(
            store: store, config: try config ?? TestConfig.make(), clock: clock,
            log: Logger(level: .debug, target: .discard), policy: AccessPolicy(vaultdUID: 0),
            providers: { settings, _, _ in settings.type == .oauth2 ? provider : nil }, random: { 0.5 },
            events: { event in events.append(event) })
    }

    func key(_ user: String, owner: UInt32 = 1000) -> SessionKey {
        SessionKey(owner: owner, account: Account(provider: "oauth", user: user))
    }

    /// Logs `user` in for alice with a fresh grant living `lifetime` seconds.
    @discardableResult
    func login(_ user: String, lifetime: Int64 = 300) async throws(VaultError) -> SessionRecord {
        let (_, response) = provider.grant(lifetime: lifetime)
        let request = LoginRequest(provider: "oauth", user: user, tokenResponse: response)
        return try await manager.login(request, caller: Self.alice).0
    }

    func kinds(_ user: String) -> [EventKind] {
        events.all.filter { $0.account.user == user }.map(\.kind)
    }

    /// Moves the clock and does what is due, then lets background work settle.
    func advance(by seconds: Double) async {
        clock.advance(by: seconds)
        await manager.runDueWork()
        await settle()
    }

    /// Waits (bounded) until every background task is done.
    func settle() async {
        for _ in 0..<10_000 {
            if await manager.backgroundWork == 0 { return }
            await Task.yield()
        }
    }
}

/// The events a manager published, in order.
final class EventLog: Sendable {
    private let items = Mutex<[VaultEvent]>([])
    func append(_ event: VaultEvent) { items.withLock { $0.append(event) } }
    var all: [VaultEvent] { items.withLock { $0 } }
}

@Suite("SessionManager: store failures, in process", .timeLimit(.minutes(5)))
struct StoreFailureTests {
    @Test("Should keep refreshed tokens whose write failed in memory as unsaved, serve them, and write them later")
    func refreshWriteFails() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.store.failWrites(1)
        let refreshed = try await h.manager.refresh(h.key("u"), caller: ManagerHarness.alice)
        let view = try #require(h.manager.table.view(of: h.key("u")))
        #expect(view.refresh?.unsaved == true)
        #expect(view.record?.tokens == refreshed.tokens, "the new tokens are served")
        #expect(h.store.contents.records[h.key("u")]?.tokens != refreshed.tokens, "not yet in the store")
        // The retry comes 5 s later, on the clock.
        await h.advance(by: Double(SessionTimers.saveRetrySeconds))
        #expect(h.store.contents.records[h.key("u")]?.tokens == refreshed.tokens)
        #expect(h.manager.table.view(of: h.key("u"))?.refresh?.unsaved != true)
    }

    @Test("Should serve a session again, with logoutFailed, when the logout's store write fails")
    func logoutWriteFails() async throws {
        let h = try ManagerHarness()
        let record = try await h.login("u")
        h.store.failWrites(1)
        await #expect(throws: VaultError.self) {
            try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        }
        #expect(h.kinds("u") == [.loginSuccess, .logoutSuccess, .logoutFailed])
        #expect(h.manager.table.view(of: h.key("u"))?.record?.tokens == record.tokens, "served again")
        #expect(h.store.contents.records[h.key("u")]?.phase == .active)
        #expect(h.store.contents.pending.isEmpty, "no revocation of a session that goes on")
        // A later logout works.
        try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        #expect(h.store.contents.records.isEmpty)
    }

    @Test("Should refuse a login whose store write fails, leaving nothing behind")
    func loginWriteFails() async throws {
        let h = try ManagerHarness()
        h.store.failWrites(1)
        await #expect(throws: VaultError.self) { try await h.login("u") }
        #expect(h.kinds("u") == [.loginFailed])
        #expect(h.manager.table.view(of: h.key("u")) == nil)
        #expect(h.store.contents.records.isEmpty)
        try await h.login("u")
        #expect(h.manager.table.view(of: h.key("u"))?.state == .logged)
    }

    @Test("Should end shutdown's grace once the background work in flight ends, not at the grace's end")
    func graceEndsWithTheWork() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        // The revocation goes out; its removal from the store's queue is held:
        // background work in flight.
        h.store.holdRevocationDeletes()
        try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        await yieldUntil { h.store.heldRevocationDeletes == 1 }
        let manager = h.manager
        // An hour's grace on a clock nobody moves: only the work's end ends it early.
        let stop = Task { await manager.shutdown(graceSeconds: 3_600) }
        await yieldUntil { await manager.waitsOutTheGrace }
        #expect(await manager.waitsOutTheGrace)
        h.store.releaseRevocationDeletes()
        let workEnded = await yieldUntil(seconds: 10) { await manager.backgroundWork == 0 }
        let graceOver = await yieldUntil(seconds: 10) { await !manager.waitsOutTheGrace }
        let stopped = workEnded && graceOver
        #expect(stopped, "the grace went on after its work ended")
        if !stopped {
            // Bounded: the grace's end ends it.
            h.clock.advance(by: 3_600)
            await manager.runDueWork()
        }
        await stop.value
        #expect(h.store.contents.pending.isEmpty)
    }

    @Test("Should queue a revocation with the logout, before the first attempt, and finish it after a crash")
    func durableRevocation() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.provider.state.withLock { $0.revocationsFail = true }
        try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        await h.settle()
        #expect(h.store.contents.pending.count == 1, "queued before it was attempted")
        #expect(h.provider.state.withLock { $0.revokeCalls } >= 1)
        #expect(h.provider.state.withLock { $0.revokedGrants.isEmpty })
        // Crash: a new manager over what the store held, the endpoint healthy again.
        await h.manager.shutdown(graceSeconds: 0)
        h.provider.state.withLock { $0.revocationsFail = false }
        let next = try ManagerHarness(store: FaultyStore(h.store.contents), provider: h.provider)
        _ = try await next.manager.restore()
        await next.manager.resumePendingRevocations()
        await next.settle()
        #expect(h.provider.state.withLock { $0.revokedGrants } == [1])
        #expect(next.store.contents.pending.isEmpty, "it leaves the queue once the provider took it")
    }

    @Test("Should never revoke a session served again after a failed logout, even if its revocation stayed queued")
    func failedLogoutKeepsNoRevocation() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        // The mark and the queue entry are written; the delete and the removal of
        // the queue entry fail; the record is put back.
        h.store.failWrites(2, after: 2)
        await #expect(throws: VaultError.self) {
            try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        }
        #expect(h.store.contents.records[h.key("u")]?.phase == .active)
        #expect(h.store.contents.pending.count == 1, "the removal failed")
        // A crash now: the next start must drop it, not revoke the live session.
        let next = try ManagerHarness(store: FaultyStore(h.store.contents), provider: h.provider)
        _ = try await next.manager.restore()
        await next.manager.resumePendingRevocations()
        await next.settle()
        #expect(next.store.contents.pending.isEmpty)
        #expect(h.provider.state.withLock { $0.revokeCalls } == 0)
        // Without a crash, the next write of the record removes it.
        await h.advance(by: Double(SessionTimers.saveRetrySeconds))
        #expect(h.store.contents.pending.isEmpty)
        #expect(h.provider.state.withLock { $0.revokeCalls } == 0)
    }

    @Test("Should finish a logout cut short after its mark, queueing its revocation at the next start")
    func markedLogoutIsFinished() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        // The mark is written, then the store fails: the logout fails, the mark stays.
        h.store.failWrites(Int.max, after: 1)
        await #expect(throws: VaultError.self) {
            try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        }
        let marked = try #require(h.store.contents.records[h.key("u")])
        #expect(marked.phase == .loggingOut && marked.revocationID != nil)
        let next = try ManagerHarness(store: FaultyStore(h.store.contents), provider: h.provider)
        let restored = try await next.manager.restore()
        #expect(restored.finishedLogouts == 1)
        #expect(next.store.contents.records.isEmpty)
        #expect(next.store.contents.pending.keys.first == marked.revocationID)
        await next.manager.resumePendingRevocations()
        await next.settle()
        #expect(h.provider.state.withLock { $0.revokedGrants } == [1])
    }
}

@Suite("SessionManager: the timed lifecycle on a manual clock", .timeLimit(.minutes(5)))
struct TimedLifecycleTests {
    @Test("Should retry a failed refresh no sooner than its backoff, though it failed late in a second")
    func retryWaitsItsBackoff() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.clock.advance(by: 0.9)
        h.provider.state.withLock { $0.mode = .transient }
        let failedAt = h.clock.preciseNow()
        await #expect(throws: VaultError.self) {
            try await h.manager.refresh(h.key("u"), caller: ManagerHarness.alice)
        }
        // The first backoff is 1 s here (random 0.5); counted from the failure's
        // second rounded down, the retry would come 0.1 s later.
        let retryAt = try #require(h.manager.table.view(of: h.key("u"))?.refresh?.nextRetryAt)
        #expect(Double(retryAt.seconds) >= failedAt + 1, "failed at \(failedAt), retried at \(retryAt.seconds)")
    }

    @Test("Should refresh ahead of expiry on its own, once, and end a session whose refresh keeps failing past expiry")
    func refreshThenExpire() async throws {
        let h = try ManagerHarness()
        try await h.login("u", lifetime: 100)
        await h.advance(by: 95)
        #expect(h.provider.state.withLock { $0.refreshCalls } == 1)
        #expect(h.kinds("u").contains(.tokenRefreshed))
        h.provider.state.withLock { $0.mode = .transient }
        // 300 s tokens: the next refresh is due at 80-90%, then backs off until the token expires.
        for _ in 0..<40 { await h.advance(by: 15) }
        #expect(h.kinds("u").last == .tokenExpired, "\(h.kinds("u"))")
        #expect(h.manager.table.view(of: h.key("u")) == nil)
        #expect(h.store.contents.records.isEmpty)
    }

    @Test("Should spread the refreshes of 60 sessions overdue at a restart over the jitter window, not one second")
    func overdueAtRestartSpread() async throws {
        let h = try ManagerHarness()
        for index in 0..<60 { try await h.login("user\(index)", lifetime: 300) }
        // vaultd is stopped past every session's refresh point (80-90%), 24 s before expiry.
        let next = try ManagerHarness(store: FaultyStore(h.store.contents), provider: h.provider)
        next.clock.advance(by: 276)
        _ = try await next.manager.restore()
        var perSecond: [Int] = []
        var done = 0
        for _ in 0..<20 {
            await next.advance(by: 1)
            let calls = h.provider.state.withLock { $0.refreshCalls }
            perSecond.append(calls - done)
            done = calls
        }
        #expect(done == 60, "every overdue session refreshed within 20 s: \(perSecond)")
        // The window is half of the 24 s left: 12 s, so no second carries more than a fraction.
        #expect(perSecond.max() ?? 0 <= 15, "spread, not all at once: \(perSecond)")
        #expect(perSecond.filter { $0 > 0 }.count >= 8, "over most of the window: \(perSecond)")
        #expect(h.provider.state.withLock { $0.reusedGrants.isEmpty })
        #expect(next.events.all.allSatisfy { $0.kind != .tokenExpired })
    }

    @Test("Should share one refresh among concurrent GetToken calls")
    func singleFlight() async throws {
        let h = try ManagerHarness()
        try await h.login("u", lifetime: 100)
        let manager = h.manager
        let key = h.key("u")
        await withTaskGroup(of: Void.self) { group in
            for _ in 0..<20 {
                group.addTask {
                    _ = try? await manager.freshToken(key, minValidSeconds: 200, caller: ManagerHarness.alice)
                }
            }
        }
        #expect(h.provider.state.withLock { $0.refreshCalls } == 1)
        #expect(h.provider.state.withLock { $0.reusedGrants.isEmpty })
    }
}

@Suite("SessionManager: events follow what clients can read", .timeLimit(.minutes(5)))
struct EventOrderTests {
    /// What the table served at the moment each tokenRefreshed event went out.
    final class Observed: Sendable {
        let manager = Mutex<SessionManager?>(nil)
        let tokensAtEvent = Mutex<[String]>([])
    }

    @Test("Should serve the new token by the time tokenRefreshed reaches a subscriber")
    func tokenRefreshedAfterPublish() async throws {
        let observed = Observed()
        let provider = FakeProvider()
        let clock = ManualClock()
        let manager = SessionManager(
            store: FaultyStore(), config: try TestConfig.make(), clock: clock,
            log: Logger(level: .debug, target: .discard), policy: AccessPolicy(vaultdUID: 0),
            providers: { settings, _, _ in settings.type == .oauth2 ? provider : nil }, random: { 0.5 },
            events: { event in
                guard event.kind == .tokenRefreshed, let manager = observed.manager.withLock({ $0 }) else { return }
                let key = SessionKey(owner: event.ownerUID, account: event.account)
                let served = manager.table.view(of: key)?.record?.tokens.accessToken.revealed ?? "none"
                observed.tokensAtEvent.withLock { $0.append(served) }
            })
        observed.manager.withLock { $0 = manager }
        let (_, response) = provider.grant(lifetime: 300)
        let caller = ManagerHarness.alice
        _ = try await manager.login(LoginRequest(provider: "oauth", user: "u", tokenResponse: response), caller: caller)
        let key = SessionKey(owner: 1000, account: Account(provider: "oauth", user: "u"))
        var refreshedTokens: [String] = []
        for _ in 0..<3 {
            refreshedTokens.append(try await manager.refresh(key, caller: caller).tokens.accessToken.revealed)
        }
        #expect(observed.tokensAtEvent.withLock { $0 } == refreshedTokens)
    }
}

extension SessionManager {
    /// Shutdown's grace waits for background work to end.
    fileprivate var waitsOutTheGrace: Bool {
        waiters.values.contains { $0.purpose == .grace && $0.continuation != nil }
    }
}
