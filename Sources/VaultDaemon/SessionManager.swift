import Glibc
import VaultCore
import VaultSystem

/// The one owner of session state. Every change to a session goes through
/// here: operations on one account are serialized (a login joins the login in
/// flight, a logout waits for it), operations on different accounts proceed in
/// parallel, and every change is written to the store before it is
/// acknowledged and published to the `SessionTable`.
public actor SessionManager {
    private let store: any SessionStore
    private let clock: any WallClock
    private let log: Logger
    /// The configuration in force.
    public private(set) var config: VaultConfig
    /// The table the serving thread reads.
    public nonisolated let table: SessionTable

    private var machines: [SessionKey: AccountStateMachine] = [:]
    /// The store work in flight per session, which later requests join or wait for.
    private var logins: [SessionKey: Task<Result<SessionRecord, VaultError>, Never>] = [:]
    private var logouts: [SessionKey: Task<Result<Void, VaultError>, Never>] = [:]
    /// When each session's token stops being valid; the nearest one arms `expiryTimer`.
    private var expiries = DeadlineQueue<TimedWork>()
    /// Refresh bookkeeping per account (shown by status, never stored).
    private var refreshStatus: [SessionKey: RefreshStatus] = [:]
    /// The refresh in flight per account: every caller and the scheduler share it.
    private var refreshes: [SessionKey: Task<Result<SessionRecord, VaultError>, Never>] = [:]
    private var refreshGenerations: [SessionKey: Int] = [:]
    private var refreshGeneration = 0
    /// Where fresh tokens come from, per oauth2 or exec provider.
    private var clients: [String: any TokenProvider] = [:]
    /// Client secrets kept in the secret store (`vaultctl provider-secret`).
    private var providerSecrets: [String: Secret] = [:]
    private var expiryTimer: Task<Void, Never>?

    /// A manager over `store`, reading time from `clock`.
    /// The access policy in force, shared with the serving thread.
    public nonisolated let policy: PolicyBox
    private let events: @Sendable (VaultEvent) -> Void

    public init(
        store: any SessionStore, config: VaultConfig, clock: any WallClock, log: Logger,
        policy: AccessPolicy = AccessPolicy(),
        tableDidChange: @escaping @Sendable (SessionTable) -> Void = { _ in },
        events: @escaping @Sendable (VaultEvent) -> Void = { _ in }
    ) {
        self.store = store
        self.config = config
        self.clock = clock
        self.log = log
        self.policy = PolicyBox(policy)
        self.events = events
        self.table = SessionTable(didChange: tableDidChange)
    }

    private func emit(_ kind: EventKind, _ key: SessionKey, reason: String? = nil, code: VaultError.Code? = nil) {
        events(
            VaultEvent(
                kind: kind, account: key.account, ownerUID: key.owner, time: clock.now(), reason: reason,
                code: code?.seedCode))
    }

    /// One audit line: who did what to which session, and the result. Never a secret.
    public nonisolated func audit(_ action: String, _ key: SessionKey, caller: Caller, result: String) {
        Audit.log(log, action, key, caller: caller, result: result)
    }

    /// Returns at once when the manager is not stuck: the watchdog's probe.
    public func ping() {}

    /// Puts a new, fully validated configuration in force. Sessions of providers
    /// that are gone are kept (and reported): their tokens stay readable, new
    /// logins to those providers are refused.
    public func apply(_ newConfig: VaultConfig, policy newPolicy: AccessPolicy) -> (
        added: [String], removed: [String], orphaned: [SessionKey]
    ) {
        let old = Set(config.providers.keys)
        let new = Set(newConfig.providers.keys)
        config = newConfig
        clients = [:]
        policy.replace(newPolicy)
        let removed = old.subtracting(new).sorted()
        let orphaned = machines.keys.filter { removed.contains($0.account.provider) }.sorted()
        for key in orphaned {
            log.warning(
                "the provider of a session was removed from the configuration; the session is kept",
                fields(key, event: "reload"))
        }
        return (new.subtracting(old).sorted(), removed, orphaned)
    }

    // MARK: Start-up

    /// Loads every stored record, finishes logouts a crash interrupted, and
    /// publishes the rest. Call once, before the socket answers.
    public func restore() async throws(VaultError) -> (restored: Int, finishedLogouts: Int) {
        let contents = try await store.loadAll()
        for label in contents.unreadable {
            log.warning("a stored item could not be read as a session and is ignored", ["item": label])
        }
        var finished = 0
        for record in contents.records {
            if record.phase == .loggingOut {
                try await store.delete(record.key)
                log.notice("finished a logout that was interrupted", fields(record.key, event: "logoutSuccess"))
                finished += 1
                continue
            }
            if config.providers[record.account.provider] == nil {
                log.warning(
                    "a session's provider is not configured; the session is kept",
                    fields(record.key, event: "restore"))
            }
            machines[record.key] = AccountStateMachine(account: record.account, state: .loggedIn(record))
            schedule(record, refreshedAt: record.tokens.issuedAt ?? record.createdAt)
            // After scheduling, so that the view shows when the refresh is due.
            publishView(record.key)
        }
        rearmExpiryTimer()
        return (table.count, finished)
    }

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
        guard !secret.revealed.isEmpty, secret.revealed.utf8.count <= 4096 else {
            throw VaultError(.invalidParameter, "the client secret must be 1 to 4096 bytes")
        }
        try await store.saveProviderSecret(provider, secret)
        providerSecrets[provider] = secret
        clients[provider] = nil
        log.notice("client secret stored", ["provider": provider, "uid": String(caller.uid)])
    }

    // MARK: Login

    /// Logs `request` in for `caller`; answers the existing session when it
    /// is already logged in (created false). The session is the caller's own,
    /// the declared owner's for a declared account, or, for an administrator,
    /// the one `request.ownerUID` names.
    public func login(_ request: LoginRequest, caller: Caller) async throws(VaultError) -> (SessionRecord, Bool) {
        let account = try Account.validate(provider: request.provider, user: request.user)
        guard let provider = config.providers[account.provider] else { throw .unknownProvider(account.provider) }
        let access = policy.policy
        let key = SessionKey(
            owner: try access.owner(of: account, for: caller, requested: request.ownerUID), account: account)
        guard access.mayManage(caller, key) else {
            audit("Login", key, caller: caller, result: VaultError.Code.accessDenied.seedCode)
            throw access.declared[account] != nil
                ? VaultError(
                    .accessDenied,
                    "[Account \(account.provider) \(account.user)] is declared for uid \(key.owner) (Owner=); only that user, root or the admin group may log it in or out"
                ) : AccessPolicy.notYours(key)
        }
        if Self.mints(request, provider: provider), !access.mayMint(caller, account) {
            audit("Login", key, caller: caller, result: VaultError.Code.accessDenied.seedCode)
            throw AccessPolicy.mintDenied(account)
        }
        // Bounded: each pass waits for one in-flight operation to end.
        for _ in 0..<64 {
            var machine = machines[key] ?? AccountStateMachine(account: account)
            let action = machine.loginRequested()
            machines[key] = machine
            switch action {
            case .returnExisting(let record):
                audit("Login", key, caller: caller, result: "ok")
                return (record, false)
            case .joinInFlight:
                guard let task = logins[key] else { continue }
                let record = try await task.value.get()
                audit("Login", key, caller: caller, result: "ok")
                return (record, true)
            case .waitThenRetry:
                if let task = logouts[key] { _ = await task.value }
                continue
            case .startLogin:
                if key.owner != 0, table.sessionCount(of: key.owner) >= config.limits.sessionsPerUser {
                    machines[key]?.loginFailed()
                    cleanUp(key)
                    audit("Login", key, caller: caller, result: VaultError.Code.tooManySessions.seedCode)
                    throw VaultError(
                        .tooManySessions,
                        "uid \(key.owner) already holds \(config.limits.sessionsPerUser) sessions, the most one user may (MaxSessionsPerUser=); log one out first"
                    )
                }
                if provider.singleAccount,
                    let other = machines.first(where: {
                        $0.key.owner == key.owner && $0.key.account.provider == account.provider && $0.key != key
                            && $0.value.state != .loggedOut
                    })
                {
                    // Account switching (OpenIM), within one owner's sessions: the old
                    // session is logged out first.
                    machines[key]?.loginFailed()
                    cleanUp(key)
                    log.info("switching accounts", fields(other.key, event: "switch", caller: caller))
                    do throws(VaultError) {
                        try await logout(other.key, caller: caller, reason: "switched")
                    } catch  where error.code == .notLoggedIn {
                        // Gone meanwhile: nothing to switch from.
                    }
                    continue
                }
                table.publish(key, SessionView(state: .logging, record: nil))
                // The task ends only after the state changed, so that whoever
                // awaits it (a joiner, a waiting logout) sees the new state.
                let task = Task { () -> Result<SessionRecord, VaultError> in
                    await self.performLogin(request, key: key, caller: caller)
                }
                logins[key] = task
                return (try await task.value.get(), true)
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging in; try again")
    }

    /// True when `request` has the provider issue tokens with its own
    /// credential: a login without a token, or any login through an exec
    /// helper (which acts with the provider's credential, and refreshes with it).
    static func mints(_ request: LoginRequest, provider: ProviderConfig) -> Bool {
        switch provider.type {
        case .static: return false
        case .exec: return true
        case .oauth2: return request.token == nil && request.tokenResponse == nil
        }
    }

    /// Builds the session (asking the provider for tokens when the client
    /// brought none), then stores it.
    private func performLogin(_ request: LoginRequest, key: SessionKey, caller: Caller) async -> Result<
        SessionRecord, VaultError
    > {
        let account = key.account
        var obtained: LoginCredential?
        var request = request
        let provider = client(for: account.provider)
        let exchange = provider?.exchangesCredentials == true && request.tokenResponse == nil
        if let provider, exchange || (request.token == nil && request.tokenResponse == nil) {
            let credential = exchange ? request.token.map(Secret.init) : nil
            request.token = nil
            switch await provider.login(account, credential: credential) {
            case .refreshed(let tokens, let expiresIn):
                obtained = LoginCredential(tokens: tokens, expiresIn: expiresIn)
            case .transient(let reason, _):
                return failLogin(key, caller, VaultError(.networkError, "logging \(account) in failed: \(reason)"))
            case .permanent(let code, let reason):
                let known = VaultError.Code(seedCode: code) ?? .invalidCredential
                return failLogin(key, caller, VaultError(known, "the provider refused \(account): \(reason)"))
            }
        }
        let record: SessionRecord
        do throws(VaultError) {
            record = try makeRecord(request, key: key, obtained: obtained)
        } catch {
            return failLogin(key, caller, error)
        }
        return await commitLogin(record, caller: caller)
    }

    private func failLogin(_ key: SessionKey, _ caller: Caller, _ error: VaultError) -> Result<
        SessionRecord, VaultError
    > {
        logins[key] = nil
        machines[key]?.loginFailed()
        cleanUp(key)
        log.error("login failed", fields(key, event: "loginFailed", caller: caller, code: error.code))
        emit(.loginFailed, key, code: error.code)
        audit("Login", key, caller: caller, result: error.code.seedCode)
        return .failure(error)
    }

    private func commitLogin(_ record: SessionRecord, caller: Caller) async -> Result<SessionRecord, VaultError> {
        let key = record.key
        defer { logins[key] = nil }
        do throws(VaultError) {
            try await store.save(record)
        } catch {
            // A write abandoned at the timeout may still land in the keyring: remove it.
            try? await store.delete(key)
            return failLogin(key, caller, error)
        }
        machines[key]?.loginSucceeded(record)
        schedule(record, refreshedAt: clock.now())
        // After scheduling, so that the view shows when the refresh is due.
        publishView(key)
        rearmExpiryTimer()
        log.info("logged in", fields(key, event: "loginSuccess", caller: caller))
        emit(.loginSuccess, key)
        audit("Login", key, caller: caller, result: "ok")
        return .success(record)
    }

    private func makeRecord(_ request: LoginRequest, key: SessionKey, obtained: LoginCredential? = nil)
        throws(VaultError) -> SessionRecord
    {
        let account = key.account
        let credential: LoginCredential
        switch (request.token, request.tokenResponse) {
        case (nil, nil) where obtained != nil:
            credential = obtained!
        case (let token?, nil): credential = try LoginCredential(token: token)
        case (nil, let response?): credential = try LoginCredential(tokenResponse: response)
        case (nil, nil):
            throw VaultError(
                .invalidCredential, "no token given; pass either token or tokenResponse (vaultctl: on stdin)")
        case (_?, _?):
            throw VaultError(.invalidParameter, "pass either token or tokenResponse, not both")
        }
        let now = clock.now()
        var expiresAt = credential.expiry(explicit: request.expiresAt.map(UnixTime.init(seconds:)), now: now)
        if expiresAt == nil, let settings = config.providers[account.provider]?.oauth2 {
            // Salesforce sends no expires_in: assume the provider's DefaultLifetime.
            expiresAt = (credential.tokens.issuedAt ?? now).adding(seconds: settings.defaultLifetime)
        }
        if let expiresAt, expiresAt > UnixTime.latestExpiry {
            throw VaultError(.invalidParameter, "the expiry of the token for \(account) is past the year 9999")
        }
        if let expiresAt, expiresAt <= now {
            throw VaultError(
                .tokenExpired,
                "the token for \(account) expired at \(expiresAt) (now \(now)); obtain a new token and log in again")
        }
        var profile = UserProfile(uid: account.user)
        if let json = request.profile {
            profile = try UserProfile(json: json)
            guard profile.uid == account.user else {
                throw VaultError(.invalidParameter, "profile.uid '\(profile.uid)' differs from user '\(account.user)'")
            }
        }
        if profile.deactivatedAt != nil {
            throw VaultError(.userDeactivated, "\(account) is deactivated; reactivate the user at the provider")
        }
        let record = SessionRecord(
            account: account, user: profile, tokens: credential.tokens, createdAt: now, expiresAt: expiresAt,
            ownerUID: key.owner)
        var document = record.storedJSON().serialized()
        let size = document.count
        document.wipe()
        guard size <= config.limits.sessionBytes else {
            throw VaultError(
                .sessionTooLarge,
                "the session of \(account) would take \(size) bytes, more than the \(config.limits.sessionBytes) one session may (MaxSessionSize=); send a smaller profile or token"
            )
        }
        return record
    }

    // MARK: Logout

    /// Logs the session `key` out for `caller`: withdraws the token and tells the
    /// subscribers at once, then marks the stored record logging-out and
    /// deletes it (a crash in between finishes the logout at start-up), and
    /// returns once the store is updated. Should the store fail, the session is
    /// served again and subscribers get `logoutFailed`.
    ///
    /// With a `reason` it is a forced logout (the chat server kicked the client
    /// offline, or an administrator): subscribers get `kickedOffline` instead of
    /// `logoutSuccess`.
    public func logout(_ key: SessionKey, caller: Caller, reason: String? = nil, kind: EventKind? = nil)
        async throws(VaultError)
    {
        let account = key.account
        let action = LogoutKind(reason: reason, kind: kind).auditAction
        guard policy.policy.mayManage(caller, key) else {
            audit(action, key, caller: caller, result: VaultError.Code.accessDenied.seedCode)
            throw AccessPolicy.notYours(key)
        }
        for _ in 0..<64 {
            var machine = machines[key] ?? AccountStateMachine(account: account)
            let step = machine.logoutRequested()
            machines[key] = machine
            switch step {
            case .fail(let error):
                cleanUp(key)
                audit(action, key, caller: caller, result: error.code.seedCode)
                throw error
            case .joinInFlight:
                guard let task = logouts[key] else { continue }
                return try await task.value.get()
            case .waitThenRetry:
                if let task = logins[key] { _ = await task.value }
                continue
            case .startLogout(let record):
                // Nobody gets the token from here on, even before the store answered,
                // and every subscriber learns so now: the store's writes take tens of
                // milliseconds (gnome-keyring rewrites its file), a client should not
                // go on using the token meanwhile.
                table.publish(key, SessionView(state: .logout, record: nil))
                emit(LogoutKind(reason: reason, kind: kind).event, key, reason: reason)
                let task = Task { () -> Result<Void, VaultError> in
                    await self.commitLogout(record, caller: caller, reason: reason, kind: kind)
                }
                logouts[key] = task
                return try await task.value.get()
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging out; try again")
    }

    /// Marks the stored record logging-out, deletes it, and publishes the outcome;
    /// the task that runs this ends only after the state changed.
    private func commitLogout(_ record: SessionRecord, caller: Caller, reason: String?, kind: EventKind?) async
        -> Result<Void, VaultError>
    {
        let key = record.key
        let what = LogoutKind(reason: reason, kind: kind)
        let action = what.auditAction
        defer { logouts[key] = nil }
        var marked = record
        marked.phase = .loggingOut
        do throws(VaultError) {
            try await store.save(marked)
            try await store.delete(key)
        } catch {
            machines[key]?.logoutFinished(succeeded: false)
            table.publish(key, SessionView(state: .logged, record: record))
            log.error("logout failed", fields(key, event: "logoutFailed", caller: caller, code: error.code))
            emit(.logoutFailed, key, reason: reason, code: error.code)
            audit(action, key, caller: caller, result: error.code.seedCode)
            return .failure(error)
        }
        machines[key]?.logoutFinished(succeeded: true)
        cleanUp(key)
        table.publish(key, nil)
        for purpose in TimedWork.Purpose.allCases { expiries.cancel(TimedWork(key: key, purpose: purpose)) }
        refreshStatus[key] = nil
        rearmExpiryTimer()
        revokeAtProvider(record)
        var logFields = fields(key, event: what.event.rawValue, caller: caller)
        logFields["reason"] = reason
        log.info("logged out", logFields)
        audit(action, key, caller: caller, result: "ok")
        return .success(())
    }

    // MARK: Expiry

    /// Sleeps until the nearest expiry, then ends the sessions that are due. One
    /// timer for all sessions; re-armed whenever the nearest deadline may change.
    private func rearmExpiryTimer() {
        expiryTimer?.cancel()
        guard let next = expiries.next else {
            expiryTimer = nil
            return
        }
        let delay = UnixTime.timerMilliseconds(until: next.deadline, now: clock.preciseNow())
        expiryTimer = Task {
            if delay > 0 {
                try? await Task.sleep(for: .milliseconds(delay))
            }
            if Task.isCancelled { return }
            await self.expireDueSessions()
        }
    }

    /// Does what is due: ends sessions whose token expired (or whose maximum
    /// lifetime passed), starts refreshes, retries unsaved writes.
    func expireDueSessions() async {
        let now = clock.now()
        for work in expiries.popDue(at: now) {
            let key = work.key
            let account = key.account
            guard case .loggedIn(let record)? = machines[key]?.state else { continue }
            switch work.purpose {
            case .expire:
                guard record.isExpired(at: now) else { continue }
                // After a suspend or a restart past the expiry, a refresh may still work:
                // only a session that cannot be refreshed now ends as tokenExpired.
                if let provider = client(for: account.provider), provider.canRefresh(record),
                    (try? await refresh(key, caller: nil)) != nil
                {
                    continue
                }
                guard case .loggedIn(let current)? = machines[key]?.state, current.isExpired(at: clock.now())
                else { continue }
                await end(key, reason: "tokenExpired", kind: .tokenExpired)
            case .maxLifetime:
                await end(key, reason: "maxSessionLifetime", kind: .tokenInvalid)
            case .refresh:
                Task { _ = try? await self.refresh(key, caller: nil) }
            case .saveRetry:
                do throws(VaultError) {
                    try await store.save(record)
                    refreshStatus[key, default: RefreshStatus()].unsaved = false
                    publishView(key)
                } catch {
                    expiries.schedule(work, at: now.adding(seconds: 5))
                }
            }
        }
        rearmExpiryTimer()
    }

    private func end(_ key: SessionKey, reason: String, kind: EventKind) async {
        do throws(VaultError) {
            try await logout(key, caller: Caller.vaultd, reason: reason, kind: kind)
        } catch {
            log.error("a session could not be ended", fields(key, event: kind.rawValue, code: error.code))
        }
    }

    /// Schedules the hard expiry, the refresh and the maximum lifetime of a session.
    private func schedule(_ record: SessionRecord, refreshedAt: UnixTime) {
        let key = record.key
        let account = record.account
        if let expiresAt = record.expiresAt {
            expiries.schedule(TimedWork(key: key, purpose: .expire), at: expiresAt)
        }
        guard let provider = config.providers[account.provider], let source = client(for: account.provider) else {
            return
        }
        if let expiresAt = record.expiresAt, source.canRefresh(record) {
            // At most one refresh a second, even for tokens that live a second or two.
            let at = max(
                RefreshPolicy.refreshAt(
                    issuedAt: refreshedAt, expiresAt: expiresAt, jitter: RefreshPolicy.jitter(for: account)),
                clock.now().adding(seconds: 1))
            expiries.schedule(TimedWork(key: key, purpose: .refresh), at: at)
            refreshStatus[key, default: RefreshStatus()].refreshAt = at
        }
        if let maximum = provider.oauth2?.maxSessionLifetime {
            expiries.schedule(
                TimedWork(key: key, purpose: .maxLifetime), at: record.createdAt.adding(seconds: maximum))
        }
    }

    // MARK: Refresh

    /// Refreshes the tokens of the session `key` now, or joins the refresh in
    /// flight. `caller` nil is vaultd's own scheduler; a refresh a client asked
    /// for (`Refresh`, or `GetToken` through `freshToken`) starts at most once
    /// per `MinRefreshInterval=` while the token has not expired.
    public func refresh(
        _ key: SessionKey, caller: Caller?, clientAsked: Bool = false, respectBackoff: Bool = false
    ) async throws(VaultError) -> SessionRecord {
        let account = key.account
        if let caller, !policy.policy.mayManage(caller, key) { throw AccessPolicy.notYours(key) }
        guard case .loggedIn(let record)? = machines[key]?.state else { throw .notLoggedIn(account) }
        if let task = refreshes[key] { return try await task.value.get() }
        if respectBackoff, let retryAt = refreshStatus[key]?.nextRetryAt, retryAt > clock.now() {
            // Clients asking for fresh tokens must not hammer a failing endpoint.
            throw VaultError(
                .networkError,
                "refreshing \(account) failed (\(refreshStatus[key]?.lastError ?? "unknown error")); the next try is at \(retryAt)"
            )
        }
        guard let provider = client(for: account.provider) else {
            throw VaultError(
                .tokenExpired, "provider '\(account.provider)' cannot refresh tokens; log \(account) in again")
        }
        guard provider.canRefresh(record) else {
            throw VaultError(.tokenExpired, "\(account) has no refresh token; log in again")
        }
        let now = clock.now()
        let interval = config.limits.minRefreshIntervalSeconds
        if clientAsked, !record.isExpired(at: now), let last = refreshStatus[key]?.lastRefreshAt,
            last.adding(seconds: interval) > now
        {
            // One local user must not be able to make vaultd hammer the token
            // endpoint (and get a shared client_id rate-limited for everyone).
            throw VaultError(
                .refreshTooSoon,
                "the tokens of \(account) were refreshed at \(last), less than \(interval)s ago (MinRefreshInterval=); they can be refreshed again from \(last.adding(seconds: interval)) on"
            )
        }
        refreshGeneration += 1
        let generation = refreshGeneration
        let task = Task { () -> Result<SessionRecord, VaultError> in
            let result = await self.performRefresh(key, provider: provider, snapshot: record)
            // Only this refresh's entry: a newer session may have started its own meanwhile.
            if self.refreshGenerations[key] == generation {
                self.refreshes[key] = nil
                self.refreshGenerations[key] = nil
            }
            return result
        }
        refreshes[key] = task
        refreshGenerations[key] = generation
        return try await task.value.get()
    }

    /// A token valid at least `minValidSeconds` for `caller`, refreshing first when needed.
    ///
    /// Asks the provider at most once per `MinRefreshInterval=`, and never
    /// when `minValidSeconds` is beyond what the provider's last refresh gave a
    /// token to live: then the answer is `tokenExpired` at once.
    public func freshToken(_ key: SessionKey, minValidSeconds: Int64, caller: Caller) async throws(VaultError)
        -> SessionRecord
    {
        let account = key.account
        guard case .loggedIn(var record)? = machines[key]?.state else { throw .notLoggedIn(account) }
        guard policy.policy.mayReadToken(caller, key) else {
            throw VaultError(.accessDenied, "the token of \(account) is handed only to its owner")
        }
        if let expiresAt = record.expiresAt, expiresAt <= clock.now().adding(seconds: minValidSeconds) {
            // The lifetime the provider gives is known once it refreshed the session.
            let lifetime = expiresAt.seconds - (record.tokens.issuedAt ?? record.createdAt).seconds
            if refreshStatus[key]?.lastRefreshAt != nil, minValidSeconds >= lifetime {
                throw VaultError(
                    .tokenExpired,
                    "a token of \(account) lives \(lifetime)s, and \(minValidSeconds)s were asked for; ask for less (minValidSeconds)"
                )
            }
            do throws(VaultError) {
                record = try await refresh(key, caller: nil, clientAsked: true, respectBackoff: true)
            } catch  where error.code == .refreshTooSoon {
                throw VaultError(
                    .tokenExpired,
                    "the token of \(account) expires at \(expiresAt), before the \(minValidSeconds)s asked for, and was refreshed too recently to refresh again (\(error.message))"
                )
            }
        }
        if let expiresAt = record.expiresAt, expiresAt <= clock.now().adding(seconds: minValidSeconds) {
            throw VaultError(
                .tokenExpired,
                "the token of \(account) expires at \(expiresAt), before the \(minValidSeconds)s asked for")
        }
        return record
    }

    private func performRefresh(_ key: SessionKey, provider: any TokenProvider, snapshot: SessionRecord) async
        -> Result<SessionRecord, VaultError>
    {
        let account = key.account
        setConnection(key, .connecting, reason: nil)
        let outcome = await provider.refresh(snapshot)
        // The session may have ended, or been replaced, while the request was out.
        guard case .loggedIn(let current)? = machines[key]?.state, current.tokens == snapshot.tokens
        else {
            if case .refreshed(let tokens, _) = outcome { revokeOrphaned(tokens, of: snapshot) }
            return .failure(.notLoggedIn(account))
        }
        let now = clock.now()
        switch outcome {
        case .refreshed(var tokens, let expiresIn):
            // RFC 6749 6: the server may keep the refresh token; then the old one stays valid.
            if tokens.refreshToken == nil { tokens.refreshToken = current.tokens.refreshToken }
            tokens.instanceURL = tokens.instanceURL ?? current.tokens.instanceURL
            tokens.clientID = tokens.clientID ?? current.tokens.clientID
            tokens.issuedAt = now
            var updated = current
            updated.tokens = tokens
            let lifetime = expiresIn ?? config.providers[account.provider]?.oauth2?.defaultLifetime ?? 3600
            updated.expiresAt = now.adding(seconds: lifetime)
            // Write-through before anyone gets the new access token: a rotated
            // refresh token that is not stored would be lost at a crash.
            var status = refreshStatus[key] ?? RefreshStatus()
            do throws(VaultError) {
                try await store.save(updated)
                status.unsaved = false
            } catch {
                status.unsaved = true
                expiries.schedule(TimedWork(key: key, purpose: .saveRetry), at: now.adding(seconds: 5))
                log.error(
                    "refreshed tokens could not be stored; kept in memory and retried",
                    fields(key, event: "tokenRefreshed", code: error.code))
            }
            guard case .loggedIn(let again)? = machines[key]?.state, again.tokens == snapshot.tokens else {
                // The session ended or was replaced while the write was out: put the
                // current record back if it is another session's.
                if case .loggedIn(let again)? = machines[key]?.state { try? await store.save(again) }
                if case .refreshed(let issued, _) = outcome { revokeOrphaned(issued, of: snapshot) }
                return .failure(.notLoggedIn(account))
            }
            machines[key]?.refreshed(updated)
            status.lastRefreshAt = now
            status.consecutiveFailures = 0
            status.lastError = nil
            status.nextRetryAt = nil
            refreshStatus[key] = status
            schedule(updated, refreshedAt: now)
            rearmExpiryTimer()
            publishView(key)
            log.info("token refreshed", fields(key, event: "tokenRefreshed"))
            events(
                VaultEvent(
                    kind: .tokenRefreshed, account: account, ownerUID: updated.ownerUID, time: now,
                    expiresAt: updated.expiresAt))
            setConnection(key, .connected, reason: nil)
            return .success(updated)
        case .transient(let reason, let retryAfter):
            var status = refreshStatus[key] ?? RefreshStatus()
            status.consecutiveFailures += 1
            status.lastError = reason
            let wait = RefreshPolicy.backoff(
                attempt: status.consecutiveFailures, random: Double.random(in: 0..<1), retryAfter: retryAfter)
            status.nextRetryAt = now.adding(seconds: wait)
            refreshStatus[key] = status
            expiries.schedule(TimedWork(key: key, purpose: .refresh), at: now.adding(seconds: wait))
            rearmExpiryTimer()
            log.warning(
                "refresh failed; the current token is still served and the refresh retried",
                fields(key, event: "connectFailed").merging(["reason": reason, "retryIn": String(wait)]) { a, _ in a
                })
            setConnection(key, .connectFailed, reason: reason)
            return .failure(VaultError(.networkError, "refreshing \(account) failed: \(reason); retrying in \(wait)s"))
        case .permanent(let code, let reason):
            refreshStatus[key, default: RefreshStatus()].lastError = reason
            log.error(
                "refresh refused; the session is logged out",
                fields(key, event: "tokenInvalid").merging(
                    ["reason": code]) { a, _ in a })
            await end(key, reason: "tokenInvalid", kind: .tokenInvalid)
            return .failure(
                VaultError(.invalidCredential, "the provider refused to refresh \(account) (\(code)); log in again"))
        }
    }

    private func setConnection(_ key: SessionKey, _ state: ConnectionState, reason: String?) {
        guard
            let record = machines[key].flatMap({ machine -> SessionRecord? in
                if case .loggedIn(let record) = machine.state { return record }
                return nil
            })
        else { return }
        refreshStatus[key, default: RefreshStatus()].connection = state
        publishView(key)
        events(
            VaultEvent(
                kind: .connectionChanged, account: key.account, ownerUID: record.ownerUID, time: clock.now(),
                reason: reason.map { "\(state.rawValue): \($0)" } ?? state.rawValue))
    }

    private func publishView(_ key: SessionKey) {
        guard case .loggedIn(let record)? = machines[key]?.state else { return }
        table.publish(key, SessionView(state: .logged, record: record, refresh: refreshStatus[key]))
    }

    private func client(for provider: String) -> (any TokenProvider)? {
        if let client = clients[provider] { return client }
        let made: (any TokenProvider)?
        if let settings = config.providers[provider]?.oauth2 {
            let secret = providerSecrets[provider] ?? ClientSecrets.read(settings, log: log)
            made = OAuth2Client(
                settings: settings, clientSecret: secret, timeoutSeconds: Double(settings.timeoutSeconds))
        } else if let settings = config.providers[provider]?.exec {
            made = ExecProvider(settings: settings, log: log)
        } else {
            made = nil
        }
        clients[provider] = made
        return made
    }

    /// RFC 7009 at logout (or the exec helper's revoke): a failure does not
    /// block the logout. A revocation that failed is queued in the secret
    /// store, so that a restart does not forget it, and retried with backoff
    /// (about 10 minutes in all); it leaves the queue once the provider took it.
    private func revokeAtProvider(_ record: SessionRecord) {
        guard let provider = client(for: record.account.provider) else { return }
        let store = self.store
        let log = self.log
        Task.detached {
            await SessionManager.revoke(
                PendingRevocation(queueing: record), provider: provider, store: store, log: log, queued: false)
        }
    }

    /// Revokes tokens a refresh obtained for a session that ended (or was
    /// replaced) while the request was out: nobody will use them, and they
    /// would stay valid at the provider. Only a new refresh token needs it; an
    /// unrotated one is the ended session's, which its logout revokes.
    private func revokeOrphaned(_ issued: TokenSet, of snapshot: SessionRecord) {
        guard let rotated = issued.refreshToken, rotated != snapshot.tokens.refreshToken else { return }
        var orphan = snapshot
        orphan.tokens = issued
        log.info(
            "a refresh finished after its session ended; the tokens it obtained are revoked",
            fields(snapshot.key, event: "revokeOrphaned"))
        revokeAtProvider(orphan)
    }

    private static func revoke(
        _ revocation: PendingRevocation, provider: any TokenProvider, store: any SessionStore, log: Logger,
        queued: Bool
    ) async {
        let account = revocation.record.account
        let fields = ["provider": account.provider, "user": account.user]
        var isQueued = queued
        for attempt in 1...10 {
            if await provider.revoke(revocation.record) {
                if isQueued { try? await store.deletePendingRevocation(revocation) }
                return
            }
            if !isQueued {
                do throws(VaultError) {
                    try await store.savePendingRevocation(revocation)
                    isQueued = true
                } catch {
                    log.warning("a failed revocation could not be queued in the store", fields)
                }
            }
            let wait = RefreshPolicy.backoff(attempt: attempt, random: Double.random(in: 0..<1))
            try? await Task.sleep(for: .seconds(wait))
        }
        log.warning(
            "the token could not be revoked at the provider; it stays queued for the next start",
            fields.merging(["event": "revokeFailed"]) { a, _ in a })
    }

    /// Retries the revocations a previous run queued and could not finish.
    public func resumePendingRevocations() async {
        guard let pending = try? await store.loadPendingRevocations() else { return }
        for revocation in pending {
            guard let provider = client(for: revocation.record.account.provider) else { continue }
            let store = self.store
            let log = self.log
            Task.detached {
                await SessionManager.revoke(revocation, provider: provider, store: store, log: log, queued: true)
            }
        }
    }

    /// Forgets the machine of an account that is logged out, so the table of
    /// machines holds only live accounts.
    private func cleanUp(_ key: SessionKey) {
        if machines[key]?.state == .loggedOut {
            machines[key] = nil
            table.publish(key, nil)
        }
    }

    private nonisolated func fields(
        _ key: SessionKey, event: String, caller: Caller? = nil, code: VaultError.Code? = nil
    )
        -> [String: String]
    {
        var f = [
            "provider": key.account.provider, "user": key.account.user, "owner": String(key.owner), "event": event,
        ]
        if let caller {
            f["uid"] = String(caller.uid)
            f["pid"] = String(caller.pid)
        }
        if let code { f["code"] = code.seedCode }
        return f
    }
}

/// The audit trail: one structured line per token handout, login, logout and
/// kick, naming who (uid, pid, executable), what, which session (account and
/// owner) and the result.
public enum Audit {
    /// Writes one audit line.
    public static func log(_ log: Logger, _ action: String, _ key: SessionKey, caller: Caller, result: String) {
        // Already in key order: an audit line per token handout is on the serving path.
        log.log(
            .notice, "audit",
            sortedFields: [
                ("action", action), ("exe", caller.executable ?? "?"), ("owner", String(key.owner)),
                ("pid", String(caller.pid)), ("provider", key.account.provider), ("result", result),
                ("uid", String(caller.uid)), ("user", key.account.user),
            ])
    }
}

/// What a logout is, for its event and audit line.
struct LogoutKind {
    var event: EventKind
    var auditAction: String

    init(reason: String?, kind: EventKind?) {
        event = kind ?? (reason == nil ? .logoutSuccess : .kickedOffline)
        switch event {
        case .logoutSuccess: auditAction = "Logout"
        case .tokenExpired: auditAction = "Expire"
        default: auditAction = "ForceLogout"
        }
    }
}

extension Caller {
    /// vaultd itself, acting on its own schedule.
    static let vaultd = Caller(uid: 0, gid: 0, pid: getpid(), executable: "vaultd")
}

/// Something the daemon must do at a time: one deadline per account and purpose.
struct TimedWork: Hashable, Sendable {
    enum Purpose: CaseIterable, Sendable {
        case expire
        case refresh
        case maxLifetime
        case saveRetry
    }

    var key: SessionKey
    var purpose: Purpose
}

/// Client secrets come from files (systemd credentials), never the config text.
enum ClientSecrets {
    static func read(_ settings: OAuth2Settings, log: Logger) -> Secret? {
        guard var path = settings.clientSecretFile else { return nil }
        if !path.hasPrefix("/"), let credentials = Environment.get("CREDENTIALS_DIRECTORY") {
            path = credentials + "/" + path
        }
        guard var bytes = try? Files.read(path, limit: 64 * 1024),
            let text = String(validating: bytes, as: UTF8.self)
        else {
            log.error("the client secret file cannot be read", ["path": path])
            return nil
        }
        bytes.withUnsafeMutableBytes { raw in for i in raw.indices { raw[i] = 0 } }
        return Secret(LoginCredential.trimmed(text))
    }
}
