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

    private var machines: [Account: AccountStateMachine] = [:]
    /// The store work in flight per account, which later requests join or wait for.
    private var logins: [Account: Task<Result<SessionRecord, VaultError>, Never>] = [:]
    private var logouts: [Account: Task<Result<Void, VaultError>, Never>] = [:]
    /// Who started each login in flight: only that uid may join it.
    private var loginOwners: [Account: UInt32] = [:]
    /// When each session's token stops being valid; the nearest one arms `expiryTimer`.
    private var expiries = DeadlineQueue<TimedWork>()
    /// Refresh bookkeeping per account (shown by status, never stored).
    private var refreshStatus: [Account: RefreshStatus] = [:]
    /// The refresh in flight per account: every caller and the scheduler share it.
    private var refreshes: [Account: Task<Result<SessionRecord, VaultError>, Never>] = [:]
    private var refreshGenerations: [Account: Int] = [:]
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

    private func emit(
        _ kind: EventKind, _ account: Account, owner: UInt32, reason: String? = nil, code: VaultError.Code? = nil
    ) {
        events(
            VaultEvent(
                kind: kind, account: account, ownerUID: owner, time: clock.now(), reason: reason,
                code: code?.seedCode))
    }

    /// One audit line: who did what to which account, and the result. Never a secret.
    public nonisolated func audit(_ action: String, _ account: Account, caller: Caller, result: String) {
        Audit.log(log, action, account, caller: caller, result: result)
    }

    /// Returns at once when the manager is not stuck: the watchdog's probe.
    public func ping() {}

    /// Puts a new, fully validated configuration in force. Sessions of providers
    /// that are gone are kept (and reported): their tokens stay readable, new
    /// logins to those providers are refused.
    public func apply(_ newConfig: VaultConfig, policy newPolicy: AccessPolicy) -> (
        added: [String], removed: [String], orphaned: [Account]
    ) {
        let old = Set(config.providers.keys)
        let new = Set(newConfig.providers.keys)
        config = newConfig
        clients = [:]
        policy.replace(newPolicy)
        let removed = old.subtracting(new).sorted()
        let orphaned = machines.keys.filter { removed.contains($0.provider) }.sorted()
        for account in orphaned {
            log.warning(
                "the provider of a session was removed from the configuration; the session is kept",
                fields(account, event: "reload"))
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
                try await store.delete(record.account)
                log.notice("finished a logout that was interrupted", fields(record.account, event: "logoutSuccess"))
                finished += 1
                continue
            }
            if config.providers[record.account.provider] == nil {
                log.warning(
                    "a session's provider is not configured; the session is kept",
                    fields(record.account, event: "restore"))
            }
            machines[record.account] = AccountStateMachine(account: record.account, state: .loggedIn(record))
            schedule(record, refreshedAt: record.tokens.issuedAt ?? record.createdAt)
            // After scheduling, so that the view shows when the refresh is due.
            publishView(record.account)
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
        guard caller.uid == getuid() || policy.policy.isAdmin(caller) else {
            throw VaultError(.accessDenied, "only root, the admin group or uid \(getuid()) may set client secrets")
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

    /// Logs `request` in for `caller`; answers the existing session when the
    /// account is already logged in (created false).
    public func login(_ request: LoginRequest, caller: Caller) async throws(VaultError) -> (SessionRecord, Bool) {
        let account = try Account.validate(provider: request.provider, user: request.user)
        guard config.providers[account.provider] != nil else { throw .unknownProvider(account.provider) }
        // Bounded: each pass waits for one in-flight operation to end.
        for _ in 0..<64 {
            var machine = machines[account] ?? AccountStateMachine(account: account)
            let action = machine.loginRequested(by: caller)
            machines[account] = machine
            switch action {
            case .returnExisting(let record):
                audit("Login", account, caller: caller, result: "ok")
                return (record, false)
            case .fail(let error):
                throw error
            case .joinInFlight:
                guard let task = logins[account] else { continue }
                guard loginOwners[account] == caller.uid else {
                    audit("Login", account, caller: caller, result: VaultError.Code.accessDenied.seedCode)
                    throw VaultError(.accessDenied, "another user is logging \(account) in")
                }
                let record = try await task.value.get()
                audit("Login", account, caller: caller, result: "ok")
                return (record, true)
            case .waitThenRetry:
                if let task = logouts[account] { _ = await task.value }
                continue
            case .startLogin:
                if config.providers[account.provider]?.singleAccount == true,
                    let other = machines.first(where: {
                        $0.key.provider == account.provider && $0.key != account && $0.value.state != .loggedOut
                    })
                {
                    // Account switching (OpenIM): the old session is logged out first.
                    machines[account]?.loginFailed()
                    cleanUp(account)
                    if case .loggedIn(let record) = other.value.state,
                        !policy.policy.maySee(caller, ownerUID: record.ownerUID)
                    {
                        throw VaultError(
                            .accessDenied,
                            "provider '\(account.provider)' allows one account and \(other.key) belongs to uid \(record.ownerUID); it must log out first"
                        )
                    }
                    log.info("switching accounts", fields(other.key, event: "switch", caller: caller))
                    do throws(VaultError) {
                        try await logout(other.key, caller: caller, reason: "switched")
                    } catch  where error.code == .notLoggedIn {
                        // Gone meanwhile: nothing to switch from.
                    }
                    continue
                }
                table.publish(account, SessionView(state: .logging, record: nil))
                // The task ends only after the state changed, so that whoever
                // awaits it (a joiner, a waiting logout) sees the new state.
                let task = Task { () -> Result<SessionRecord, VaultError> in
                    await self.performLogin(request, account: account, caller: caller)
                }
                logins[account] = task
                loginOwners[account] = caller.uid
                return (try await task.value.get(), true)
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging in; try again")
    }

    /// Builds the session (asking the provider for tokens when the client
    /// brought none), then stores it.
    private func performLogin(_ request: LoginRequest, account: Account, caller: Caller) async -> Result<
        SessionRecord, VaultError
    > {
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
                return failLogin(account, caller, VaultError(.networkError, "logging \(account) in failed: \(reason)"))
            case .permanent(let code, let reason):
                let known = VaultError.Code(seedCode: code) ?? .invalidCredential
                return failLogin(account, caller, VaultError(known, "the provider refused \(account): \(reason)"))
            }
        }
        let record: SessionRecord
        do throws(VaultError) {
            record = try makeRecord(request, account: account, caller: caller, obtained: obtained)
        } catch {
            return failLogin(account, caller, error)
        }
        return await commitLogin(record, caller: caller)
    }

    private func failLogin(_ account: Account, _ caller: Caller, _ error: VaultError) -> Result<
        SessionRecord, VaultError
    > {
        logins[account] = nil
        loginOwners[account] = nil
        machines[account]?.loginFailed()
        cleanUp(account)
        log.error("login failed", fields(account, event: "loginFailed", caller: caller, code: error.code))
        emit(.loginFailed, account, owner: caller.uid, code: error.code)
        audit("Login", account, caller: caller, result: error.code.seedCode)
        return .failure(error)
    }

    private func commitLogin(_ record: SessionRecord, caller: Caller) async -> Result<SessionRecord, VaultError> {
        let account = record.account
        defer {
            logins[account] = nil
            loginOwners[account] = nil
        }
        do throws(VaultError) {
            try await store.save(record)
        } catch {
            // A write abandoned at the timeout may still land in the keyring: remove it.
            try? await store.delete(account)
            return failLogin(account, caller, error)
        }
        machines[account]?.loginSucceeded(record)
        schedule(record, refreshedAt: clock.now())
        // After scheduling, so that the view shows when the refresh is due.
        publishView(account)
        rearmExpiryTimer()
        log.info("logged in", fields(account, event: "loginSuccess", caller: caller))
        emit(.loginSuccess, account, owner: record.ownerUID)
        audit("Login", account, caller: caller, result: "ok")
        return .success(record)
    }

    private func makeRecord(
        _ request: LoginRequest, account: Account, caller: Caller, obtained: LoginCredential? = nil
    ) throws(VaultError) -> SessionRecord {
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
        return SessionRecord(
            account: account, user: profile, tokens: credential.tokens, createdAt: now, expiresAt: expiresAt,
            ownerUID: caller.uid)
    }

    // MARK: Logout

    /// Logs `account` out for `caller`: withdraws the token and tells the
    /// subscribers at once, then marks the stored record logging-out and
    /// deletes it (a crash in between finishes the logout at start-up), and
    /// returns once the store is updated. Should the store fail, the session is
    /// served again and subscribers get `logoutFailed`.
    ///
    /// With a `reason` it is a forced logout (the chat server kicked the client
    /// offline, or an administrator): subscribers get `kickedOffline` instead of
    /// `logoutSuccess`.
    public func logout(_ account: Account, caller: Caller, reason: String? = nil, kind: EventKind? = nil)
        async throws(VaultError)
    {
        let action = LogoutKind(reason: reason, kind: kind).auditAction
        for _ in 0..<64 {
            var machine = machines[account] ?? AccountStateMachine(account: account)
            let step = machine.logoutRequested(by: caller, isAdmin: policy.policy.isAdmin(caller))
            machines[account] = machine
            switch step {
            case .fail(let error):
                cleanUp(account)
                audit(action, account, caller: caller, result: error.code.seedCode)
                throw error
            case .joinInFlight:
                guard let task = logouts[account] else { continue }
                return try await task.value.get()
            case .waitThenRetry:
                if let task = logins[account] { _ = await task.value }
                continue
            case .startLogout(let record):
                // Nobody gets the token from here on, even before the store answered,
                // and every subscriber learns so now: the store's writes take tens of
                // milliseconds (gnome-keyring rewrites its file), a client should not
                // go on using the token meanwhile.
                table.publish(account, SessionView(state: .logout, record: nil))
                emit(LogoutKind(reason: reason, kind: kind).event, account, owner: record.ownerUID, reason: reason)
                let task = Task { () -> Result<Void, VaultError> in
                    await self.commitLogout(record, caller: caller, reason: reason, kind: kind)
                }
                logouts[account] = task
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
        let account = record.account
        let what = LogoutKind(reason: reason, kind: kind)
        let action = what.auditAction
        defer { logouts[account] = nil }
        var marked = record
        marked.phase = .loggingOut
        do throws(VaultError) {
            try await store.save(marked)
            try await store.delete(account)
        } catch {
            machines[account]?.logoutFinished(succeeded: false)
            table.publish(account, SessionView(state: .logged, record: record))
            log.error("logout failed", fields(account, event: "logoutFailed", caller: caller, code: error.code))
            emit(.logoutFailed, account, owner: record.ownerUID, reason: reason, code: error.code)
            audit(action, account, caller: caller, result: error.code.seedCode)
            return .failure(error)
        }
        machines[account]?.logoutFinished(succeeded: true)
        cleanUp(account)
        table.publish(account, nil)
        for purpose in TimedWork.Purpose.allCases { expiries.cancel(TimedWork(account: account, purpose: purpose)) }
        refreshStatus[account] = nil
        rearmExpiryTimer()
        revokeAtProvider(record)
        var logFields = fields(account, event: what.event.rawValue, caller: caller)
        logFields["reason"] = reason
        log.info("logged out", logFields)
        audit(action, account, caller: caller, result: "ok")
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
            let account = work.account
            guard case .loggedIn(let record)? = machines[account]?.state else { continue }
            switch work.purpose {
            case .expire:
                guard record.isExpired(at: now) else { continue }
                // After a suspend or a restart past the expiry, a refresh may still work:
                // only a session that cannot be refreshed now ends as tokenExpired.
                if let provider = client(for: account.provider), provider.canRefresh(record),
                    (try? await refresh(account, caller: nil)) != nil
                {
                    continue
                }
                guard case .loggedIn(let current)? = machines[account]?.state, current.isExpired(at: clock.now())
                else { continue }
                await end(account, reason: "tokenExpired", kind: .tokenExpired)
            case .maxLifetime:
                await end(account, reason: "maxSessionLifetime", kind: .tokenInvalid)
            case .refresh:
                Task { _ = try? await self.refresh(account, caller: nil) }
            case .saveRetry:
                do throws(VaultError) {
                    try await store.save(record)
                    refreshStatus[account, default: RefreshStatus()].unsaved = false
                    publishView(account)
                } catch {
                    expiries.schedule(work, at: now.adding(seconds: 5))
                }
            }
        }
        rearmExpiryTimer()
    }

    private func end(_ account: Account, reason: String, kind: EventKind) async {
        do throws(VaultError) {
            try await logout(account, caller: Caller.vaultd, reason: reason, kind: kind)
        } catch {
            log.error("a session could not be ended", fields(account, event: kind.rawValue, code: error.code))
        }
    }

    /// Schedules the hard expiry, the refresh and the maximum lifetime of a session.
    private func schedule(_ record: SessionRecord, refreshedAt: UnixTime) {
        let account = record.account
        if let expiresAt = record.expiresAt {
            expiries.schedule(TimedWork(account: account, purpose: .expire), at: expiresAt)
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
            expiries.schedule(TimedWork(account: account, purpose: .refresh), at: at)
            refreshStatus[account, default: RefreshStatus()].refreshAt = at
        }
        if let maximum = provider.oauth2?.maxSessionLifetime {
            expiries.schedule(
                TimedWork(account: account, purpose: .maxLifetime), at: record.createdAt.adding(seconds: maximum))
        }
    }

    // MARK: Refresh

    /// Refreshes the tokens of `account` now, or joins the refresh in flight.
    /// `caller` nil is vaultd's own scheduler.
    public func refresh(_ account: Account, caller: Caller?, respectBackoff: Bool = false) async throws(VaultError)
        -> SessionRecord
    {
        guard case .loggedIn(let record)? = machines[account]?.state else { throw .notLoggedIn(account) }
        if let caller, !policy.policy.maySee(caller, ownerUID: record.ownerUID) {
            throw VaultError(.accessDenied, "\(account) belongs to another user (uid \(record.ownerUID))")
        }
        if let task = refreshes[account] { return try await task.value.get() }
        if respectBackoff, let retryAt = refreshStatus[account]?.nextRetryAt, retryAt > clock.now() {
            // Clients asking for fresh tokens must not hammer a failing endpoint.
            throw VaultError(
                .networkError,
                "refreshing \(account) failed (\(refreshStatus[account]?.lastError ?? "unknown error")); the next try is at \(retryAt)"
            )
        }
        guard let provider = client(for: account.provider) else {
            throw VaultError(
                .tokenExpired, "provider '\(account.provider)' cannot refresh tokens; log \(account) in again")
        }
        guard provider.canRefresh(record) else {
            throw VaultError(.tokenExpired, "\(account) has no refresh token; log in again")
        }
        refreshGeneration += 1
        let generation = refreshGeneration
        let task = Task { () -> Result<SessionRecord, VaultError> in
            let result = await self.performRefresh(account, provider: provider, snapshot: record)
            // Only this refresh's entry: a newer session may have started its own meanwhile.
            if self.refreshGenerations[account] == generation {
                self.refreshes[account] = nil
                self.refreshGenerations[account] = nil
            }
            return result
        }
        refreshes[account] = task
        refreshGenerations[account] = generation
        return try await task.value.get()
    }

    /// A token valid at least `minValidSeconds` for `caller`, refreshing first when needed.
    public func freshToken(_ account: Account, minValidSeconds: Int64, caller: Caller) async throws(VaultError)
        -> SessionRecord
    {
        guard case .loggedIn(var record)? = machines[account]?.state else { throw .notLoggedIn(account) }
        guard policy.policy.mayReadToken(caller, account: account, ownerUID: record.ownerUID) else {
            throw VaultError(.accessDenied, "the token of \(account) is handed only to its owner")
        }
        if let expiresAt = record.expiresAt, expiresAt <= clock.now().adding(seconds: minValidSeconds) {
            record = try await refresh(account, caller: nil, respectBackoff: true)
        }
        if let expiresAt = record.expiresAt, expiresAt <= clock.now().adding(seconds: minValidSeconds) {
            throw VaultError(
                .tokenExpired,
                "the token of \(account) expires at \(expiresAt), before the \(minValidSeconds)s asked for")
        }
        return record
    }

    private func performRefresh(_ account: Account, provider: any TokenProvider, snapshot: SessionRecord) async
        -> Result<SessionRecord, VaultError>
    {
        setConnection(account, .connecting, reason: nil)
        let outcome = await provider.refresh(snapshot)
        // The session may have ended, or been replaced, while the request was out.
        guard case .loggedIn(let current)? = machines[account]?.state, current.tokens == snapshot.tokens
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
            var status = refreshStatus[account] ?? RefreshStatus()
            do throws(VaultError) {
                try await store.save(updated)
                status.unsaved = false
            } catch {
                status.unsaved = true
                expiries.schedule(TimedWork(account: account, purpose: .saveRetry), at: now.adding(seconds: 5))
                log.error(
                    "refreshed tokens could not be stored; kept in memory and retried",
                    fields(account, event: "tokenRefreshed", code: error.code))
            }
            guard case .loggedIn(let again)? = machines[account]?.state, again.tokens == snapshot.tokens else {
                // The session ended or was replaced while the write was out: put the
                // current record back if it is another session's.
                if case .loggedIn(let again)? = machines[account]?.state { try? await store.save(again) }
                if case .refreshed(let issued, _) = outcome { revokeOrphaned(issued, of: snapshot) }
                return .failure(.notLoggedIn(account))
            }
            machines[account]?.refreshed(updated)
            status.lastRefreshAt = now
            status.consecutiveFailures = 0
            status.lastError = nil
            status.nextRetryAt = nil
            refreshStatus[account] = status
            schedule(updated, refreshedAt: now)
            rearmExpiryTimer()
            publishView(account)
            log.info("token refreshed", fields(account, event: "tokenRefreshed"))
            events(
                VaultEvent(
                    kind: .tokenRefreshed, account: account, ownerUID: updated.ownerUID, time: now,
                    expiresAt: updated.expiresAt))
            setConnection(account, .connected, reason: nil)
            return .success(updated)
        case .transient(let reason, let retryAfter):
            var status = refreshStatus[account] ?? RefreshStatus()
            status.consecutiveFailures += 1
            status.lastError = reason
            let wait = RefreshPolicy.backoff(
                attempt: status.consecutiveFailures, random: Double.random(in: 0..<1), retryAfter: retryAfter)
            status.nextRetryAt = now.adding(seconds: wait)
            refreshStatus[account] = status
            expiries.schedule(TimedWork(account: account, purpose: .refresh), at: now.adding(seconds: wait))
            rearmExpiryTimer()
            log.warning(
                "refresh failed; the current token is still served and the refresh retried",
                fields(account, event: "connectFailed").merging(["reason": reason, "retryIn": String(wait)]) { a, _ in a
                })
            setConnection(account, .connectFailed, reason: reason)
            return .failure(VaultError(.networkError, "refreshing \(account) failed: \(reason); retrying in \(wait)s"))
        case .permanent(let code, let reason):
            refreshStatus[account, default: RefreshStatus()].lastError = reason
            log.error(
                "refresh refused; the session is logged out",
                fields(account, event: "tokenInvalid").merging(
                    ["reason": code]) { a, _ in a })
            await end(account, reason: "tokenInvalid", kind: .tokenInvalid)
            return .failure(
                VaultError(.invalidCredential, "the provider refused to refresh \(account) (\(code)); log in again"))
        }
    }

    private func setConnection(_ account: Account, _ state: ConnectionState, reason: String?) {
        guard
            let record = machines[account].flatMap({ machine -> SessionRecord? in
                if case .loggedIn(let record) = machine.state { return record }
                return nil
            })
        else { return }
        refreshStatus[account, default: RefreshStatus()].connection = state
        publishView(account)
        events(
            VaultEvent(
                kind: .connectionChanged, account: account, ownerUID: record.ownerUID, time: clock.now(),
                reason: reason.map { "\(state.rawValue): \($0)" } ?? state.rawValue))
    }

    private func publishView(_ account: Account) {
        guard case .loggedIn(let record)? = machines[account]?.state else { return }
        table.publish(account, SessionView(state: .logged, record: record, refresh: refreshStatus[account]))
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
            fields(snapshot.account, event: "revokeOrphaned"))
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
    private func cleanUp(_ account: Account) {
        if machines[account]?.state == .loggedOut {
            machines[account] = nil
            table.publish(account, nil)
        }
    }

    private nonisolated func fields(
        _ account: Account, event: String, caller: Caller? = nil, code: VaultError.Code? = nil
    )
        -> [String: String]
    {
        var f = ["provider": account.provider, "user": account.user, "event": event]
        if let caller {
            f["uid"] = String(caller.uid)
            f["pid"] = String(caller.pid)
        }
        if let code { f["code"] = code.seedCode }
        return f
    }
}

/// The audit trail: one structured line per token handout, login, logout and
/// kick, naming who (uid, pid, executable), what, which account and the result.
public enum Audit {
    /// Writes one audit line.
    public static func log(_ log: Logger, _ action: String, _ account: Account, caller: Caller, result: String) {
        // Already in key order: an audit line per token handout is on the serving path.
        log.log(
            .notice, "audit",
            sortedFields: [
                ("action", action), ("exe", caller.executable ?? "?"), ("pid", String(caller.pid)),
                ("provider", account.provider), ("result", result), ("uid", String(caller.uid)),
                ("user", account.user),
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

    var account: Account
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
