import Synchronization
import VaultCore
import VaultDaemon

/// A store shared by several hosts, in memory, as etcd behaves for vaultd:
/// one revision for the whole store, conditional writes, refresh locks under
/// leases that end on the `ManualClock`, tombstones beside deletes, and one
/// change feed per host whose deliveries come a seeded delay after the
/// write. A host can be cut off (partition: every call fails, its feed stops)
/// and come back with its feed resumed (the changes it missed, in order) or
/// compacted (a `reset`). A write may land with its answer lost
/// (`loseAnswers(oneIn:)`), as when an etcd member dies between committing
/// a write and answering it. The simulation takes due changes with
/// `due(for:)` and gives them to the host's manager itself, so that a seed
/// names one schedule.
final class SimulatedSharedStore: Sendable {
    struct Lock: Sendable {
        var host: String
        var lease: RefreshLease
    }
    struct Delivery: Sendable {
        var change: SharedChange
        var at: Double
    }
    struct State {
        var records: [SessionKey: SharedRecord] = [:]
        var endings: [SessionKey: SessionEnding] = [:]
        var revision: StoreRevision = 0
        var locks: [SessionKey: Lock] = [:]
        var nextLease: UInt64 = 0
        var partitioned: Set<String> = []
        /// The feeds of hosts connected now.
        var feeds: [String: [Delivery]] = [:]
        /// What a cut-off host's feed missed.
        var missed: [String: [SharedChange]] = [:]
        var rng: SplitMix64
        var pending: [String: PendingRevocation] = [:]
        var secrets: [String: Secret] = [:]
        /// Every access token a record ever held here: no host may hand out another.
        var everStored: Set<String> = []
        /// One write in `oneIn` that lands has its answer lost; nil: none.
        var answerLoss: (oneIn: UInt64, rng: SplitMix64)?
    }

    let clock: ManualClock
    let lockTTLSeconds: Double
    /// The longest a change takes to reach a host's feed.
    let maxDelaySeconds: Double
    let state: Mutex<State>

    init(clock: ManualClock, seed: UInt64, lockTTLSeconds: Double = 10, maxDelaySeconds: Double = 2) {
        self.clock = clock
        self.lockTTLSeconds = lockTTLSeconds
        self.maxDelaySeconds = maxDelaySeconds
        state = Mutex(State(rng: SplitMix64(state: seed ^ 0x5EED)))
    }

    /// From now on one write in `oneIn` that lands (a put, a delete, a
    /// conditional write, a lock granted) loses its answer, on a schedule
    /// of its own seeded with `seed`: the caller is told the store could not
    /// be reached, or (a conditional write) gets the answer of the write
    /// sent again, as the etcd client sends it to the next member, where its
    /// comparison fails on the write itself.
    func loseAnswers(oneIn: UInt64, seed: UInt64) {
        state.withLock { $0.answerLoss = (oneIn, SplitMix64(state: seed)) }
    }

    /// Whether the answer of the write that just landed is lost, and (when
    /// it is) whether the write is sent again.
    fileprivate func answerLost(_ state: inout State) -> (lost: Bool, sentAgain: Bool) {
        guard var loss = state.answerLoss else { return (false, false) }
        defer { state.answerLoss = loss }
        guard loss.rng.next() % loss.oneIn == 0 else { return (false, false) }
        return (true, loss.rng.next() % 2 == 0)
    }

    /// The store as `host` reaches it, while `alive` says the host's process lives.
    func view(host: String, alive: Liveness) -> HostView { HostView(store: self, host: host, alive: alive) }

    /// `host` gets a new feed (a process that starts watches from now on).
    func connect(_ host: String) {
        state.withLock {
            $0.feeds[host] = []
            $0.missed[host] = nil
        }
    }

