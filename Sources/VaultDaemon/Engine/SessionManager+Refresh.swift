import Varlink
import VaultCore

/// The timed life of sessions: the one timer, the actions of `SessionTimers`,
/// refresh (single-flight per session), and the token handout that may wait
/// for one.
extension SessionManager {
    // MARK: The lifecycle state machine's actions

    /// Feeds `event` to the session's `SessionTimers` and performs what it
    /// returns: deadlines into the queue, refreshes and save retries as
    /// background work, an end as vaultd's own logout (begun now, finished
    /// in the background). It does not wait for anything: the session's
    /// state changes in one step.
    func handle(_ key: SessionKey, _ event: SessionTimers.Event) {
        guard var entry = entries[key] else { return }
        let actions = entry.timers.handle(event)
        entries[key] = entry
        perform(actions, for: key)
    }

    /// Does what the timers of the session `key` (its entry updated) asked for.
    func perform(_ actions: [SessionTimers.Action], for key: SessionKey) {
        var ending: (reason: String, kind: EventKind)?
        for action in actions {
            switch action {
            case .schedule(let timer, let at):
                deadlines.schedule(TimedWork(key: key, timer: timer), at: at)
            case .cancel(let timer):
                deadlines.cancel(TimedWork(key: key, timer: timer))
            case .startRefresh:
                spawn { await self.scheduledRefresh(key) }
            case .persist:
                spawn { await self.persist(key) }
            case .end(let reason, let kind):
                ending = (reason, kind)
            case .connection(let state, let failure):
                events(
                    VaultEvent(
                        kind: .connectionChanged, account: key.account, ownerUID: key.owner, time: clock.now(),
                        reason: state.rawValue, code: failure?.code.seedCode,
                        message: failure.map { SessionManager.eventMessage($0.message) }, source: .vaultd,
                        providerCode: failure?.providerCode,
                        providerMessage: failure?.providerMessage.map(SessionManager.eventMessage)))
            }
        }
        publishView(key)
        rearmTimer()
        if let ending { end(key, reason: ending.reason, kind: ending.kind) }
    }

    /// Sets the alarm for the nearest deadline: a session's, the pending
    /// logins' expiry, the store's next probe, the next revocation's time or
    /// the end of a wait (`Waiter`); in shutdown's grace only the last two,
    /// and none after it. One alarm for all; set again whenever the nearest
    /// deadline may have changed.
    func rearmTimer() {
        guard !runningDueWork, !restoring else { return }
        let waitsEnd = waiters.values.lazy.filter { $0.continuation != nil }.map(\.deadline).min()
        let nearest: Double?
        if !stopping {
            nearest = [
                deadlines.next.map { Double($0.deadline.seconds) }, pendingLoginsExpire.map { Double($0.seconds) },
                probeAt, traffic.wakeAt, waitsEnd,
            ].compactMap { $0 }.min()
        } else {
            nearest = graceEndsAt == nil ? nil : [traffic.wakeAt, waitsEnd].compactMap { $0 }.min()
        }
        guard nearest != alarmAt else { return }
        alarmAt = nearest
        alarm?.setAlarm(at: nearest) { [unowned self] in
            // Run by the engine on its thread, this actor's executor.
            self.assumeIsolated { manager in
                manager.alarmAt = nil
                manager.runDueWork()
            }
        }
    }

    /// Does what is due at the clock's now: ends sessions whose token expired
    /// (or whose maximum lifetime passed), starts refreshes, retries unsaved
    /// writes, drops the pending interactive logins past their expiry,
    /// probes the store, sends the queued revocations, ends the waits that
    /// are over (`Waiter`). In shutdown's grace only the last two, and
    /// nothing after it. The alarm calls it; the tests call it after moving
    /// their clocks.
    public func runDueWork() {
        guard !stopping || graceEndsAt != nil else { return }
        let now = clock.now()
        let preciseNow = clock.preciseNow()
        // The alarm is set once, at the end, not at each session's change.
        runningDueWork = true
        if !stopping {
            for work in deadlines.popDue(at: now) {
                if work.timer == .login {
                    autoLoginDue(work.key)
                    continue
                }
                guard let record = entries[work.key]?.record else { continue }
                handle(work.key, .due(work.timer, now: now, expired: record.isExpired(at: now)))
            }
            if let expire = pendingLoginsExpire, expire <= now { dropExpiredLogins() }
            if let at = probeAt, at <= preciseNow {
                probeAt = nil
                spawn { await self.probeStore() }
            }
        }
        if let at = traffic.wakeAt, at <= preciseNow, traffic.worker == nil {
            startRevocationWorker(evenWhenStopping: true)
        }
        wakeWaiters(dueAt: preciseNow)
        runningDueWork = false
        rearmTimer()
    }

