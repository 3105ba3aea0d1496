import Varlink
import VaultCore

/// What a `Login` did.
enum LoginOutcome: Sendable, Equatable {
    /// A new session was logged in (or a login in flight joined).
    case created
    /// The account was logged in already and kept its session.
    case existing
    /// The session's tokens were replaced by the request's (`replace`).
    case replaced
}

/// Replacing a logged-in session's tokens in place (`Login` with `replace`),
/// and what vaultd does when a client reports that the chat server rejected
/// the current token (`ReportRejected`).
extension SessionManager {
    // MARK: Replace

    /// Waits for the login, logout or replace in flight on `key`, if any.
    func waitForChangeInFlight(_ key: SessionKey) async {
        if let task = entries[key]?.logout {
            _ = await task.value
        } else if let task = entries[key]?.login {
            _ = await task.value
        } else if let task = entries[key]?.replace {
            _ = await task.value
        }
    }

    /// Starts the replace the state machine asked for (it is in `replacing`)
    /// and answers with its result. Refused at once, the session untouched,
    /// while the store cannot take writes.
    func startReplace(_ request: LoginRequest, key: SessionKey, replacing old: SessionRecord, caller: Caller)
        async throws(VaultError) -> SessionRecord
    {
        if let refusal = gate.health.refusal {
            entries[key]?.machine.replaceFinished(nil)
            Audit.log(log, "Login", key, by: .peer(caller), result: refusal.code.seedCode)
            throw refusal
        }
        do throws(VaultError) {
            // The replaced tokens' revocation is queued beside the session.
            if let refusal = revocationRefusal(owner: key.owner) { throw refusal }
            if let provider = config.providers[key.account.provider], Self.asksProvider(request, provider: provider) {
                try chargeProviderRequest(
                    chargedUID(.peer(caller), owner: key.owner), "the login of \(key.account) at the provider")
            }
        } catch {
            entries[key]?.machine.replaceFinished(nil)
            Audit.log(log, "Login", key, by: .peer(caller), result: error.code.seedCode)
            throw error
        }
        // The task ends only after the state changed, so whoever awaits it sees the new state.
        let task = Task { () -> Result<SessionRecord, VaultError> in
            await self.performReplace(request, key: key, replacing: old, caller: caller)
        }
        entries[key]?.replace = task
        return try await task.value.get()
    }

    /// Builds the new record, queues the revocation of a replaced refresh
    /// token, writes the new record over the old one (`SessionWrite`), and
    /// only then serves it and tells subscribers (`tokenRefreshed`, reason
    /// "replaced"); then asks the provider to revoke. Should the store fail,
    /// the old session is served again, as it was, and the store put back
    /// as far as it lets.
    func performReplace(_ request: LoginRequest, key: SessionKey, replacing old: SessionRecord, caller: Caller)
        async -> Result<SessionRecord, VaultError>
    {
        var new: SessionRecord
        do throws(VaultError) {
            new = try await replacementRecord(request, key: key)
        } catch {
            defer { entries[key]?.replace = nil }
            replaceFailed(old)
            return failReplace(key, old, caller, error)
        }
        if request.profile == nil { new.user = old.user }
        let provider = client(for: key.account.provider)
        let replacedRefreshToken =
            old.tokens.refreshToken != nil && old.tokens.refreshToken != new.tokens.refreshToken
        let revocation =
            replacedRefreshToken && provider?.revokes(old) == true ? PendingRevocation(queueing: old) : nil
        // Queued first: once the new record is in the store, nothing else remembers the old tokens.
        let write = SessionWrite(key: key, before: old, steps: (revocation.map { [.queue($0)] } ?? []) + [.save(new)])
        return replaceWritten(
            old, new, await write.perform(on: store, delete: sharing.deleteRecord), revocation: revocation,
            provider: provider, caller: caller)
    }

    /// Takes the outcome of a replace's write of `new`, in one step: the
    /// new tokens are served and announced, and the revocation of the old
    /// ones started through `provider`, the one that decided it; or the
    /// session goes on with `old`, written again where the store was not
    /// put back.
    func replaceWritten(
        _ old: SessionRecord, _ new: SessionRecord, _ outcome: SessionWrite.Outcome,
        revocation: PendingRevocation?, provider: (any TokenProvider)?, caller: Caller
    ) -> Result<SessionRecord, VaultError> {
        let key = old.key
        defer { entries[key]?.replace = nil }
        if case .failed(let error, let restored, let stillQueued) = outcome {
            if let stillQueued, entries[key]?.unqueue == nil { entries[key]?.unqueue = stillQueued }
            let now = replaceFailed(old)
            if !restored || stillQueued != nil {
                handle(key, .storeStale(now: now))
            } else if entries[key]?.timers.status.unsaved == true {
                // `old` was written back: the store holds what is served.
                handle(key, .saved)
            }
            return failReplace(key, old, caller, error)
        }
        entries[key]?.machine.replaceFinished(new)
        if let queued = entries[key]?.unqueue, queued.record.tokens.accessToken != new.tokens.accessToken,
            queued.record.tokens.refreshToken == nil || queued.record.tokens.refreshToken != new.tokens.refreshToken
        {
            // A failed logout's revocation kept back because its tokens were served:
            // they are not any more, so it may go ahead.
            entries[key]?.unqueue = nil
            if let provider {
                startRevocation(queued, provider: provider, chargedTo: chargedUID(.peer(caller), owner: key.owner))
            }
        }
        let now = clock.now()
        handle(key, .replaced(facts(new, refreshedAt: now), now: now))
        log.info("tokens replaced", fields(key, event: "tokenRefreshed", by: .peer(caller)))
        events(
            VaultEvent(
                kind: .tokenRefreshed, account: key.account, ownerUID: key.owner, time: now, reason: "replaced",
                expiresAt: new.expiresAt))
        Audit.log(log, "Login", key, by: .peer(caller), result: "ok")
        if let revocation, let provider {
            startRevocation(revocation, provider: provider, chargedTo: chargedUID(.peer(caller), owner: key.owner))
        }
        return .success(new)
    }

