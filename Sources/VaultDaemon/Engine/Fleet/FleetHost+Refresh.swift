import VaultCore

/// How a conditional write of refreshed tokens ended.
enum FleetWrite {
    case saved
    /// The store holds `current` (nil: nothing) at `revision`, not what was compared.
    case conflict(SessionRecord?, StoreRevision)
    case failed(VaultError)
}

// MARK: One refresh per account across the fleet

extension FleetHost {
    /// The refresh of a fleet's session: takes the account's lock first.
    /// Granted: the stored record is read under it; tokens another host
    /// stored meanwhile are served as they are, else the provider is asked
    /// and the new tokens written only over the revision read
    /// (`SessionManager.performRefresh`), then the lock is released. Held by another host:
    /// waits for that host's tokens, at most until its lease ends, then tries
    /// again. Store unreachable: no refresh (a failure the timers back off from).
    /// A refresh is acknowledged once its tokens are in the shared store:
    /// until then only this host has them, and its death loses them (with
    /// rotation, the grant). They are served from here meanwhile, and
    /// written when the store is back.
    func refresh(
        _ key: SessionKey, entryID: UInt64, provider: any TokenProvider, snapshot: SessionRecord,
        _ manager: isolated SessionManager
    ) async -> Result<SessionRecord, VaultError> {
        let account = key.account
        // Counted by `refreshDecided`.
        defer { refreshing -= 1 }
        // Bounded: each pass waits at most one lease.
        for _ in 0..<16 {
            guard let entry = manager.entries[key], entry.id == entryID, let current = entry.record else {
                // Ended, or a logout of it under way here (which may fail and
                // serve the session again): this refresh is over, and the
                // entry must not go on showing it in flight.
                endRefresh(key, entryID, manager)
                return .failure(.notLoggedIn(account))
            }
            if current.tokens != snapshot.tokens {
                // Another host's tokens arrived while this one waited.
                endRefresh(key, entryID, manager)
                return .success(current)
            }
            let answer: RefreshLockAnswer
            let wakeupsBefore = wakeups[key] ?? 0
            do throws(VaultError) {
                answer = try await store.acquireRefreshLock(key)
            } catch {
                return refreshFailed(key, entryID, error, manager)
            }
            switch answer {
            case .heldBy(let host, let until):
                var logFields = manager.fields(key, event: "tokenRefreshed")
                logFields["holder"] = host
                manager.log.info("another host refreshes this session; waiting for its tokens", logFields)
                // A put or release applied while the lock was asked for: look again at once.
                if (wakeups[key] ?? 0) != wakeupsBefore { continue }
                await waitForOtherHost(key, until: until, manager)
            case .granted(let lease):
                if let result = await underLock(
                    key, entryID: entryID, lease: lease, provider: provider, current: current, manager)
                {
                    return result
                }
            }
        }
        return refreshFailed(
            key, entryID,
            VaultError(.networkError, "refreshing \(account) waited for other hosts too long; it is tried again"),
            manager)
    }