    /// A refresh the schedule asked for. One that cannot begin (the provider
    /// cannot refresh this session any more) is reported to the session's
    /// timers, which end an expired session instead of waiting for nothing.
    func scheduledRefresh(_ key: SessionKey) async {
        do throws(VaultError) {
            _ = try await refresh(key, caller: nil)
        } catch  where error.code == .cannotRefresh {
            guard let record = entries[key]?.record, entries[key]?.refresh == nil else { return }
            handle(key, .refreshImpossible(expired: record.isExpired(at: clock.now())))
        } catch {
            // Reported by the refresh itself (its outcome went to the timers).
        }
    }

    /// Writes the session's current record again (refreshed tokens whose first write failed).
    func persist(_ key: SessionKey) async {
        guard let entry = entries[key], entry.record != nil else { return }
        if let revocation = entry.unqueue {
            // A failed logout's revocation must not outlive it.
            guard (try? await store.apply(.deletePendingRevocation(revocation))) != nil else {
                handle(key, .saveFailed(now: clock.now()))
                return
            }
            if entries[key]?.id == entry.id { entries[key]?.unqueue = nil }
        }
        await sharing.persist(key, entryID: entry.id, self)
    }

    /// Logs the session out as vaultd itself. What does not wait happens
    /// now (`beginLogout`: the token is withdrawn, subscribers are told); the
    /// store's part finishes in the background, and an end that failed there
    /// is tried again later (`SessionTimers`' `endFailed`).
    func end(_ key: SessionKey, reason: String, kind: EventKind) {
        let lifetime =
            reason == "maxSessionLifetime" ? config.providers[key.account.provider]?.oauth2?.maxSessionLifetime : nil
        let cause =
            lifetime.map { EndCause(message: "the session reached its MaxSessionLifetime= of \($0) s; log in again") }
            ?? entries[key]?.endCause
        let begun: LogoutStart
        do throws(VaultError) {
            begun = try beginLogout(key, by: .vaultd, reason: reason, kind: kind, cause: cause)
        } catch {
            return endFailed(key, reason: reason, kind: kind, error)
        }
        switch begun {
        case .underWay(let task):
            spawn(evenWhenStopping: true) {
                if case .failure(let error) = await task.value {
                    await self.endFailed(key, reason: reason, kind: kind, error)
                }
            }
        case .afterChangeInFlight, .again:
            spawn(evenWhenStopping: true) {
                do throws(VaultError) {
                    try await self.performLogout(key, by: .vaultd, reason: reason, kind: kind, cause: cause)
                } catch {
                    await self.endFailed(key, reason: reason, kind: kind, error)
                }
            }
        }
    }

    /// vaultd's own end of `key` failed: logged, and tried again later
    /// unless the session is gone.
    private func endFailed(_ key: SessionKey, reason: String, kind: EventKind, _ error: VaultError) {
        log.error("a session could not be ended", fields(key, event: kind.rawValue, by: .vaultd, code: error.code))
        if error.code != .notLoggedIn { handle(key, .endFailed(reason: reason, kind: kind, now: clock.now())) }
    }

    // MARK: Refresh

