import Varlink
import VaultCore
import VaultSystem

/// Login and logout: the session's key is decided by the access policy, the
/// login and logout state machine says what to do, the store is written
/// before anything is acknowledged.
extension SessionManager {
    // MARK: Login

    /// Logs `request` in for `caller`; answers the existing session when it
    /// is already logged in (created false). The session is the caller's own,
    /// the declared owner's for a declared account, or, for an administrator,
    /// the one `request.ownerUID` names.
    public func login(_ request: LoginRequest, caller: Caller) async throws(VaultError) -> (SessionRecord, Bool) {
        let (record, outcome) = try await loginOrReplace(request, caller: caller)
        return (record, outcome != .existing)
    }

    /// The account, provider and session a login of `request` by `caller`
    /// would log in, when `caller` may: the checks every login passes first
    /// (the device flow's too, before it asks the provider anything).
    func admitLogin(_ request: LoginRequest, caller: Caller) throws(VaultError) -> (
        Account, ProviderConfig, SessionKey
    ) {
        let account = try Account.validate(provider: request.provider, user: request.user)
        guard let provider = config.providers[account.provider] else {
            throw .unknownProvider(account.provider, in: config)
        }
        let access = policy.policy
        let key = SessionKey(
            owner: try access.owner(of: account, for: caller, requested: request.ownerUID), account: account)
        if let declaration = access.declared[account], declaration.owner != key.owner {
            throw VaultError(
                .invalidParameter,
                "[Account \(account.provider) \(account.user)] is declared for uid \(declaration.owner) (Owner=); no other user's session of it can be logged in"
            )
        }
        guard access.mayManage(caller, key) else {
            Audit.log(log, "Login", key, by: .peer(caller), result: VaultError.Code.accessDenied.seedCode)
            throw access.declared[account] != nil
                ? VaultError(
                    .accessDenied,
                    "[Account \(account.provider) \(account.user)] is declared for uid \(key.owner) (Owner=); only that user, root or the admin group may log it in or out"
                ) : AccessPolicy.notYours(key)
        }
        if Self.mints(request, provider: provider), !access.mayMint(caller, account) {
            Audit.log(log, "Login", key, by: .peer(caller), result: VaultError.Code.accessDenied.seedCode)
            throw AccessPolicy.mintDenied(account)
        }
        return (account, provider, key)
    }