    /// `host` can no longer reach the store: its calls fail, its feed stops.
    func partition(_ host: String) {
        state.withLock {
            $0.partitioned.insert(host)
            // A resumed watch starts after the last revision the host received.
            $0.missed[host] = ($0.feeds[host] ?? []).map(\.change)
            $0.feeds[host] = nil
        }
    }

    /// `host` reaches the store again; its feed resumes with what it missed,
    /// or (`compacted`) says `reset`.
    func heal(_ host: String, compacted: Bool) {
        state.withLock { state in
            state.partitioned.remove(host)
            let missed = state.missed.removeValue(forKey: host) ?? []
            let now = clock.preciseNow()
            state.feeds[host] = (compacted ? [.reset] : missed).map { Delivery(change: $0, at: now) }
        }
    }

    /// True when some record of the store held `token` at some revision.
    func wasStored(_ token: String) -> Bool { state.withLock { $0.everStored.contains(token) } }

    func isPartitioned(_ host: String) -> Bool { state.withLock { $0.partitioned.contains(host) } }

    /// The changes of `host`'s feed due by the clock's now, in order.
    func due(for host: String) -> [SharedChange] {
        let now = clock.preciseNow()
        return state.withLock { state in
            guard let feed = state.feeds[host] else { return [] }
            let count = feed.prefix { $0.at <= now }.count
            state.feeds[host] = Array(feed.dropFirst(count))
            return feed.prefix(count).map(\.change)
        }
    }

    /// When the last change now in a feed is due; nil when every feed is empty.
    var lastDelivery: Double? { state.withLock { $0.feeds.values.compactMap { $0.last?.at }.max() } }

    /// What the store holds (active records and logouts' marks).
    var records: [SessionKey: SharedRecord] { state.withLock { $0.records } }
    var pending: [String: PendingRevocation] { state.withLock { $0.pending } }

    /// The host holding `key`'s lock now (a lease past its end holds nothing).
    func holder(of key: SessionKey) -> String? {
        let now = clock.preciseNow()
        return state.withLock { state in state.locks[key].flatMap { $0.lease.expiresAt > now ? $0.host : nil } }
    }

    /// Records `change` at a new revision and queues it on every feed.
    fileprivate func commit(_ state: inout State, _ change: (inout State, StoreRevision) -> SharedChange) {
        state.revision += 1
        let made = change(&state, state.revision)
        if case .put(let record, _) = made { state.everStored.insert(record.tokens.accessToken.revealed) }
        announce(&state, made)
    }

    /// Queues `made` on every feed, each after a seeded delay (etcd: a
    /// lock's key deleted, which changes no session, is announced too).
    fileprivate func announce(_ state: inout State, _ made: SharedChange) {
        let now = clock.preciseNow()
        for host in state.feeds.keys.sorted() {
            let delay = Double(state.rng.next() % 1000) / 1000 * maxDelaySeconds
            let at = max(state.feeds[host]?.last?.at ?? now, now + delay)
            state.feeds[host]?.append(Delivery(change: made, at: at))
        }
        for host in state.missed.keys { state.missed[host]?.append(made) }
    }
}

/// One host's connection to a `SimulatedSharedStore`.
final class HostView: SharedSessionStore, Sendable {
    let store: SimulatedSharedStore
    let host: String
    let alive: Liveness
    var profile: StoreProfile { StoreProfile(location: "simulated shared store (host \(host))") }

    init(store: SimulatedSharedStore, host: String, alive: Liveness) {
        self.store = store
        self.host = host
        self.alive = alive
    }

    /// Runs `body` on the store's state when this host reaches it: not cut
    /// off, and its process alive (a dead one's late work reaches nothing).
    private func reach<T>(_ what: String, _ body: (inout SimulatedSharedStore.State) -> T) throws(VaultError) -> T {
        let reached = store.state.withLock { state -> T? in
            guard alive.isAlive, !state.partitioned.contains(host) else { return nil }
            return body(&state)
        }
        guard let reached else {
            throw VaultError(.storeUnavailable, "\(what): host \(host) cannot reach the shared store (injected)")
        }
        return reached
    }