    /// Refreshes the tokens of the session `key` now, or joins the refresh in
    /// flight. `caller` nil is vaultd's own scheduler; a refresh a client asked
    /// for (`Refresh`, or `GetToken` through `freshToken`) waits out the
    /// backoff of failed ones and starts at most once per
    /// `MinRefreshInterval=` after the last attempt while the token has not
    /// expired (`ClientRefresh`), and a `Refresh` comes out of the caller's
    /// `ProviderBudget`. On a host
    /// of a fleet, tokens obtained and not written to the shared store are
    /// served from this host, and the refresh throws the store's error.
    public func refresh(
        _ key: SessionKey, caller: Caller?, clientAsked: Bool = false, respectBackoff: Bool = false
    ) async throws(VaultError) -> SessionRecord {
        let account = key.account
        if let caller, !policy.policy.mayManage(caller, key) { throw AccessPolicy.notYours(key) }
        if let task = entries[key]?.replace { _ = await task.value }
        if entries[key] == nil { try await sharing.catchUp(key, self) }
        guard let entry = entries[key], let record = entry.record else { throw .notLoggedIn(account) }
        if let task = entry.refresh { return try await task.value.get() }
        let now = clock.now()
        let status = entry.timers.status
        if respectBackoff, let retryAt = status.nextRetryAt, retryAt > now {
            // Clients asking for fresh tokens must not hammer a failing endpoint.
            throw VaultError(
                .networkError,
                "refreshing \(account) failed (\(status.lastError ?? "unknown error")); the next try is at \(retryAt)")
        }
        guard client(for: account.provider) != nil else {
            throw VaultError(
                .cannotRefresh, "provider '\(account.provider)' cannot refresh tokens; log \(account) in again")
        }
        guard let provider = renewer(for: record) else {
            throw VaultError(.cannotRefresh, "\(account) has no refresh token; log in again")
        }
        guard !entry.timers.refused else {
            throw VaultError(
                .invalidCredential,
                "the provider refused to refresh \(account) and it is being logged out; log in again")
        }
        if clientAsked {
            // One local user must not be able to make vaultd hammer the token
            // endpoint (and get a shared client_id rate-limited for everyone).
            if let refusal = ClientRefresh.refusal(
                account, status: status, expired: record.isExpired(at: now),
                minIntervalSeconds: config.limits.minRefreshIntervalSeconds, now: now)
            {
                throw refusal
            }
            try chargeProviderRequest(
                caller.flatMap { chargedUID(.peer($0), owner: key.owner) }, "the refresh of \(account)")
        }
        handle(key, .refreshStarted)
        let id = entry.id
        sharing.refreshDecided(key)
        let task = Task { () -> Result<SessionRecord, VaultError> in
            await self.sharing.refresh(key, entryID: id, provider: provider, snapshot: record, self)
        }
        entries[key]?.refresh = task
        let result = await task.value
        refreshEnded(key, entryID: id, task)
        return try result.get()
    }

    /// The refresh `task` of the entry `entryID` is over: the entry must not
    /// go on showing it in flight (later refreshes and GetTokens would join
    /// a task that ended), nor its timers wait for it. Each way a refresh
    /// ends says so itself; one that did not is ended here, by the call
    /// that started it.
    private func refreshEnded(
        _ key: SessionKey, entryID: UInt64, _ task: Task<Result<SessionRecord, VaultError>, Never>
    ) {
        guard entries[key]?.id == entryID, entries[key]?.refresh == task else { return }
        entries[key]?.refresh = nil
        if entries[key]?.timers.refreshing == true { handle(key, .refreshAbandoned) }
    }

    /// The token source that renews the session of `record` ahead of its
    /// expiry (`Renewal`): the provider, when it can refresh the session; the
    /// provider minting anew (`MintingRenewal`), for the session of an
    /// account vaultd keeps logged in itself (`AutoLogin=yes`) that holds
    /// nothing to refresh with; else nil, and the session ends at its expiry.
    func renewer(for record: SessionRecord) -> (any TokenProvider)? {
        // Every provider with a token source issues tokens with its own
        // credential (client credentials, an exec helper); a static one has none.
        guard let provider = client(for: record.account.provider) else { return nil }
        let account = record.account
        let keptAlive = config.accounts[account]?.autoLogin == true && autoLoginKey(account) == record.key
        switch Renewal.of(refreshes: provider.canRefresh(record), mints: true, keptAlive: keptAlive) {
        case .refresh: return provider
        case .mint: return MintingRenewal(provider)
        case .none: return nil
        }
    }

    /// `refresh` for a caller that needs the new token, not the refresh's
    /// acknowledgement (GetToken, a client's report of a rejected token):
    /// tokens refreshed from `record` and not yet in a fleet's shared store
    /// are served all the same.
    func refreshForUse(_ key: SessionKey, from record: SessionRecord) async throws(VaultError) -> SessionRecord {
        do throws(VaultError) {
            return try await refresh(key, caller: nil, clientAsked: true, respectBackoff: true)
        } catch {
            guard error.code == .storeUnavailable || error.code == .storeFailed,
                let served = entries[key]?.record, served.tokens != record.tokens
            else { throw error }
            return served
        }
    }