    /// The part of a refresh under the account's lock (`lease`): reads the
    /// stored record, then serves tokens another host stored meanwhile, or
    /// asks the provider and writes the new tokens over the revision read,
    /// then releases the lock. Nil: the lease ended while the store was
    /// read, and the lock is asked for again.
    private func underLock(
        _ key: SessionKey, entryID: UInt64, lease: RefreshLease, provider: any TokenProvider,
        current: SessionRecord, _ manager: isolated SessionManager
    ) async -> Result<SessionRecord, VaultError>? {
        let account = key.account
        let stored: SharedRecord?
        do throws(VaultError) {
            stored = try await store.loadShared(key)
        } catch {
            try? await store.releaseRefreshLock(key, lease: lease)
            return refreshFailed(key, entryID, error, manager)
        }
        guard let stored, stored.record.phase == .active else {
            // Ended on another host: its delete reaches this one through the feed.
            try? await store.releaseRefreshLock(key, lease: lease)
            endRefresh(key, entryID, manager)
            return .failure(.notLoggedIn(account))
        }
        if stored.record.tokens != current.tokens {
            // Refreshed on another host, and the feed has not told this one yet.
            try? await store.releaseRefreshLock(key, lease: lease)
            applyPut(stored.record, revision: stored.revision, manager)
            endRefresh(key, entryID, manager)
            guard let served = manager.entries[key]?.record else { return .failure(.notLoggedIn(account)) }
            return .success(served)
        }
        if !shared.stillHolds(lease, at: manager.clock.preciseNow()) {
            // The lease ended while the store was read (this process stalled):
            // another host may hold the lock now. Released (a store that
            // renews the lease may still hold it for this host) and asked for again.
            try? await store.releaseRefreshLock(key, lease: lease)
            return nil
        }
        var unstored: VaultError?
        let result = await manager.performRefresh(
            key, entryID: entryID, provider: provider, snapshot: current
        ) { record in
            switch await self.save(
                record, ifRevision: stored.revision, refreshedFrom: current.tokens, manager)
            {
            case .saved: return .written(failure: nil)
            case .conflict(let stored, let revision):
                return .superseded(
                    await self.refreshConflicted(
                        key, entryID: entryID, stored: stored, revision: revision, manager))
            case .failed(let error):
                unstored = error
                return .written(failure: error)
            }
        }
        // A refresh that ended the session (refused, or expired meanwhile)
        // holds the lock until the logout reached the store: no host may
        // refresh from the record still stored.
        if manager.entries[key]?.id == entryID, let logout = manager.entries[key]?.logout {
            _ = await logout.value
        }
        // Rotated tokens the store did not take keep the lock until its
        // lease ends: no host may refresh from the stored, rotated-away token.
        if !(manager.entries[key]?.id == entryID && manager.entries[key]?.timers.status.unsaved == true) {
            try? await store.releaseRefreshLock(key, lease: lease)
        }
        if case .success = result, let unstored {
            return .failure(
                VaultError(
                    unstored.code,
                    "\(account) was refreshed, but the new tokens could not be written to the shared store (\(unstored.message)); this host serves them and writes them once the store answers"
                ))
        }
        return result
    }

    /// The refresh in flight of this entry is over, without tokens of its
    /// own (any it adopted told the timers already; this one is a no-op then).
    private func endRefresh(_ key: SessionKey, _ entryID: UInt64, _ manager: isolated SessionManager) {
        guard manager.entries[key]?.id == entryID else { return }
        manager.entries[key]?.refresh = nil
        manager.handle(key, .refreshAbandoned)
    }

    /// A refresh that could not take the lock or read the store: a failure
    /// the session's timers back off from; the current token is still served.
    private func refreshFailed(
        _ key: SessionKey, _ entryID: UInt64, _ error: VaultError, _ manager: isolated SessionManager
    ) -> Result<SessionRecord, VaultError> {
        if manager.entries[key]?.id == entryID { manager.entries[key]?.refresh = nil }
        guard manager.entries[key]?.id == entryID, let record = manager.entries[key]?.record else {
            return .failure(.notLoggedIn(key.account))
        }
        let now = manager.clock.now()
        manager.log.warning(
            "the shared store could not be reached to refresh; the current token is still served",
            manager.fields(key, event: "connectFailed", code: error.code))
        manager.handle(
            key,
            .refreshFailed(
                error, retryAfter: nil, random: manager.random(), now: manager.clock.nextSecond(),
                expired: record.isExpired(at: now)))
        return .failure(error)
    }

    /// Waits until a change of `key` is applied or `until` (the other host's
    /// lease's end) passes: a deadline of the manager's alarm.
    private func waitForOtherHost(_ key: SessionKey, until: Double, _ manager: isolated SessionManager) async {
        refreshing -= 1
        await manager.wait(.otherHost(key), until: until)
        refreshing += 1
    }