    func probe() async -> StoreProbe {
        alive.isAlive && !store.isPartitioned(host) ? .available : .unavailable("partitioned (injected)")
    }

    func loadAll() async throws(VaultError) -> StoreContents {
        try reach("reading sessions") { state in
            StoreContents(records: state.records.values.map(\.record).sorted { $0.key < $1.key }, unreadable: [])
        }
    }

    func loadShared(_ key: SessionKey?) async throws(VaultError) -> SharedContents {
        guard let key else {
            return try reach("reading sessions") { state in
                SharedContents(
                    records: state.records.values.sorted { $0.record.key < $1.record.key }, endings: state.endings,
                    revision: state.revision)
            }
        }
        return try reach("reading \(key)") { state in
            SharedContents(records: state.records[key].map { [$0] } ?? [], endings: [:], revision: state.revision)
        }
    }

    func apply(_ change: StoreChange) async throws(VaultError) {
        switch change {
        case .save(let record): _ = try await save(record, ifRevision: nil)
        case .delete(let key):
            try reach(change.summary) { state in
                guard state.records[key] != nil else { return }
                store.commit(&state) { state, revision in
                    state.records[key] = nil
                    return .deleted(key, ending: nil, revision: revision)
                }
            }
        case .saveProviderSecret(let provider, let secret):
            try reach(change.summary) { $0.secrets[provider] = secret }
        case .savePendingRevocation(let revocation):
            try reach(change.summary) { $0.pending[revocation.id] = revocation }
        case .deletePendingRevocation(let revocation):
            try reach(change.summary) { $0.pending[revocation.id] = nil }
        }
    }

    /// What a caller whose write landed, and whose answer was lost, is told.
    private static func answerLost(_ what: String) -> VaultError {
        VaultError(.storeUnavailable, "\(what): the write landed and its answer was lost (injected)")
    }

    func save(_ record: SessionRecord, ifRevision: StoreRevision?) async throws(VaultError) -> ConditionalSave {
        let (answer, loss) = try reach("writing \(record.key)") { state -> (ConditionalSave, (Bool, Bool)) in
            let current = state.records[record.key]
            if let ifRevision, (current?.revision ?? 0) != ifRevision {
                return (
                    .conflict(current: current?.record, revision: current?.revision ?? state.revision), (false, false)
                )
            }
            store.commit(&state) { state, revision in
                state.records[record.key] = SharedRecord(record, revision: revision)
                state.endings[record.key] = nil
                return .put(record, revision: revision)
            }
            return (.saved(revision: state.revision), store.answerLost(&state))
        }
        guard loss.0 else { return answer }
        // A conditional write sent again: its comparison fails on the write
        // that landed (or on whatever another host wrote since).
        guard loss.1, ifRevision != nil else { throw Self.answerLost("writing \(record.key)") }
        return try await save(record, ifRevision: ifRevision)
    }

    func delete(_ key: SessionKey, ending: SessionEnding) async throws(VaultError) -> StoreRevision {
        let (revision, loss) = try reach("deleting \(key)") { state in
            store.commit(&state) { state, revision in
                state.records[key] = nil
                state.endings[key] = ending
                return .deleted(key, ending: ending, revision: revision)
            }
            return (state.revision, store.answerLost(&state))
        }
        if loss.lost { throw Self.answerLost("deleting \(key)") }
        return revision
    }