    /// The facts `TokenHandout` decides on, for a session's entry.
    func handoutFacts(_ entry: AccountEntry, _ record: SessionRecord) -> TokenHandout.Facts {
        TokenHandout.Facts(
            account: record.account, expiresAt: record.expiresAt,
            issuedAt: record.tokens.issuedAt ?? record.createdAt, lastRefreshAt: entry.timers.status.lastRefreshAt,
            canRefresh: renewer(for: record) != nil,
            minRefreshIntervalSeconds: config.limits.minRefreshIntervalSeconds)
    }

    /// A token valid at least `minValidSeconds` for `caller`, refreshing first
    /// when `TokenHandout` says so (the serving thread's fast path decides
    /// with the same rule).
    public func freshToken(_ key: SessionKey, minValidSeconds: Int64, caller: Caller) async throws(VaultError)
        -> SessionRecord
    {
        let account = key.account
        if let task = entries[key]?.replace { _ = await task.value }
        guard let entry = entries[key], let record = entry.record else { throw .notLoggedIn(account) }
        guard policy.policy.mayReadToken(caller, key) else {
            throw VaultError(.accessDenied, "the token of \(account) is handed only to its owner")
        }
        switch TokenHandout.decide(handoutFacts(entry, record), minValidSeconds: minValidSeconds, now: clock.now()) {
        case .serve: return record
        case .refuse(let error): throw error
        case .refreshFirst: break
        }
        let fresh = try await refreshForUse(key, from: record)
        guard let again = entries[key] else { throw .notLoggedIn(account) }
        switch TokenHandout.decide(handoutFacts(again, fresh), minValidSeconds: minValidSeconds, now: clock.now()) {
        case .serve: return fresh
        case .refuse(let error): throw error
        case .refreshFirst:
            throw VaultError(
                .tokenExpired,
                "the token of \(account) expires at \(fresh.expiresAt.map { "\($0)" } ?? "?"), before the \(minValidSeconds)s asked for"
            )
        }
    }

    /// Asks the provider, writes the new tokens before anyone gets them, and
    /// feeds the outcome to the session's `SessionTimers`. Tokens obtained for
    /// a session that ended (or was replaced) meanwhile are revoked.
    /// `write` stores the new record as a single host or a fleet's host
    /// does (`StoreSharing.refresh`). Between the two awaits, and after the
    /// second, one step each takes what came back (`refreshAnswered`,
    /// `refreshWritten`); the revocations and writes they ask for follow.
    func performRefresh(
        _ key: SessionKey, entryID: UInt64, provider: any TokenProvider, snapshot: SessionRecord,
        write: (SessionRecord) async -> RefreshWrite
    ) async -> Result<SessionRecord, VaultError> {
        let outcome = await provider.refresh(snapshot)
        // From here until the new tokens are written, a rotated refresh token
        // exists only in this process: a crash loses it (see docs/reliability/crash.md).
        let refreshed: RefreshedTokens
        switch refreshAnswered(key, entryID: entryID, outcome, snapshot: snapshot) {
        case .over(let result, let effects):
            await perform(effects)
            return result
        case .write(let tokens):
            refreshed = tokens
        }
        let written = await write(refreshed.record)
        let (result, effects) = refreshWritten(key, entryID: entryID, refreshed, written, provider: provider)
        await perform(effects)
        return result
    }

    /// Tokens a refresh obtained, to be written before anyone gets them.
    struct RefreshedTokens {
        /// The session's record with the new tokens.
        var record: SessionRecord
        /// The record they replace, as served when the provider answered.
        var current: SessionRecord
        /// The record the refresh started from.
        var snapshot: SessionRecord
        /// When the provider answered.
        var answeredAt: Double
        var now: UnixTime
    }

    /// How `refreshAnswered` went.
    enum RefreshStep {
        /// The refresh is over with `result`; `effects` follow.
        case over(Result<SessionRecord, VaultError>, [StoreEffect])
        /// New tokens: write them.
        case write(RefreshedTokens)
    }

    /// The record of the session `entryID` of `key` when it still holds the
    /// tokens `snapshot` holds: the refresh from `snapshot` is still its.
    private func stillCurrent(_ key: SessionKey, entryID: UInt64, snapshot: SessionRecord) -> SessionRecord? {
        guard let entry = entries[key], entry.id == entryID, let current = entry.record,
            current.tokens == snapshot.tokens
        else { return nil }
        return current
    }