    /// Writes refreshed tokens over the revision read under the lock. A
    /// record written meanwhile that still holds the tokens this refresh
    /// started from (a write that changed no token: a logout put back, a
    /// retried write) is written over too: the tokens obtained here are its
    /// successors, and dropping them would leave the store a rotated-away
    /// refresh token. A record that holds the tokens written here is this
    /// write, landed on an attempt whose answer was lost: saved.
    func save(
        _ record: SessionRecord, ifRevision: StoreRevision, refreshedFrom: TokenSet, _ manager: isolated SessionManager
    ) async -> FleetWrite {
        var compared = ifRevision
        writing[record.key] = record.tokens
        defer { writing[record.key] = nil }
        // Bounded: each pass follows one write that changed no token.
        for _ in 0..<4 {
            do throws(VaultError) {
                switch try await store.saveShared(record, ifRevision: compared) {
                case .saved(let revision):
                    if (revisions[record.key] ?? 0) < revision { revisions[record.key] = revision }
                    return .saved
                case .conflict(let current, let revision):
                    if let current, current.phase == .active, current.tokens == record.tokens {
                        // These very tokens are stored: an earlier attempt of this
                        // write landed and its answer was lost (the etcd client sent
                        // it again to another member, where the comparison then
                        // failed on the write itself). No other host has them but
                        // from this write.
                        if (revisions[record.key] ?? 0) < revision { revisions[record.key] = revision }
                        return .saved
                    }
                    guard let current, current.phase == .active, current.tokens == refreshedFrom else {
                        return .conflict(current, revision)
                    }
                    compared = revision
                }
            } catch {
                return .failed(error)
            }
        }
        return .failed(
            VaultError(
                .storeFailed, "the record of \(record.account) kept changing while its refreshed tokens were written"))
    }

    /// Writes again what a host of a fleet serves and the store may lack (a
    /// refresh's write or a failed logout's restore that did not land). Only
    /// over the revision this host last saw: a store written since by another
    /// host (newer tokens, a logout) is adopted instead, so that tokens a
    /// refresh elsewhere rotated away are never written back.
    func persist(_ key: SessionKey, entryID: UInt64, _ manager: isolated SessionManager) async {
        let stored: SharedRecord?
        do throws(VaultError) {
            stored = try await store.loadShared(key)
        } catch {
            manager.handle(key, .saveFailed(now: manager.clock.now()))
            return
        }
        guard manager.entries[key]?.id == entryID, let served = manager.entries[key]?.record else { return }
        if let stored, stored.record.phase == .active, stored.record.tokens == served.tokens {
            manager.handle(key, .saved)
            return
        }
        let known = knownRevision(key, manager)
        guard let stored, stored.revision <= known else {
            // Changed by another host since: the store wins.
            return await resync(key, ending: nil, manager)
        }
        switch await save(served, ifRevision: stored.revision, refreshedFrom: stored.record.tokens, manager) {
        case .saved:
            manager.handle(key, .saved)
            await manager.perform(manager.replacedRevocations(of: key))
        case .conflict:
            await resync(key, ending: nil, manager)
        case .failed:
            manager.handle(key, .saveFailed(now: manager.clock.now()))
        }
    }

    /// The store did not take refreshed tokens: another host wrote the
    /// session after the revision read under the lock (its lease ended while
    /// this host refreshed). Its record is served; the tokens obtained here
    /// are never handed out (nor revoked: with rotation, revoking them
    /// would revoke the grant the stored tokens belong to).
    private func refreshConflicted(
        _ key: SessionKey, entryID: UInt64, stored: SessionRecord?, revision: StoreRevision,
        _ manager: isolated SessionManager
    ) async -> Result<SessionRecord, VaultError> {
        manager.log.warning(
            "another host wrote this session while it was refreshed here; the stored tokens are served and the ones obtained here dropped",
            manager.fields(key, event: "tokenRefreshed"))
        guard manager.entries[key]?.id == entryID else { return .failure(.notLoggedIn(key.account)) }
        if let stored, stored.phase == .active {
            applyPut(stored, revision: revision, manager)
            if let served = manager.entries[key]?.record, served.tokens == stored.tokens {
                manager.handle(key, .refreshAbandoned)
                return .success(served)
            }
        }
        if manager.entries[key]?.id == entryID { manager.handle(key, .refreshAbandoned) }
        return .failure(.notLoggedIn(key.account))
    }
}