    func acquireRefreshLock(_ key: SessionKey) async throws(VaultError) -> RefreshLockAnswer {
        let now = store.clock.preciseNow()
        let (answer, loss) = try reach("locking \(key)") {
            state -> (RefreshLockAnswer, (lost: Bool, sentAgain: Bool)) in
            if let lock = state.locks[key], lock.lease.expiresAt > now {
                return (.heldBy(host: lock.host, expiresAt: lock.lease.expiresAt), (false, false))
            }
            state.nextLease += 1
            let lease = RefreshLease(id: state.nextLease, expiresAt: now + store.lockTTLSeconds)
            state.locks[key] = SimulatedSharedStore.Lock(host: host, lease: lease)
            return (.granted(lease), store.answerLost(&state))
        }
        // The lock stays taken until its lease ends.
        if loss.lost { throw Self.answerLost("locking \(key)") }
        return answer
    }

    func releaseRefreshLock(_ key: SessionKey, lease: RefreshLease) async throws(VaultError) {
        try reach("unlocking \(key)") { state in
            guard state.locks[key]?.lease.id == lease.id else { return }
            state.locks[key] = nil
            store.announce(&state, .unlocked(key))
        }
    }

    /// The simulation delivers changes itself (`SimulatedSharedStore.due(for:)`).
    func changes() -> AsyncStream<SharedChange> { AsyncStream { $0.finish() } }

    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try reach("reading a client secret") { $0.secrets[provider] }
    }
    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try reach("reading revocations") { state in
            state.pending.values.sorted { ($0.record.key, $0.id) < ($1.record.key, $1.id) }
        }
    }
}

/// The fake token endpoint as one host reaches it: refreshes from a host
/// that cannot reach the store are noted (a violation), and a refresh can be
/// held before it is sent, so that its host dies holding the refresh lock
/// (`drop()`: the held requests are never sent).
final class HostProvider: TokenProvider, Sendable {
    let inner: FakeProvider
    let host: String
    let store: SimulatedSharedStore
    /// Refreshes sent while the host was cut off, or without its holding the lock.
    let violations = Mutex<[String]>([])
    /// Each refresh sent: which session, with which refresh token (its grant and serial, no secret part).
    let sent = Mutex<[String]>([])
    private let gate = Mutex<(holding: Bool, held: [CheckedContinuation<Bool, Never>])>((false, []))

    init(_ inner: FakeProvider, host: String, store: SimulatedSharedStore) {
        self.inner = inner
        self.host = host
        self.store = store
    }

    /// From now on refreshes wait before they are sent.
    func hold() { gate.withLock { $0.holding = true } }
    var held: Int { gate.withLock { $0.held.count } }
    /// The host died: held refreshes are never sent (they answer a transient failure to a dead process).
    func drop() {
        let held = gate.withLock { gate in
            defer { gate = (false, []) }
            return gate.held
        }
        for continuation in held { continuation.resume(returning: false) }
    }

    func login(_ account: Account) async -> RefreshOutcome {
        await inner.login(account)
    }
    func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        let send = await withCheckedContinuation { continuation in
            let now = gate.withLock { gate -> Bool in
                guard gate.holding else { return true }
                gate.held.append(continuation)
                return false
            }
            if now { continuation.resume(returning: true) }
        }
        guard send else { return .transient(reason: "the process died (injected)", retryAfter: nil) }
        // A host cut off after it took the lock may finish its refresh under
        // the lease; one that does not hold the lock must never ask.
        if store.holder(of: record.key) != host {
            violations.withLock {
                $0.append(
                    "host \(host)\(store.isPartitioned(host) ? ", cut off from the store," : "") refreshed \(record.key) without holding its lock (holder: \(store.holder(of: record.key) ?? "none"))"
                )
            }
        }
        let token = record.tokens.refreshToken?.revealed.split(separator: "-").prefix(3).joined(separator: "-") ?? "-"
        sent.withLock { $0.append("\(host): refresh \(record.key) with \(token)") }
        return await inner.refresh(record)
    }
    func canRefresh(_ record: SessionRecord) -> Bool { inner.canRefresh(record) }
    func revoke(_ record: SessionRecord) async -> Bool { await inner.revoke(record) }
    func revokes(_ record: SessionRecord) -> Bool { inner.revokes(record) }
}