    /// The refresh's entry no longer shows it in flight.
    private func refreshOver(_ key: SessionKey, entryID: UInt64) {
        if entries[key]?.id == entryID { entries[key]?.refresh = nil }
    }

    /// Takes the provider's answer to a refresh from `snapshot`, in one step:
    /// new tokens are to be written; a failure goes to the session's
    /// timers (a backoff, or, refused, the session's end).
    func refreshAnswered(_ key: SessionKey, entryID: UInt64, _ outcome: RefreshOutcome, snapshot: SessionRecord)
        -> RefreshStep
    {
        let account = key.account
        let answeredAt = clock.preciseNow()
        guard let current = stillCurrent(key, entryID: entryID, snapshot: snapshot) else {
            let (result, effects) = refreshSuperseded(key, entryID: entryID, outcome: outcome, snapshot: snapshot)
            refreshOver(key, entryID: entryID)
            return .over(result, effects)
        }
        let now = clock.now()
        switch outcome {
        case .refreshed(var tokens, let expiresIn, _):
            // RFC 6749 6: the server may keep the refresh token; then the old one stays valid.
            if tokens.refreshToken == nil { tokens.refreshToken = current.tokens.refreshToken }
            tokens.instanceURL = tokens.instanceURL ?? current.tokens.instanceURL
            tokens.clientID = tokens.clientID ?? current.tokens.clientID
            tokens.issuedAt = now
            var updated = current
            updated.tokens = tokens
            // No expires_in, no expiry in the token and no DefaultLifetime=: the
            // new token does not expire either, and gets no refresh deadline.
            updated.expiresAt = RefreshPolicy.expiresAt(
                issuedAt: now, expiresIn: expiresIn, embedded: JWT.expiry(of: tokens.accessToken.revealed),
                defaultLifetime: config.providers[account.provider]?.defaultLifetime)
            // Write-through before anyone gets the new access token: a rotated
            // refresh token that is not stored would be lost at a crash.
            return .write(
                RefreshedTokens(record: updated, current: current, snapshot: snapshot, answeredAt: answeredAt, now: now)
            )
        case .transient(let reason, let retryAfter, let code):
            let failure = ProviderFailure.transient(
                code: code, reason: reason, message: "refreshing \(account) failed: \(reason)")
            handle(
                key,
                .refreshFailed(
                    failure, retryAfter: retryAfter, random: random(), now: clock.nextSecond(),
                    expired: current.isExpired(at: now)))
            let retryAt = entries[key]?.timers.status.nextRetryAt
            log.warning(
                "refresh failed; the current token is still served and the refresh retried",
                fields(key, event: "connectFailed").merging([
                    "reason": reason, "retryAt": retryAt.map { "\($0)" } ?? "-",
                ]) { a, _ in a })
            var told = failure
            told.message += "; retrying at \(retryAt.map { "\($0)" } ?? "-")"
            refreshOver(key, entryID: entryID)
            return .over(.failure(told), [])
        case .permanent(let code, let reason):
            log.error(
                "refresh refused; the session is logged out",
                fields(key, event: "tokenInvalid").merging(["reason": code]) { a, _ in a })
            let refusal = ProviderFailure.refusal(
                code: code, reason: reason, message: "the provider refused to refresh \(account); log in again")
            entries[key]?.endCause = EndCause(refusal)
            handle(key, .refreshRefused(code: code, reason: reason))
            refreshOver(key, entryID: entryID)
            return .over(.failure(refusal), [])
        }
    }