    /// `login`, saying whether the session was created, already there, or
    /// had its tokens replaced (`request.replace`, see SessionManager+Replace.swift).
    func loginOrReplace(_ request: LoginRequest, caller: Caller) async throws(VaultError) -> (
        SessionRecord, LoginOutcome
    ) {
        let (account, provider, key) = try admitLogin(request, caller: caller)
        // Bounded: each pass waits for one in-flight operation to end.
        for _ in 0..<64 {
            if request.replace, let task = entries[key]?.refresh {
                // The replaced tokens' refresh ends first (and any end it brings).
                _ = await task.value
                continue
            }
            var entry = entries[key] ?? makeEntry(account)
            let action =
                request.replace
                ? entry.machine.replaceRequested()
                : entry.machine.loginRequested(
                    asksProvider: Self.asksProvider(request, provider: provider), now: clock.now())
            entries[key] = entry
            switch action {
            case .backingOff(let backoff):
                Audit.log(log, "Login", key, by: .peer(caller), result: VaultError.Code.loginBackingOff.seedCode)
                throw Self.backingOff(account, backoff)
            case .returnExisting(let record):
                if entries[key]?.timers.status.unsaved == true {
                    // Acknowledged only once the store holds what is served.
                    do throws(VaultError) {
                        try await store.apply(.save(record))
                    } catch {
                        Audit.log(log, "Login", key, by: .peer(caller), result: error.code.seedCode)
                        throw error
                    }
                    // A refresh may have replaced the tokens meanwhile: look again.
                    guard entries[key]?.record?.tokens == record.tokens else { continue }
                    handle(key, .saved)
                }
                Audit.log(log, "Login", key, by: .peer(caller), result: "ok")
                return (record, .existing)
            case .joinInFlight:
                guard let task = entries[key]?.login else { continue }
                let record = try await task.value.get()
                Audit.log(log, "Login", key, by: .peer(caller), result: "ok")
                return (record, .created)
            case .waitThenRetry:
                await waitForChangeInFlight(key)
                continue
            case .startReplace(let old):
                return (try await startReplace(request, key: key, replacing: old, caller: caller), .replaced)
            case .startLogin:
                if let refusal = newLoginRefusal(key) { throw refuseNewLogin(key, refusal, caller) }
                if provider.singleAccount, let other = otherSession(of: key) {
                    // Account switching (OpenIM), within one owner's sessions: the old
                    // session is logged out first.
                    entries[key]?.machine.loginFailed()
                    forget(key)
                    log.info("switching accounts", fields(other, event: "switch", by: .peer(caller)))
                    do throws(VaultError) {
                        try await performLogout(other, by: .peer(caller), reason: "switched")
                    } catch  where error.code == .notLoggedIn {
                        // Gone meanwhile: nothing to switch from.
                    }
                    continue
                }
                // Charged once the login goes ahead (a switch above passes here twice).
                if Self.asksProvider(request, provider: provider) {
                    do throws(VaultError) {
                        try chargeProviderRequest(
                            chargedUID(.peer(caller), owner: key.owner), "the login of \(account) at the provider")
                    } catch {
                        throw refuseNewLogin(key, error, caller)
                    }
                }
                table.publish(key, SessionView(state: .logging, record: nil))
                // The task ends only after the state changed, so that whoever
                // awaits it (a joiner, a waiting logout) sees the new state.
                let task = Task { () -> Result<SessionRecord, VaultError> in
                    await self.performLogin(request, key: key, by: .peer(caller))
                }
                entries[key]?.login = task
                return (try await task.value.get(), .created)
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging in; try again")
    }

    /// Why a new session of `key` may not begin now, before the provider is
    /// asked: the store cannot keep what it would mint; the owner's
    /// revocations the provider has not taken yet hold places (each
    /// session's tokens are revoked at its end); the owner holds the most
    /// sessions one user may.
    func newLoginRefusal(_ key: SessionKey) -> VaultError? {
        if let refusal = gate.health.refusal { return refusal }
        if let refusal = revocationRefusal(owner: key.owner) { return refusal }
        if key.owner != 0, table.sessionCount(of: key.owner) >= config.limits.sessionsPerUser {
            return VaultError(
                .tooManySessions,
                "uid \(key.owner) already holds \(config.limits.sessionsPerUser) sessions, the most one user may (MaxSessionsPerUser=); log one out first"
            )
        }
        return nil
    }

    /// A login about to start is refused with `error`: the account is
    /// logged out again (an automatic one logged in later), and the refusal
    /// audited.
    func refuseNewLogin(_ key: SessionKey, _ error: VaultError, _ caller: Caller) -> VaultError {
        abandonLogin(key)
        forget(key)
        Audit.log(log, "Login", key, by: .peer(caller), result: error.code.seedCode)
        return error
    }

    /// Another session of the owner of `key` at the same provider, not logged out.
    func otherSession(of key: SessionKey) -> SessionKey? {
        entries.first(where: {
            $0.key.owner == key.owner && $0.key.account.provider == key.account.provider && $0.key != key
                && $0.value.machine.state != .loggedOut
        })?.key
    }

    /// True when `request` has the provider issue tokens with its own
    /// credential: a login without a token, or any login through an exec
    /// helper (which refreshes with the provider's credential, even a
    /// session that began with the client's token).
    static func mints(_ request: LoginRequest, provider: ProviderConfig) -> Bool {
        provider.type == .exec || asksProvider(request, provider: provider)
    }

    /// True when the login itself asks the provider for tokens: the client
    /// brought none. A token the client brings is the session's, whatever
    /// the provider (CometChat's `login(authToken)`).
    static func asksProvider(_ request: LoginRequest, provider: ProviderConfig) -> Bool {
        provider.type != .static && request.token == nil && request.tokenResponse == nil
    }

    /// Why the provider gave no tokens for a login or a replace: the error for
    /// the client (with the provider's own code and words) and its `Retry-After`.
    struct ProviderRefusal: Error {
        var error: VaultError
        var retryAfter: Int64?
    }

    /// The tokens a login (or a replace) gets from the provider, when the
    /// client brought none; nil when the client's own tokens are used.
    /// `failure` begins the message of a transient failure ("logging alice @
    /// demo in failed").
    func credentialFromProvider(_ request: LoginRequest, account: Account, failure: String) async
        -> Result<LoginCredential?, ProviderRefusal>
    {
        guard request.token == nil, request.tokenResponse == nil, let provider = client(for: account.provider) else {
            return .success(nil)
        }
        switch await provider.login(account) {
        case .refreshed(let tokens, let expiresIn, let profile):
            return .success(LoginCredential(tokens: tokens, expiresIn: expiresIn, profile: profile))
        case .transient(let reason, let retryAfter, let code):
            return .failure(
                ProviderRefusal(
                    error: ProviderFailure.transient(code: code, reason: reason, message: "\(failure): \(reason)"),
                    retryAfter: retryAfter))
        case .permanent(let code, let reason):
            return .failure(
                ProviderRefusal(
                    error: ProviderFailure.refusal(
                        code: code, reason: reason, message: "the provider refused \(account): \(reason)")))
        }
    }

    /// Builds the session (asking the provider for tokens when the client
    /// brought none), then stores it.
    func performLogin(_ request: LoginRequest, key: SessionKey, by principal: Principal) async -> Result<
        SessionRecord, VaultError
    > {
        let account = key.account
        let obtained: LoginCredential?
        switch await credentialFromProvider(request, account: account, failure: "logging \(account) in failed") {
        case .success(let credential): obtained = credential
        case .failure(let refusal):
            return failLogin(key, principal, refusal.error, retryAfter: refusal.retryAfter, fromProvider: true)
        }
        let record: SessionRecord
        do throws(VaultError) {
            record = try makeRecord(request, key: key, obtained: obtained)
        } catch {
            return failLogin(key, principal, error)
        }
        return await commitLogin(record, by: principal)
    }

    /// Ends a login that failed: subscribers get `loginFailed` with the
    /// error's codes and messages. A failure of a login that asked the provider
    /// (`fromProvider`), or of an automatic account's login, starts or
    /// lengthens the account's backoff (`retryAfter`: the server's).
    func failLogin(
        _ key: SessionKey, _ principal: Principal, _ error: VaultError, retryAfter: Int64? = nil,
        fromProvider: Bool = false
    ) -> Result<SessionRecord, VaultError> {
        entries[key]?.login = nil
        if var entry = entries[key], fromProvider || principal == .vaultd || entry.machine.autoLogin {
            let again = entry.machine.loginFailed(error, retryAfter: retryAfter, random: random(), now: clock.now())
            entries[key] = entry
            performAutoLogin(again, key)
        } else {
            entries[key]?.machine.loginFailed()
        }
        forget(key)
        wakeLoginWaiters(key)
        log.error("login failed", fields(key, event: "loginFailed", by: principal, code: error.code))
        emit(.loginFailed, key, cause: EndCause(error))
        Audit.log(log, "Login", key, by: principal, result: error.code.seedCode)
        return .failure(error)
    }

    /// Writes the new session's record, then takes the outcome in one step.
    func commitLogin(_ record: SessionRecord, by principal: Principal) async -> Result<SessionRecord, VaultError> {
        let write = SessionWrite(key: record.key, before: nil, steps: [.save(record)])
        return loginWritten(record, await write.perform(on: store, delete: sharing.deleteRecord), by: principal)
    }

    /// Takes the outcome of a login's write: the session is served,
    /// scheduled and announced, or the login failed.
    func loginWritten(_ record: SessionRecord, _ outcome: SessionWrite.Outcome, by principal: Principal) -> Result<
        SessionRecord, VaultError
    > {
        let key = record.key
        defer { entries[key]?.login = nil }
        if case .failed(let error, _, _) = outcome { return failLogin(key, principal, error) }
        entries[key]?.machine.loginSucceeded(record)
        renewParkedEntry(key)
        // Scheduled before it is published, so that the view shows when the refresh is due.
        handle(key, .stored(facts(record, refreshedAt: clock.now()), now: clock.now()))
        log.info("logged in", fields(key, event: "loginSuccess", by: principal))
        emit(.loginSuccess, key)
        Audit.log(log, "Login", key, by: principal, result: "ok")
        wakeLoginWaiters(key)
        return .success(record)
    }

    func makeRecord(_ request: LoginRequest, key: SessionKey, obtained: LoginCredential? = nil)
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
        if expiresAt == nil {
            // Salesforce sends no expires_in: the provider's DefaultLifetime=, when
            // set; else the token does not expire (CometChat's auth tokens).
            expiresAt = RefreshPolicy.expiresAt(
                issuedAt: credential.tokens.issuedAt ?? now, expiresIn: nil,
                defaultLifetime: config.providers[account.provider]?.defaultLifetime)
        }
        if let expiresAt, expiresAt > UnixTime.latestExpiry {
            throw VaultError(.invalidParameter, "the expiry of the token for \(account) is past the year 9999")
        }
        if let expiresAt, expiresAt <= now {
            throw VaultError(
                .tokenExpired,
                "the token for \(account) expired at \(expiresAt) (now \(now)); obtain a new token and log in again")
        }
        // The client's profile wins; else what the provider's answer or the
        // token response (an id_token's claims) said; else the uid alone.
        var profile = credential.profile?.owned(by: account.user) ?? UserProfile(uid: account.user)
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
        try await performLogout(key, by: .peer(caller), reason: reason, kind: kind)
    }

    /// `logout` for a peer, or for vaultd itself (an expiry, a refused grant).
    /// `cause` says why vaultd ends a session (its `tokenInvalid`).
    func performLogout(
        _ key: SessionKey, by principal: Principal, reason: String? = nil, kind: EventKind? = nil,
        cause: EndCause? = nil
    ) async throws(VaultError) {
        let account = key.account
        let action = LogoutKind(reason: reason, kind: kind).auditAction
        if let caller = principal.caller, !policy.policy.mayManage(caller, key) {
            Audit.log(log, action, key, by: principal, result: VaultError.Code.accessDenied.seedCode)
            throw AccessPolicy.notYours(key)
        }
        if entries[key] == nil {
            // A fleet's host: another host may have logged it in a moment ago,
            // ahead of this host's feed (as for Refresh and GetToken).
            do throws(VaultError) {
                try await sharing.catchUp(key, self)
            } catch {
                Audit.log(log, action, key, by: principal, result: error.code.seedCode)
                throw error
            }
        }
        for _ in 0..<64 {
            switch try beginLogout(key, by: principal, reason: reason, kind: kind, cause: cause) {
            case .underWay(let task): return try await task.value.get()
            case .afterChangeInFlight: await waitForChangeInFlight(key)
            case .again: continue
            }
        }
        throw VaultError(.loginInProgress, "\(account) kept changing while logging out; try again")
    }

    /// How `beginLogout` went.
    enum LogoutStart {
        /// A logout is under way, begun by this call or joined: its task ends
        /// once the store and the table agree.
        case underWay(Task<Result<Void, VaultError>, Never>)
        /// A login or replace of the session is in flight: begin again after it.
        case afterChangeInFlight
        /// The session changed meanwhile: begin again now.
        case again
    }

    /// The part of a logout that does not wait: refused while the store
    /// cannot take it, else the token is withdrawn from the table, every
    /// subscriber told, and the store's part (`commitLogout`) started.
    /// Throws (and audits) when there is nothing to log out.
    func beginLogout(
        _ key: SessionKey, by principal: Principal, reason: String?, kind: EventKind?, cause: EndCause?
    ) throws(VaultError) -> LogoutStart {
        let action = LogoutKind(reason: reason, kind: kind).auditAction
        if let refusal = gate.health.refusal, let entry = entries[key], entry.record != nil, entry.logout == nil {
            // Refused before the token is withdrawn: a logout the store cannot
            // take would be served again, and back after a restart.
            Audit.log(log, action, key, by: principal, result: refusal.code.seedCode)
            throw refusal
        }
        var entry = entries[key] ?? makeEntry(key.account)
        let step = entry.machine.logoutRequested()
        entries[key] = entry
        switch step {
        case .fail(let error):
            forget(key)
            Audit.log(log, action, key, by: principal, result: error.code.seedCode)
            throw error
        case .joinInFlight:
            guard let task = entries[key]?.logout else { return .again }
            return .underWay(task)
        case .waitThenRetry:
            return .afterChangeInFlight
        case .startLogout(let record):
            // Nobody gets the token from here on, even before the store answered,
            // and every subscriber learns so now: the store's writes take tens of
            // milliseconds (gnome-keyring rewrites its file), a client should not
            // go on using the token meanwhile.
            table.publish(key, SessionView(state: .logout, record: nil))
            emit(LogoutKind(reason: reason, kind: kind).event, key, reason: reason, cause: cause)
            let task = Task { () -> Result<Void, VaultError> in
                await self.commitLogout(record, by: principal, reason: reason, kind: kind)
            }
            entries[key]?.logout = task
            return .underWay(task)
        }
    }

    /// The store's part of a logout, then its outcome taken in one step,
    /// then the revocations of the tokens refreshes replaced; the task that
    /// runs this ends only after the state changed. The stored record is
    /// marked logging-out with the revocation it needs, that revocation
    /// queued and the record deleted (`SessionWrite`): a SIGTERM or a crash
    /// at any point finishes the logout at the next start and loses no
    /// revocation.
    func commitLogout(_ record: SessionRecord, by principal: Principal, reason: String?, kind: EventKind?) async
        -> Result<Void, VaultError>
    {
        let what = LogoutKind(reason: reason, kind: kind)
        let provider = client(for: record.account.provider)
        let revocation = provider?.revokes(record) == true ? PendingRevocation(queueing: record) : nil
        var marked = record
        marked.phase = .loggingOut
        marked.revocationID = revocation?.id
        let write = SessionWrite(
            key: record.key, before: record,
            steps: [.save(marked)] + (revocation.map { [.queue($0)] } ?? [])
                + [.delete(SessionEnding(kind: what.event, reason: reason))])
        let outcome = await write.perform(on: store, delete: sharing.deleteRecord)
        switch logoutWritten(record, outcome, revocation: revocation, provider: provider, by: principal, what, reason) {
        case .failure(let error): return .failure(error)
        case .success(let effects):
            await perform(effects)
            return .success(())
        }
    }

    /// Takes the outcome of a logout's write: the session ends (and an
    /// automatic account's next login is scheduled, the revocation started),
    /// or, the write failed, it is served again, scheduled anew, and written
    /// again where the store was not put back. Answers the revocations of
    /// the access tokens refreshes replaced, for the caller to queue.
    func logoutWritten(
        _ record: SessionRecord, _ outcome: SessionWrite.Outcome, revocation: PendingRevocation?,
        provider: (any TokenProvider)?, by principal: Principal, _ what: LogoutKind, _ reason: String?
    ) -> Result<[StoreEffect], VaultError> {
        let key = record.key
        entries[key]?.logout = nil
        if case .failed(let error, let restored, let stillQueued) = outcome {
            entries[key]?.machine.logoutFinished(succeeded: false)
            entries[key]?.unqueue = stillQueued
            // Deadlines that came due while the logout was out were dropped: schedule anew.
            handle(
                key, .stored(facts(record, refreshedAt: record.tokens.issuedAt ?? record.createdAt), now: clock.now()))
            if !restored || stillQueued != nil { handle(key, .storeStale(now: clock.now())) }
            log.error("logout failed", fields(key, event: "logoutFailed", by: principal, code: error.code))
            emit(.logoutFailed, key, reason: reason, cause: EndCause(error))
            Audit.log(log, what.auditAction, key, by: principal, result: error.code.seedCode)
            return .failure(error)
        }
        // Replaced tokens whose successor's write was still pending: the store holds neither now.
        let replaced = replacedRevocations(of: key)
        entries[key]?.machine.logoutFinished(succeeded: true)
        let again = entries[key]?.machine.sessionEnded(what.event, now: clock.now()) ?? []
        forget(key)
        performAutoLogin(again, key)
        rearmTimer()
        if let revocation, let provider {
            startRevocation(revocation, provider: provider, chargedTo: chargedUID(principal, owner: key.owner))
        }
        var logFields = fields(key, event: what.event.rawValue, by: principal)
        logFields["reason"] = reason
        log.info("logged out", logFields)
        Audit.log(log, what.auditAction, key, by: principal, result: "ok")
        return .success(replaced)
    }
}
