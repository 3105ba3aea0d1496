import Synchronization
import VaultCore

/// The session store as the session manager uses it: every call passes
/// through here. While the store is available a call goes through, and a
/// failure that says the store as a whole is gone (`StoreUnavailable`) or
/// locked (`StoreLocked`) turns its `StoreHealth` over; while it is not
/// available, every call is refused at once with that error, without
/// touching D-Bus, until a probe finds the store back.
///
/// The health changes here, on whatever task made the failing call; what the
/// change asks for (report, probe, write through) is queued and the owner is
/// told through `onChange`, then takes the actions with `takeActions()`.
final class StoreGate: SessionStore {
    private struct State {
        var health: StoreHealth
        var actions: [StoreHealth.Action] = []
        var onChange: (@Sendable () -> Void)?
    }

    /// The store itself.
    let inner: any SessionStore
    private let clock: any WallClock
    private let state: Mutex<State>

    init(_ inner: any SessionStore, clock: any WallClock) {
        self.inner = inner
        self.clock = clock
        state = Mutex(State(health: StoreHealth(remedy: inner.profile.remedy)))
    }

    var profile: StoreProfile { inner.profile }

    /// The store's availability now.
    var health: StoreHealth { state.withLock { $0.health } }

    /// True while actions wait to be taken (the simulation waits for none).
    var hasPendingActions: Bool { state.withLock { !$0.actions.isEmpty } }

    /// Runs `body` whenever actions are queued.
    func onChange(_ body: @escaping @Sendable () -> Void) { state.withLock { $0.onChange = body } }

    /// The actions queued since the last call, in order.
    func takeActions() -> [StoreHealth.Action] {
        state.withLock { state in
            defer { state.actions = [] }
            return state.actions
        }
    }

    /// Feeds `event` to the health and queues what it returns; tells the
    /// owner when `notify`.
    private func record(_ event: StoreHealth.Event, notify: Bool = true) {
        let onChange = state.withLock { state -> (@Sendable () -> Void)? in
            let actions = state.health.handle(event)
            guard !actions.isEmpty else { return nil }
            state.actions += actions
            return notify ? state.onChange : nil
        }
        onChange?()
    }

    /// Probes the store (a new connection) and feeds the answer to the
    /// health; the caller takes the actions (`takeActions()`).
    func probeAndRecord(random: Double) async {
        let result = await inner.probe()
        record(.probed(result, now: clock.preciseNow(), random: random), notify: false)
    }

    /// Refused while the store is not available; a failure of the store as a
    /// whole is recorded.
    ///
    /// A call that finds the store gone while it was thought available gets
    /// one fresh connection and is made once more: a Secret Service restarted
    /// since the last call (gnome-keyring killed and started again) answers
    /// the old session with an error, and the new connection makes that
    /// invisible. Not after a timeout (LibsecretStore's message for one says
    /// "was abandoned"): the store hangs, and a second try would only wait as
    /// long again. Every write is idempotent (a record
    /// replaced, a delete of nothing), so the second try duplicates nothing.
    /// Not for a store whose client tried every way in already
    /// (`retriesOnFreshConnection` false, etcd: every endpoint within its
    /// timeout): the probe would wait as long again, and a lock's second
    /// try could find the first one's key.
    func pass<T: Sendable>(_ body: () async throws(VaultError) -> T) async throws(VaultError) -> T {
        if let refusal = state.withLock({ $0.health.refusal }) { throw refusal }
        do throws(VaultError) {
            return try await body()
        } catch {
            guard error.code == .storeUnavailable, inner.profile.retriesOnFreshConnection,
                !error.message.contains("was abandoned"),
                state.withLock({ $0.health.state == .available }), await inner.probe() == .available
            else {
                record(.failed(error.code, reason: error.message, now: clock.preciseNow()))
                throw error
            }
        }
        do throws(VaultError) {
            return try await body()
        } catch {
            record(.failed(error.code, reason: error.message, now: clock.preciseNow()))
            throw error
        }
    }

    func loadAll() async throws(VaultError) -> StoreContents {
        try await pass { () async throws(VaultError) in try await inner.loadAll() }
    }

    func apply(_ change: StoreChange) async throws(VaultError) {
        try await pass { () async throws(VaultError) in try await inner.apply(change) }
    }

    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try await pass { () async throws(VaultError) in try await inner.loadProviderSecret(provider) }
    }

    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await pass { () async throws(VaultError) in try await inner.loadPendingRevocations() }
    }

    func probe() async -> StoreProbe { await inner.probe() }
}

extension SessionManager {
    // MARK: The secret store's availability

    /// The store's availability as clients see it (`store` in ListSessions and Subscribe).
    public nonisolated var storeState: StoreState { gate.health.state }

    /// True while a change of the store's availability waits to be acted on.
    public nonisolated var storeChangePending: Bool { gate.hasPendingActions }

    /// Takes the actions the store's health queued and performs them, in
    /// one step: the write-through the store's return asks for runs as
    /// background work, one at a time.
    func storeHealthChanged() {
        let actions = gate.takeActions()
        // Stopping: nothing more is reported, probed or written through.
        guard !stopping else { return }
        for action in actions {
            switch action {
            case .report(let state, let reason):
                reportStore(state, reason: reason)
            case .probe(let at):
                scheduleProbe(at: at)
            case .writeThrough:
                // The store is back: make it hold what vaultd serves.
                writeThrough()
            }
        }
    }

    /// Starts the write-through, or, while one runs, has another follow it.
    private func writeThrough() {
        guard writingThrough == nil else {
            writeThroughAgain = true
            return
        }
        writingThrough = spawn { await self.performWriteThrough() }
    }

    private func performWriteThrough() async {
        await sharing.writeThrough(self)
        writingThrough = nil
        if writeThroughAgain {
            writeThroughAgain = false
            writeThrough()
        }
    }

    /// Logs the new state, tells the owner (STATUS=) and every live session's
    /// subscribers (`storeChanged`, reason the state).
    func reportStore(_ state: StoreState, reason: String?) {
        var logFields = ["event": "storeChanged", "store": state.rawValue, "sessions": String(table.count)]
        logFields["reason"] = reason
        switch state {
        case .available:
            log.notice("the secret store is available again", logFields)
        case .unavailable:
            log.warning(
                "the secret store is unavailable; tokens are served from memory, changes are refused, and vaultd reconnects with backoff",
                logFields)
        case .locked:
            log.warning(
                "the secret store's collection is locked; tokens are served from memory, changes are refused until it is unlocked",
                logFields)
        }
        storeDidChange(state)
        let code: VaultError.Code? =
            switch state {
            case .available: nil
            case .unavailable: .storeUnavailable
            case .locked: .storeLocked
            }
        for key in entries.keys.sorted() where entries[key]?.record != nil {
            emit(.storeChanged, key, reason: state.rawValue, code: code)
        }
    }

    /// Probes the store at `at` (replacing a probe scheduled before): a
    /// deadline of the manager's alarm (`runDueWork`).
    func scheduleProbe(at: Double) {
        probeAt = at
        rearmTimer()
    }

    /// One probe: a new connection to the store and a look at its collection.
    func probeStore() async {
        await gate.probeAndRecord(random: random())
        storeHealthChanged()
    }
}
