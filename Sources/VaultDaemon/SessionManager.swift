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

    /// A manager over `store`, reading time from `clock`.
    public init(
        store: any SessionStore, config: VaultConfig, clock: any WallClock, log: Logger,
        tableDidChange: @escaping @Sendable (SessionTable) -> Void = { _ in }
    ) {
        self.store = store
        self.config = config
        self.clock = clock
        self.log = log
        self.table = SessionTable(didChange: tableDidChange)
    }

    /// Returns at once when the manager is not stuck: the watchdog's probe.
    public func ping() {}

    /// Puts a new, fully validated configuration in force. Sessions of providers
    /// that are gone are kept (and reported): their tokens stay readable, new
    /// logins to those providers are refused.
    public func apply(_ newConfig: VaultConfig) -> (added: [String], removed: [String], orphaned: [Account]) {
        let old = Set(config.providers.keys)
        let new = Set(newConfig.providers.keys)
        config = newConfig
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
        }
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
                return (record, false)
            case .fail(let error):
                throw error
            case .joinInFlight:
                guard let task = logins[account] else { continue }
                return (try await task.value.get(), true)
            case .waitThenRetry:
                if let task = logouts[account] { _ = await task.value }
                continue
            case .startLogin:
                let record: SessionRecord
                do throws(VaultError) {
                    record = try makeRecord(request, account: account, caller: caller)
                } catch {
                    machines[account]?.loginFailed()
                    cleanUp(account)
                    throw error
                }
                table.publish(account, SessionView(state: .logging, record: nil))
                let task = Task { [store] () -> Result<SessionRecord, VaultError> in
                    do throws(VaultError) {
                        try await store.save(record)
                        return .success(record)
                    } catch {
                        return .failure(error)
                    }
                }
                logins[account] = task
                let result = await task.value
                logins[account] = nil
                switch result {
                case .success(let record):
                    machines[account]?.loginSucceeded(record)
                    table.publish(account, SessionView(state: .logged, record: record))
                    log.info("logged in", fields(account, event: "loginSuccess", caller: caller))
                    return (record, true)
                case .failure(let error):
                    machines[account]?.loginFailed()
                    cleanUp(account)
                    log.error(
                        "login failed", fields(account, event: "loginFailed", caller: caller, code: error.code))
                    throw error
                }
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging in; try again")
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
    public func logout(_ account: Account, caller: Caller) async throws(VaultError) {
        for _ in 0..<64 {
            var machine = machines[account] ?? AccountStateMachine(account: account)
            let action = machine.logoutRequested(by: caller)
            machines[account] = machine
            switch action {
            case .fail(let error):
                cleanUp(account)
                throw error
            case .joinInFlight:
                guard let task = logouts[account] else { continue }
                return try await task.value.get()
            case .waitThenRetry:
                if let task = logins[account] { _ = await task.value }
                continue
            case .startLogout(let record):
                let task = Task { [store] () -> Result<Void, VaultError> in
                    var marked = record
                    marked.phase = .loggingOut
                    do throws(VaultError) {
                        try await store.save(marked)
                        try await store.delete(account)
                        return .success(())
                    } catch {
                        return .failure(error)
                    }
                }
                logouts[account] = task
                let result = await task.value
                logouts[account] = nil
                switch result {
                case .success:
                    machines[account]?.logoutFinished(succeeded: true)
                    cleanUp(account)
                    table.publish(account, nil)
                    log.info("logged out", fields(account, event: "logoutSuccess", caller: caller))
                    return
                case .failure(let error):
                    machines[account]?.logoutFinished(succeeded: false)
                    log.error(
                        "logout failed", fields(account, event: "logoutFailed", caller: caller, code: error.code))
                    throw error
                }
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging out; try again")
    }

    /// Forgets the machine of an account that is logged out, so the table of
    /// machines holds only live accounts.
    private func cleanUp(_ account: Account) {
        if machines[account]?.state == .loggedOut {
            machines[account] = nil
            table.publish(account, nil)
        }
    }

    private func fields(_ account: Account, event: String, caller: Caller? = nil, code: VaultError.Code? = nil)
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