    /// Takes how the write of refreshed tokens went, in one step: the
    /// tokens are served (unsaved ones retried later) and announced; or the
    /// session ended or was replaced while the write was out, and they are
    /// revoked; or the fleet's store held a newer change, which answers.
    func refreshWritten(
        _ key: SessionKey, entryID: UInt64, _ refreshed: RefreshedTokens, _ written: RefreshWrite,
        provider: any TokenProvider
    ) -> (Result<SessionRecord, VaultError>, [StoreEffect]) {
        defer { refreshOver(key, entryID: entryID) }
        let account = key.account
        let (updated, now) = (refreshed.record, refreshed.now)
        let failure: VaultError?
        switch written {
        case .written(let outcome): failure = outcome
        case .superseded(let answer): return (answer, [])
        }
        let saved = failure == nil
        if let failure {
            log.error(
                "refreshed tokens could not be stored; kept in memory and retried",
                fields(key, event: "tokenRefreshed", code: failure.code))
        }
        guard stillCurrent(key, entryID: entryID, snapshot: refreshed.snapshot) != nil else {
            // The session ended or was replaced while the write was out: put the
            // current record back if it is another session's.
            let restore = entries[key]?.record.map { [StoreEffect.restore($0)] } ?? []
            let revocations = orphanedRevocations(updated.tokens, of: refreshed.snapshot)
            if entries[key]?.id == entryID { handle(key, .refreshAbandoned) }
            return (.failure(.notLoggedIn(account)), restore + revocations)
        }
        entries[key]?.machine.refreshed(updated)
        // Served before it is announced: a subscriber that reads the token
        // on tokenRefreshed gets the new one.
        publishView(key)
        var logFields = fields(key, event: "tokenRefreshed")
        // How long the new tokens were in memory only: the crash window of rotation.
        logFields["storedAfterMs"] = String(Int(((clock.preciseNow() - refreshed.answeredAt) * 1000).rounded()))
        log.info("token refreshed", logFields)
        events(
            VaultEvent(
                kind: .tokenRefreshed, account: account, ownerUID: key.owner, time: now, expiresAt: updated.expiresAt))
        handle(key, .refreshed(facts(updated, refreshedAt: now), saved: saved, now: now))
        let effects = noteReplaced(
            key, old: refreshed.current, new: updated.tokens, saved: saved, provider: provider)
        return (.success(updated), effects)
    }

    /// The refresh's session changed while the provider answered. Ended (or
    /// logged in anew): the refresh is over and its tokens are revoked. Still
    /// the same session with newer tokens (a replace here, or another host's
    /// refresh that the fleet's feed brought): those tokens answer the
    /// refresh, which asked for tokens fresher than its snapshot; the ones
    /// obtained here are dropped. In a fleet they are not revoked: they may
    /// belong to the grant the served tokens belong to, and revoking one
    /// token may revoke its whole grant (RFC 7009 2.1).
    private func refreshSuperseded(
        _ key: SessionKey, entryID: UInt64, outcome: RefreshOutcome, snapshot: SessionRecord
    ) -> (Result<SessionRecord, VaultError>, [StoreEffect]) {
        let sameSession = entries[key]?.id == entryID
        let newer = sameSession ? entries[key]?.record : nil
        var effects: [StoreEffect] = []
        if case .refreshed(let tokens, _, _) = outcome, newer == nil || sharing.revokesSupersededTokens {
            effects = orphanedRevocations(tokens, of: snapshot)
        }
        if sameSession { handle(key, .refreshAbandoned) }
        if let newer { return (.success(newer), effects) }
        return (.failure(.notLoggedIn(key.account)), effects)
    }

    /// The revocation of tokens a refresh obtained for a session that ended
    /// (or was replaced) while the request was out: nobody will use them,
    /// and they would stay valid at the provider. A new refresh token needs
    /// it (an unrotated one is the ended session's, which its logout
    /// revokes), and so does a new access token that stays valid until it is
    /// revoked (an exec helper's, `revokesReplaced`): that one alone, as a
    /// replaced token, so that a session of the account that began meanwhile
    /// is not signed out with it. Queued in the store before it is attempted.
    func orphanedRevocations(_ issued: TokenSet, of snapshot: SessionRecord) -> [StoreEffect] {
        guard let provider = client(for: snapshot.account.provider) else { return [] }
        var orphan = snapshot
        orphan.tokens = issued
        guard let rotated = issued.refreshToken, rotated != snapshot.tokens.refreshToken else {
            guard provider.revokesReplaced(snapshot, by: issued) else { return [] }
            if orphan.tokens.refreshToken == snapshot.tokens.refreshToken { orphan.tokens.refreshToken = nil }
            log.info(
                "a refresh finished after its session ended; the token it obtained is revoked",
                fields(snapshot.key, event: "revokeOrphaned"))
            return revocations(ofReplaced: [orphan])
        }
        log.info(
            "a refresh finished after its session ended; the tokens it obtained are revoked",
            fields(snapshot.key, event: "revokeOrphaned"))
        return [
            .queueRevocation(
                PendingRevocation(queueing: orphan), provider: provider,
                chargedTo: chargedUID(.vaultd, owner: orphan.ownerUID), event: "revokeOrphaned", what: "a revocation")
        ]
    }
}
