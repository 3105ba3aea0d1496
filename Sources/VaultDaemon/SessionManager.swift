import Glibc
import VaultCore

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
    private var expiries = DeadlineQueue<Account>()
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
            table.publish(record.account, SessionView(state: .logged, record: record))
            if let expiresAt = record.expiresAt { expiries.schedule(record.account, at: expiresAt) }
        }
        rearmExpiryTimer()
        return (table.count, finished)
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
                let record: SessionRecord
                do throws(VaultError) {
                    record = try makeRecord(request, account: account, caller: caller)
                } catch {
                    machines[account]?.loginFailed()
                    cleanUp(account)
                    emit(.loginFailed, account, owner: caller.uid, code: error.code)
                    audit("Login", account, caller: caller, result: error.code.seedCode)
                    throw error
                }
                table.publish(account, SessionView(state: .logging, record: nil))
                // The task ends only after the state changed, so that whoever
                // awaits it (a joiner, a waiting logout) sees the new state.
                let task = Task { () -> Result<SessionRecord, VaultError> in
                    await self.commitLogin(record, caller: caller)
                }
                logins[account] = task
                loginOwners[account] = caller.uid
                return (try await task.value.get(), true)
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging in; try again")
    }

    /// Writes a new session to the store and publishes the outcome.
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
            machines[account]?.loginFailed()
            cleanUp(account)
            log.error("login failed", fields(account, event: "loginFailed", caller: caller, code: error.code))
            emit(.loginFailed, account, owner: caller.uid, code: error.code)
            audit("Login", account, caller: caller, result: error.code.seedCode)
            return .failure(error)
        }
        machines[account]?.loginSucceeded(record)
        table.publish(account, SessionView(state: .logged, record: record))
        if let expiresAt = record.expiresAt {
            expiries.schedule(account, at: expiresAt)
            rearmExpiryTimer()
        }
        log.info("logged in", fields(account, event: "loginSuccess", caller: caller))
        emit(.loginSuccess, account, owner: record.ownerUID)
        audit("Login", account, caller: caller, result: "ok")
        return .success(record)
    }

    private func makeRecord(_ request: LoginRequest, account: Account, caller: Caller) throws(VaultError)
        -> SessionRecord
    {
        let credential: LoginCredential
        switch (request.token, request.tokenResponse) {
        case (let token?, nil): credential = try LoginCredential(token: token)
        case (nil, let response?): credential = try LoginCredential(tokenResponse: response)
        case (nil, nil):
            throw VaultError(
                .invalidCredential, "no token given; pass either token or tokenResponse (vaultctl: on stdin)")
        case (_?, _?):
            throw VaultError(.invalidParameter, "pass either token or tokenResponse, not both")
        }
        let now = clock.now()
        let expiresAt = credential.expiry(explicit: request.expiresAt.map(UnixTime.init(seconds:)), now: now)
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

    /// Logs `account` out for `caller`: marks the stored record logging-out,
    /// then deletes it, so a crash in between finishes the logout at start-up.
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
                // Nobody gets the token from here on, even before the store answered.
                table.publish(account, SessionView(state: .logout, record: nil))
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
        if expiries.deadline(of: account) != nil {
            expiries.cancel(account)
            rearmExpiryTimer()
        }
        var logFields = fields(account, event: what.event.rawValue, caller: caller)
        logFields["reason"] = reason
        log.info("logged out", logFields)
        emit(what.event, account, owner: record.ownerUID, reason: reason)
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
        let delay = max(0, next.deadline.seconds - clock.now().seconds)
        expiryTimer = Task {
            if delay > 0 {
                // Whole seconds, as the deadlines are: waking late by under a second is fine.
                try? await Task.sleep(for: .seconds(delay))
            }
            if Task.isCancelled { return }
            await self.expireDueSessions()
        }
    }

    /// Ends every session whose token has expired (a static provider cannot
    /// refresh it): the session goes to logout with reason tokenExpired.
    func expireDueSessions() async {
        let now = clock.now()
        for account in expiries.popDue(at: now) {
            guard case .loggedIn(let record)? = machines[account]?.state, record.isExpired(at: now) else { continue }
            do throws(VaultError) {
                try await logout(account, caller: Caller.vaultd, reason: "tokenExpired", kind: .tokenExpired)
            } catch {
                log.error(
                    "an expired session could not be ended", fields(account, event: "tokenExpired", code: error.code))
            }
        }
        rearmExpiryTimer()
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
        log.notice(
            "audit",
            [
                "action": action, "provider": account.provider, "user": account.user, "uid": String(caller.uid),
                "pid": String(caller.pid), "exe": caller.executable ?? "?", "result": result,
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