    /// A replace failed: the session goes on with `old`, its deadlines
    /// scheduled anew (those that came due during the replace were
    /// dropped). Answers the time it was scheduled at.
    @discardableResult
    private func replaceFailed(_ old: SessionRecord) -> UnixTime {
        entries[old.key]?.machine.replaceFinished(nil)
        let now = clock.now()
        handle(old.key, .stored(facts(old, refreshedAt: old.tokens.issuedAt ?? old.createdAt), now: now))
        return now
    }

    /// Logs and audits a failed replace (the session is back in `loggedIn`, with its old tokens).
    func failReplace(_ key: SessionKey, _ old: SessionRecord, _ caller: Caller, _ error: VaultError) -> Result<
        SessionRecord, VaultError
    > {
        log.error(
            "replacing the tokens failed; the session goes on with the old ones",
            fields(key, event: "loginFailed", by: .peer(caller), code: error.code))
        Audit.log(log, "Login", key, by: .peer(caller), result: error.code.seedCode)
        return .failure(error)
    }

    /// The record a replace writes: from the request's credential, or
    /// obtained from the provider as a login would (`credentialFromProvider`).
    func replacementRecord(_ request: LoginRequest, key: SessionKey) async throws(VaultError) -> SessionRecord {
        let account = key.account
        let obtained: LoginCredential?
        switch await credentialFromProvider(
            request, account: account, failure: "replacing the tokens of \(account) failed")
        {
        case .success(let credential): obtained = credential
        case .failure(let refusal): throw refusal.error
        }
        return try makeRecord(request, key: key, obtained: obtained)
    }

    // MARK: Report rejected

    /// A client says the chat server rejected the token whose SHA-256 is
    /// `tokenHash`. When it is the session's current token, the session is
    /// refreshed once for every reporter (joining the refresh in flight) or,
    /// where the provider cannot refresh it, ended as `tokenInvalid` (reason
    /// "rejected"); when it is not, the call returns at once. The hashes are
    /// compared in constant time. The token's owner, its readers and its
    /// managers may report.
    public func reportRejected(_ key: SessionKey, tokenHash: [UInt8], caller: Caller) async throws(VaultError)
        -> RejectedOutcome
    {
        let account = key.account
        let access = policy.policy
        guard access.mayReadToken(caller, key) || access.mayManage(caller, key) else {
            Audit.log(log, "ReportRejected", key, by: .peer(caller), result: VaultError.Code.accessDenied.seedCode)
            throw AccessPolicy.notYours(key)
        }
        func done(_ outcome: RejectedOutcome) -> RejectedOutcome {
            var logFields = fields(key, event: "reportRejected", by: .peer(caller))
            logFields["outcome"] = outcome.rawValue
            log.info("a client reported its token rejected by the chat server", logFields)
            Audit.log(log, "ReportRejected", key, by: .peer(caller), result: "ok")
            return outcome
        }
        do throws(VaultError) {
            // Bounded: each pass waits for one change in flight to end.
            for _ in 0..<64 {
                if let task = entries[key]?.replace {
                    _ = await task.value
                    continue
                }
                guard let entry = entries[key] else { throw .notLoggedIn(account) }
                guard let record = entry.record else {
                    if let task = entry.logout {
                        // The token is being withdrawn already: what this report asks for.
                        try await task.value.get()
                        return done(.ended)
                    }
                    if let task = entry.login {
                        _ = await task.value
                        continue
                    }
                    throw .notLoggedIn(account)
                }
                let current = record.tokens.accessToken.withUTF8 { SHA256.hash($0) }
                guard SHA256.constantTimeEqual(current, tokenHash) else { return done(.alreadyReplaced) }
                if entry.refresh != nil || renewer(for: record) != nil {
                    // Joins the refresh in flight, or starts the one all later reporters join.
                    _ = try await refreshForUse(key, from: record)
                    return done(.refreshed)
                }
                try await performLogout(
                    key, by: .vaultd, reason: "rejected", kind: .tokenInvalid,
                    cause: EndCause(
                        VaultError(
                            .invalidCredential,
                            "a client reported the chat server rejected the token, and provider '\(account.provider)' cannot refresh it; log \(account) in again"
                        )))
                return done(.ended)
            }
            throw VaultError(.loginInProgress, "\(account) kept changing while its report was handled; try again")
        } catch {
            Audit.log(log, "ReportRejected", key, by: .peer(caller), result: error.code.seedCode)
            throw error
        }
    }
}
