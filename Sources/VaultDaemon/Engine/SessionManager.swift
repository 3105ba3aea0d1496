import Glibc
import Synchronization
import Varlink
import VaultCore
import VaultSystem

/// The one owner of session state. Every change to a session goes through
/// here: operations on one session are serialized (a login joins the login
/// in flight, a logout waits for it), operations on different sessions
/// proceed in parallel, and every change is written to the store before it
/// is acknowledged and published to the `SessionTable`.
///
/// Each session's state is one `AccountEntry`; its timed life (refresh,
/// expiry, backoff, save retry) is the pure `SessionTimers`, whose actions
/// this actor performs; its deadlines sit in one queue, and one timer waits
/// for the nearest on the injected clock. Background work (refreshes the
/// schedule starts, revocations, save retries) is owned here and drained by
/// `shutdown(graceSeconds:)`.
public actor SessionManager {
    /// Makes the token source of a provider: the OAuth 2.0 client or exec
    /// helper of its configuration, or a fake in tests. Gets the provider's
    /// stored client secret, if any.
    public typealias ProviderFactory = @Sendable (ProviderConfig, Secret?, Logger) -> (any TokenProvider)?

    /// The store, behind its gate: every call goes through `gate`.
    let store: any SessionStore
    /// The store's availability: refuses calls while the store is gone or locked.
    let gate: StoreGate
    /// Told when the store's availability changes (STATUS=).
    let storeDidChange: @Sendable (StoreState) -> Void
    let clock: any WallClock
    let log: Logger
    let events: @Sendable (VaultEvent) -> Void
    let makeProvider: ProviderFactory
    /// A number in 0..<1 for backoff jitter; seeded in the simulation.
    let random: @Sendable () -> Double
    /// The engine whose timerfd wakes the manager at its nearest deadline
    /// (`alarmAt`), when the manager runs on one (vaultd's main thread);
    /// else nil, and the owner calls `runDueWork()` itself, as the tests and
    /// the simulation do on their clocks.
    nonisolated let alarm: EngineThread?
    /// The executor this actor's work runs on: an ordinary actor's own
    /// queue on the cooperative pool, or the one given to `init` (the
    /// simulation's single thread, so that a seed is one schedule).
    private nonisolated let executor: UnownedSerialExecutor
    /// What `executor` belongs to, kept alive as long as this actor.
    private nonisolated let executorOwner: any Sendable & AnyObject
    /// An ordinary actor whose queue serves this one unless another is given.
    private actor Home {}
    public nonisolated var unownedExecutor: UnownedSerialExecutor { executor }
    /// The configuration in force.
    public private(set) var config: VaultConfig
    /// The table the serving thread reads.
    public nonisolated let table: SessionTable
    /// The connections whose clients report their connection state, and for which sessions.
    public nonisolated let reporting = ReportingConnections()
    /// The access policy in force, shared with the serving thread.
    public nonisolated let policy: PolicyBox

    /// Every session, one entry each (dense: an entry is ~350 bytes, and a
    /// dictionary would keep up to twice that per entry in empty buckets).
    var entries = DenseTable<SessionKey, AccountEntry>()
    var nextEntryID: UInt64 = 0
    /// Every session's deadlines; the nearest one sets the alarm.
    var deadlines = DeadlineQueue<TimedWork>()
    /// The nearest deadline, in seconds since the epoch, which the alarm is
    /// set for; nil: none.
    var alarmAt: Double?
    /// When the store is probed next, while it is not available.
    var probeAt: Double?
    /// Where fresh tokens come from, per oauth2 or exec provider.
    var clients: [String: any TokenProvider] = [:]
    /// Client secrets kept in the secret store (`vaultctl provider-secret`).
    var providerSecrets: [String: Secret] = [:]
    /// Background work in flight, by id: drained at shutdown.
    var background: [UInt64: Task<Void, Never>] = [:]
    var nextBackgroundID: UInt64 = 0
    /// Set by `shutdown`: no new background work starts.
    var stopping = false
    /// When shutdown's grace ends, while it runs: the alarm then keeps only
    /// the revocations' pacing and the waits.
    var graceEndsAt: Double?
    /// `runDueWork` is running: the timer is re-armed when it ends.
    var runningDueWork = false
    /// `restore` is publishing the stored sessions: the timer is armed once,
    /// when it ends, not once per session (a task made and cancelled each time).
    var restoring = false
    /// The write-through in flight after the store came back, as background
    /// work; `writeThroughAgain`: it came back once more meanwhile, and
    /// another follows this one.
    var writingThrough: UInt64?
    var writeThroughAgain = false
    /// Calls waiting on the manager (a login, a device login's next poll,
    /// another fleet host's refresh), by id.
    var waiters: [UInt64: Waiter] = [:]
    var nextWaiterID: UInt64 = 0
    /// What a single host and a host of a fleet do differently (`SingleHost`,
    /// `FleetHost`), chosen once by the store.
    let sharing: any StoreSharing
    /// The provider requests each user may still cause, and the queued
    /// revocations (see SessionManager+Traffic.swift).
    var traffic: ProviderTraffic
    /// The interactive logins waiting for their user (PendingLogins.swift):
    /// the device flow's (DeviceLogins.swift), the browser login's (BrowserLogins.swift).
    var deviceLogins = PendingLogins<DeviceLogin>(kind: "device")
    var browserLogins = PendingLogins<BrowserLogin>(kind: "browser")
    /// When `runDueWork` drops the pending logins past their expiry next (at
    /// or before the nearest expiry of one); nil when none is pending.
    var pendingLoginsExpire: UnixTime?

    /// A manager over `store`, reading time from `clock`; its work runs on
    /// `executor` when one is given (vaultd's engine thread, whose alarm
    /// then runs the due work; the simulation's thread), else on an ordinary
    /// actor's queue.
    public init(
        store: any SessionStore, config: VaultConfig, clock: any WallClock, log: Logger,
        policy: AccessPolicy = AccessPolicy(), providers: ProviderFactory? = nil,
        random: (@Sendable () -> Double)? = nil,
        executor: (any SerialExecutor)? = nil,
        tableDidChange: @escaping @Sendable (SessionTable) -> Void = { _ in },
        storeDidChange: @escaping @Sendable (StoreState) -> Void = { _ in },
        events: @escaping @Sendable (VaultEvent) -> Void = { _ in }
    ) {
        // A fleet's host: its own writes' revisions are kept (OwnWrites).
        let ownWrites = (store as? any SharedSessionStore).map(OwnWrites.init)
        let gate = StoreGate(ownWrites ?? store, clock: clock)
        self.gate = gate
        self.store = gate
        self.storeDidChange = storeDidChange
        self.config = config
        self.traffic = ProviderTraffic(budget: ProviderBudget(config.limits.providerRequests))
        self.clock = clock
        self.log = log
        self.policy = PolicyBox(policy)
        self.events = events
        self.makeProvider = providers ?? SessionManager.realProviders
        self.random = random ?? { Double.random(in: 0..<1) }
        self.alarm = executor as? EngineThread
        if let executor {
            self.executorOwner = executor
            self.executor = executor.asUnownedSerialExecutor()
        } else {
            let home = Home()
            self.executorOwner = home
            self.executor = home.unownedExecutor
        }
        self.table = SessionTable(didChange: tableDidChange)
        self.sharing = ownWrites.map { FleetHost(FleetStore(gate: gate, writes: $0)) } ?? SingleHost(gate)
        gate.onChange { [weak self] in
            guard let self else { return }
            // Told on whichever task made the failing call: taken on the manager.
            self.post { $0.storeHealthChanged() }
        }
    }

    /// The OAuth 2.0 client or the exec helper a provider's configuration names.
    public static let realProviders: ProviderFactory = { provider, secret, log in
        if let settings = provider.oauth2 {
            return OAuth2Client(
                settings: settings, clientSecret: secret ?? ClientSecrets.read(settings, log: log),
                timeoutSeconds: Double(settings.timeoutSeconds))
        }
        if let settings = provider.exec { return ExecProvider(settings: settings, log: log) }
        return nil
    }

    /// Runs `step` on the manager, from any thread: on the engine's thread
    /// after what was queued there before it; without an engine (the tests),
    /// as a task of its own.
    public nonisolated func post(_ step: @escaping @Sendable (isolated SessionManager) -> Void) {
        guard let alarm else {
            Task { await self.run(step) }
            return
        }
        alarm.post { self.assumeIsolated { step($0) } }
    }

    private func run(_ step: (isolated SessionManager) -> Void) { step(self) }

    /// Returns at once when the manager is not stuck: the watchdog's probe.
    public func ping() {}

    /// One audit line: who did what to which session, and the result. Never a secret.
    public nonisolated func audit(_ action: String, _ key: SessionKey, caller: Caller, result: String) {
        Audit.log(log, action, key, by: .peer(caller), result: result)
    }

    /// Puts a new, fully validated configuration in force. Sessions of providers
    /// that are gone are kept (and reported): their tokens stay readable, new
    /// logins to those providers are refused.
    public func apply(_ newConfig: VaultConfig, policy newPolicy: AccessPolicy) -> (
        added: [String], removed: [String], orphaned: [SessionKey]
    ) {
        let old = Set(config.providers.keys)
        let new = Set(newConfig.providers.keys)
        config = newConfig
        traffic.budget.configure(newConfig.limits.providerRequests)
        clients = [:]
        policy.replace(newPolicy)
        let removed = old.subtracting(new).sorted()
        let orphaned = entries.keys.filter { removed.contains($0.account.provider) }.sorted()
        for key in orphaned {
            log.warning(
                "the provider of a session was removed from the configuration; the session is kept",
                fields(key, event: "reload"))
        }
        warnOfUndeclaredHolders()
        providerCredentialsChanged(nil)
        startAutoLogins()
        return (new.subtracting(old).sorted(), removed, orphaned)
    }

    /// Logs the sessions held by another user than their account's declared
    /// `Owner=` (held before the declaration): they are kept and served to
    /// their holder; an administrator may log them out naming `ownerUid`.
    func warnOfUndeclaredHolders() {
        let declared = policy.policy.declared
        for key in entries.keys.sorted() where declared[key.account].map({ $0.owner != key.owner }) == true {
            log.warning(
                "a session is held by another user than its account's declared Owner=; an administrator may log it out with ownerUid (vaultctl --owner)",
                fields(key, event: "declared"))
        }
    }

    // MARK: Start-up and shutdown

    /// Loads every stored record, finishes logouts a crash interrupted
    /// (queueing their revocations first), and publishes the rest. Call once,
    /// before the socket answers.
    public func restore() async throws(VaultError) -> (restored: Int, finishedLogouts: Int) {
        let contents = try await store.loadAll()
        for label in contents.unreadable {
            log.warning("a stored item could not be read as a session and is ignored", ["item": label])
        }
        var finished = 0
        restoring = true
        defer { restoring = false }
        entries.reserveCapacity(entries.count + contents.records.count)
        // A restored session usually only arms its timers: its view is then
        // published with the others in one batch (100,000 at a start).
        deadlines.reserveCapacity(deadlines.count + 2 * contents.records.count)
        var views: [(SessionKey, SessionView)] = []
        views.reserveCapacity(contents.records.count)
        for record in contents.records {
            if record.phase == .loggingOut {
                if let id = record.revocationID {
                    // Idempotent: the same id replaces a copy queued before the crash.
                    try await store.apply(.savePendingRevocation(PendingRevocation(id: id, record: record)))
                }
                try await store.apply(.delete(record.key))
                log.notice("finished a logout that was interrupted", fields(record.key, event: "logoutSuccess"))
                finished += 1
                continue
            }
            if config.providers[record.account.provider] == nil {
                log.warning(
                    "a session's provider is not configured; the session is kept",
                    fields(record.key, event: "restore"))
            }
            let key = record.key
            var entry = makeEntry(record.account, state: .loggedIn(record))
            let actions = entry.timers.handle(
                .stored(facts(record, refreshedAt: record.tokens.issuedAt ?? record.createdAt), now: clock.now()))
            entries.updateValue(entry, forKey: key)
            guard actions.allSatisfy({ if case .schedule = $0 { true } else { false } }) else {
                // The batch goes first, so that the table ends as the records
                // came (a key stored twice leaves the later record served).
                table.publish(views)
                views.removeAll(keepingCapacity: true)
                perform(actions, for: key)
                continue
            }
            for case .schedule(let timer, let at) in actions {
                deadlines.schedule(TimedWork(key: key, timer: timer), at: at)
            }
            if let view = view(of: entry) { views.append((key, view)) }
        }
        table.publish(views)
        restoring = false
        rearmTimer()
        warnOfUndeclaredHolders()
        let restored = table.count
        startAutoLogins()
        return (restored, finished)
    }

    /// Retries the revocations a previous run queued and could not finish.
    /// One whose tokens are those of a session still served (a logout that
    /// failed and could not take its revocation back) is dropped instead.
    public func resumePendingRevocations() async {
        guard let pending = try? await store.loadPendingRevocations() else { return }
        for revocation in pending {
            let queued = revocation.record
            if let live = entries[queued.key]?.record,
                live.tokens.accessToken == queued.tokens.accessToken
                    || (live.tokens.refreshToken != nil && live.tokens.refreshToken == queued.tokens.refreshToken)
            {
                try? await store.apply(.deletePendingRevocation(revocation))
                continue
            }
            guard let provider = client(for: revocation.record.account.provider) else { continue }
            startRevocation(revocation, provider: provider)
        }
    }

    /// Stops the sessions' timers, lets background work (refreshes,
    /// revocations, save retries) finish for at most `graceSeconds` (the
    /// alarm still paces the queued revocations; the grace ends as soon as
    /// no work is left), then cancels the rest and returns without waiting
    /// for it.
    /// Nothing is lost by the cancel: revocations are queued in the store
    /// before they are attempted, and an unsaved refresh is retried from the
    /// store's tokens at the next start.
    public func shutdown(graceSeconds: Double) async {
        stopping = true
        rearmTimer()
        wakeClientWaiters()
        probeAt = nil
        sharing.stopFollowing(self)
        // Refreshed tokens held only in memory while the store is gone: one
        // last look whether it is back, so that they are not lost at the exit.
        if gate.health.state != .available, entries.values.contains(where: { $0.timers.status.unsaved }) {
            await gate.probeAndRecord(random: random())
            _ = gate.takeActions()
        }
        // Refreshed tokens not yet in the store get one last write: a rotated
        // refresh token lost here would end the session at the next start.
        for key in entries.keys {
            // Read again at each step: the awaits below let refreshes finish.
            guard let entry = entries[key], entry.timers.status.unsaved, entry.record != nil else { continue }
            await sharing.saveBeforeStopping(key, entryID: entry.id, self)
        }
        // Through the grace the alarm still sends the revocations queued
        // before the stop, paced as ever, and ends the waits for another host;
        // the grace looks again whenever background work ends.
        let graceEnds = clock.preciseNow() + graceSeconds
        graceEndsAt = graceEnds
        for _ in 0..<100_000 {
            runDueWork()
            guard !background.isEmpty || traffic.wakeAt != nil, clock.preciseNow() < graceEnds else { break }
            await wait(.grace, until: graceEnds)
        }
        graceEndsAt = nil
        rearmTimer()
        // Cancelled work that does not stop (a request blocked in libcurl or a
        // helper) is left behind: what it was doing is in the store already.
        for task in background.values { task.cancel() }
        wakeWaiters(dueAt: .infinity)
    }

    /// Follows the other hosts' changes in the background until shutdown,
    /// on a host of a fleet. Call once, after `restore()`.
    public func followSharedStore() { sharing.follow(self) }

    /// Reads `key` from the store when this host does not know the session
    /// and another host of its fleet may have logged it in; nothing on a
    /// single host. Throws the store's error.
    public func catchUpShared(_ key: SessionKey) async throws(VaultError) { try await sharing.catchUp(key, self) }

    /// Runs `body` as background work owned by the manager; returns its id
    /// (nil when stopping, and nothing runs, unless `evenWhenStopping`: the
    /// rest of a change already begun, which shutdown's grace waits for).
    @discardableResult
    func spawn(evenWhenStopping: Bool = false, _ body: @escaping @Sendable () async -> Void) -> UInt64? {
        guard !stopping || evenWhenStopping else { return nil }
        nextBackgroundID += 1
        let id = nextBackgroundID
        background[id] = Task {
            await body()
            self.finished(id)
        }
        return id
    }

    private func finished(_ id: UInt64) {
        background[id] = nil
        // Shutdown's grace looks again whenever a piece of work ends.
        if stopping { wakeWaiters(for: .grace) }
    }

    /// Background work still in flight (the simulation waits for none).
    public var backgroundWork: Int { background.count }

    // MARK: Client secrets

    /// Reads the stored client secrets of the oauth2 providers.
    public func loadProviderSecrets() async throws(VaultError) {
        for (name, provider) in config.providers where provider.type == .oauth2 {
            if let secret = try await store.loadProviderSecret(name) { providerSecrets[name] = secret }
        }
        clients = [:]
    }

    /// Stores the client secret of an oauth2 provider (root, admins, or the
    /// user this vaultd runs as).
    public func setProviderSecret(_ provider: String, _ secret: Secret, caller: Caller) async throws(VaultError) {
        let access = policy.policy
        guard caller.uid == access.vaultdUID || access.isAdmin(caller) else {
            throw VaultError(
                .accessDenied, "only root, the admin group or uid \(access.vaultdUID) may set client secrets")
        }
        guard config.providers[provider]?.type == .oauth2 else {
            throw VaultError(.invalidParameter, "provider '\(provider)' is not an oauth2 provider")
        }
        guard !secret.isEmpty, secret.utf8Count <= 4096 else {
            throw VaultError(.invalidParameter, "the client secret must be 1 to 4096 bytes")
        }
        try await store.apply(.saveProviderSecret(provider, secret))
        providerSecrets[provider] = secret
        clients[provider] = nil
        providerCredentialsChanged(provider)
        log.notice("client secret stored", ["provider": provider, "uid": String(caller.uid)])
    }

    // MARK: Helpers shared by the extensions

    func makeEntry(_ account: Account, state: AccountStateMachine.State = .loggedOut) -> AccountEntry {
        nextEntryID += 1
        var machine = AccountStateMachine(account: account, state: state)
        if let settings = config.accounts[account], settings.autoLogin {
            machine.autoLogin = true
            machine.reloginAfterKick = settings.reloginAfterKick
        }
        return AccountEntry(id: nextEntryID, machine: machine)
    }

    /// The token source of `provider`, made once per configuration.
    func client(for provider: String) -> (any TokenProvider)? {
        if let client = clients[provider] { return client }
        guard let settings = config.providers[provider] else { return nil }
        let made = makeProvider(settings, providerSecrets[provider], log)
        clients[provider] = made
        return made
    }

    /// What the schedule of `record` rests on.
    func facts(_ record: SessionRecord, refreshedAt: UnixTime) -> SessionTimers.Facts {
        let provider = config.providers[record.account.provider]
        let source = client(for: record.account.provider)
        return SessionTimers.Facts(
            expiresAt: record.expiresAt, refreshedAt: refreshedAt, createdAt: record.createdAt,
            canRefresh: renewer(for: record) != nil,
            maxLifetimeSeconds: source == nil ? nil : provider?.oauth2?.maxSessionLifetime,
            jitter: RefreshPolicy.jitter(for: record.account))
    }

    /// Tells subscribers: `code` (or `cause`'s), and `cause`'s messages and
    /// provider's code, masked before they go out.
    func emit(
        _ kind: EventKind, _ key: SessionKey, reason: String? = nil, code: VaultError.Code? = nil,
        cause: EndCause? = nil
    ) {
        events(
            VaultEvent(
                kind: kind, account: key.account, ownerUID: key.owner, time: clock.now(), reason: reason,
                code: (cause?.code ?? code)?.seedCode, message: cause?.message.map(SessionManager.eventMessage),
                providerCode: cause?.providerCode,
                providerMessage: cause?.providerMessage.map(SessionManager.eventMessage)))
    }

    /// The most bytes of an event's `message`.
    static let eventMessageLimit = 512

    /// `text` as an event may carry it: secrets masked (`Redactor`), cut to `eventMessageLimit` bytes.
    nonisolated static func eventMessage(_ text: String) -> String {
        Redactor.redact(text, limit: eventMessageLimit)
    }

    func publishView(_ key: SessionKey) {
        guard let entry = entries[key], let view = view(of: entry) else { return }
        table.publish(key, view)
    }

    /// What the serving thread shows of a session's entry; nil without a record.
    func view(of entry: AccountEntry) -> SessionView? {
        guard let record = entry.record else { return nil }
        let status = entry.timers.status
        return SessionView(
            state: .logged, record: record, refresh: status == RefreshStatus() ? nil : status,
            clients: entry.clients.clients)
    }

    /// Forgets a session that is logged out: its entry, its deadlines, its view.
    /// An account vaultd keeps logged in, or whose logins failed, stays parked
    /// instead: its session's deadlines go, its login deadline and backoff stay.
    func forget(_ key: SessionKey) {
        guard let entry = entries[key], entry.machine.state == .loggedOut else { return }
        if entry.parks {
            for timer in SessionTimers.Timer.allCases where timer != .login {
                deadlines.cancel(TimedWork(key: key, timer: timer))
            }
            publishParked(key)
            return
        }
        entries[key] = nil
        for timer in SessionTimers.Timer.allCases { deadlines.cancel(TimedWork(key: key, timer: timer)) }
        table.publish(key, nil)
    }

    nonisolated func fields(
        _ key: SessionKey, event: String, by principal: Principal? = nil, code: VaultError.Code? = nil
    ) -> [String: String] {
        var f = [
            "provider": key.account.provider, "user": key.account.user, "owner": String(key.owner), "event": event,
        ]
        switch principal {
        case .peer(let caller)?:
            f["uid"] = String(caller.uid)
            f["pid"] = String(caller.pid)
        case .vaultd?:
            f["actor"] = "vaultd"
        case nil: break
        }
        if let code { f["code"] = code.seedCode }
        return f
    }
}
