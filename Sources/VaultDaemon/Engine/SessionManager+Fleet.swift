import Synchronization
import VaultCore

/// What a host of a fleet keeps about its shared store, beside the entries:
/// the revision of each session's last change it applied (a change at or
/// below it is one it has seen), and the refreshes waiting for another
/// host's. Kept out of `AccountEntry` so that a single host's entries stay
/// as small as they were.
struct FleetState {
    /// The store the fleet shares (the gate's inner store).
    let shared: any SharedSessionStore
    /// Per session, the revision of the last change applied here.
    var revisions: [SessionKey: StoreRevision] = [:]
    /// Refreshes waiting for another host's tokens, per session.
    var waiters: [SessionKey: [FleetWaiter]] = [:]
    /// Refreshes under way here and not waiting for another host.
    var refreshing = 0
    /// The background work that applies the feed (`followSharedStore()`), stopped first at shutdown.
    var follower: UInt64?
    /// Per session, how many changes (puts, deletes, lock releases) were
    /// applied: a refresh about to wait for another host does not when one
    /// came since it asked for the lock (the wake-up would be lost).
    var wakeups: [SessionKey: UInt64] = [:]
    /// Per session, the tokens of this host's conditional write in flight:
    /// its own feed may deliver the write before the store's answer does,
    /// and it is not another host's refresh.
    var writing: [SessionKey: TokenSet] = [:]
    /// When a session unknown here was last read from the store for a
    /// client (`catchUpShared`), so that repeated misses read it once a second.
    var lookedUp: [SessionKey: Double] = [:]
    /// The store reads of `catchUpShared` in flight: a client that asks for
    /// the same session meanwhile waits for that read instead of being
    /// answered "not logged in" by the once-a-second limit.
    var catchingUp: [SessionKey: Task<Void, any Error>] = [:]

    init(_ shared: any SharedSessionStore) { self.shared = shared }
}

/// One refresh waiting for another host's tokens: woken by a change of its
/// session, or when the other host's lock lease ends.
final class FleetWaiter: Sendable {
    private let state = Mutex<(woken: Bool, continuation: CheckedContinuation<Void, Never>?)>((false, nil))

    /// Returns once `wake()` was called (at once if it was already).
    func wait() async {
        await withCheckedContinuation { continuation in
            let now = state.withLock { state -> Bool in
                if state.woken { return true }
                state.continuation = continuation
                return false
            }
            if now { continuation.resume() }
        }
    }

    /// Whether `wake()` was called: the waiting refresh is under way again,
    /// though its task may not have resumed yet.
    var isWoken: Bool { state.withLock { $0.woken } }

    /// Ends the wait; later calls do nothing.
    func wake() {
        let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
            guard !state.woken else { return nil }
            state.woken = true
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume()
    }
}

/// How a conditional write of refreshed tokens ended.
enum FleetWrite {
    case saved
    /// The store holds `current` (nil: nothing) at `revision`, not what was compared.
    case conflict(SessionRecord?, StoreRevision)
    case failed(VaultError)
}

extension StoreGate {
    /// The shared store; an internal error on a single host (never called there).
    private func requireShared() throws(VaultError) -> any SharedSessionStore {
        guard let shared else {
            throw VaultError(.internalError, "the session store is not shared by a fleet")
        }
        return shared
    }

    func loadShared() async throws(VaultError) -> SharedContents {
        try await pass { () async throws(VaultError) in try await requireShared().loadShared(nil) }
    }

    func loadShared(_ key: SessionKey) async throws(VaultError) -> SharedRecord? {
        try await pass { () async throws(VaultError) in try await requireShared().loadShared(key).records.first }
    }

    func saveShared(_ record: SessionRecord, ifRevision: StoreRevision) async throws(VaultError) -> ConditionalSave {
        try await pass { () async throws(VaultError) in try await requireShared().save(record, ifRevision: ifRevision) }
    }

    func deleteShared(_ key: SessionKey, ending: SessionEnding) async throws(VaultError) {
        let revision = try await pass { () async throws(VaultError) in
            try await requireShared().delete(key, ending: ending)
        }
        noteOwnWrite(key, revision)
    }

    func acquireRefreshLock(_ key: SessionKey) async throws(VaultError) -> RefreshLockAnswer {
        try await pass { () async throws(VaultError) in try await requireShared().acquireRefreshLock(key) }
    }

    func releaseRefreshLock(_ key: SessionKey, lease: RefreshLease) async throws(VaultError) {
        try await pass { () async throws(VaultError) in try await requireShared().releaseRefreshLock(key, lease: lease)
        }
    }
}

/// A host of a fleet: several vaultd share one store (`SharedSessionStore`).
/// Each serves from memory, as a single host does, and follows the store's
/// change feed: another host's login, refresh and logout reach this host's
/// table, its subscribers and its timers. A refresh is made by one host at a
/// time, the one holding the account's refresh lock; the others wait for
/// its tokens. A host that cannot reach the store serves the tokens it has,
/// refuses logins and logouts (`StoreGate`), never refreshes, and reloads the
/// store when it is back. See docs/LIFECYCLE.md, "Fleet".
extension SessionManager {
    // MARK: Following the store

    /// True when this manager is one host of a fleet.
    public nonisolated var isFleetHost: Bool { gate.shared != nil }

    /// The sessions whose refresh waits for another host's tokens now (tests wait for them).
    public var waitingForOtherHosts: Set<SessionKey> {
        Set((fleet?.waiters ?? [:]).filter { $0.value.contains { !$0.isWoken } }.keys)
    }

    /// Refreshes under way on this host that do not wait for another host
    /// (the simulation moves its clock only when there are none). A refresh
    /// counts from when it is decided, and again from when its wait is ended
    /// (before its task resumes): a clock moved in either gap could end a
    /// lease with a refresh about to present the token.
    public var fleetRefreshesUnderWay: Int {
        guard let fleet else { return 0 }
        return fleet.refreshing + fleet.waiters.values.reduce(0) { $0 + $1.count { $0.isWoken } }
    }

    /// Follows the shared store's change feed in the background until
    /// shutdown. Call once, after `restore()`; does nothing on a single host.
    public func followSharedStore() {
        guard let shared = fleet?.shared else { return }
        let changes = shared.changes()
        fleet?.follower = spawn {
            for await change in changes { await self.applySharedChange(change) }
        }
    }

    /// Applies one change of the shared store's feed (the feed's task calls
    /// this; the simulation delivers changes itself).
    public func applySharedChange(_ change: SharedChange) async {
        guard fleet != nil else { return }
        switch change {
        case .put(let record, let revision): await applySharedPut(record, revision: revision)
        case .deleted(let key, let ending, let revision):
            await applySharedDelete(key, ending: ending, revision: revision)
        case .unlocked(let key): wakeFleetWaiters(key)
        case .reset: await reloadShared()
        }
    }

    /// A record written by any host: a session this host does not serve
    /// begins here (`loginSuccess`); newer tokens of one it serves are
    /// served (`tokenRefreshed`). A session with a login, logout or replace
    /// in flight here is left to it; a logout's mark is left to its delete.
    func applySharedPut(_ record: SessionRecord, revision: StoreRevision, force: Bool = false) async {
        let key = record.key
        if !force, revision <= knownRevision(key) { return }
        if record.phase == .active, let own = fleet?.writing[key], own == record.tokens {
            // This host's own write, ahead of the store's answer: its writer goes on with it.
            if (fleet?.revisions[key] ?? 0) < revision { fleet?.revisions[key] = revision }
            return
        }
        if deferWhileBusy(key, ending: nil) { return }
        let newest = max(revision, fleet?.revisions[key] ?? 0)
        fleet?.revisions[key] = newest
        defer { wakeFleetWaiters(key) }
        guard record.phase == .active else { return }
        let entry = entries[key]
        let now = clock.now()
        switch entry?.machine.state ?? .loggedOut {
        case .loggedOut:
            var fresh = entry ?? makeEntry(record.account)
            _ = fresh.machine.loginRequested()
            fresh.machine.loginSucceeded(record)
            entries[key] = fresh
            renewParkedEntry(key)
            await handle(key, .stored(facts(record, refreshedAt: record.tokens.issuedAt ?? record.createdAt), now: now))
            log.info("logged in on another host", fields(key, event: "loginSuccess"))
            emit(.loginSuccess, key)
            wakeLoginWaiters(key)
        case .loggedIn(let served):
            guard served.tokens != record.tokens else { return }
            entries[key]?.machine.refreshed(record)
            // Served before it is announced, as a refresh of this host's own.
            publishView(key)
            log.info("tokens refreshed on another host", fields(key, event: "tokenRefreshed"))
            events(
                VaultEvent(
                    kind: .tokenRefreshed, account: key.account, ownerUID: key.owner, time: now,
                    expiresAt: record.expiresAt))
            // A fresh timed life (an end this host could not store while it
            // was cut off is the old tokens'), refreshed now.
            let newFacts = facts(record, refreshedAt: record.tokens.issuedAt ?? now)
            await handle(key, .replaced(newFacts, now: now))
            await handle(key, .refreshed(newFacts, saved: true, now: now))
        case .loggingIn, .loggingOut, .replacing:
            return
        }
    }

    /// A session deleted by any host: ended here with the event its
    /// tombstone names (a plain delete: `logoutSuccess`). Its revocation is
    /// the business of the host that ended it; so is an automatic login after it.
    func applySharedDelete(_ key: SessionKey, ending: SessionEnding?, revision: StoreRevision, force: Bool = false)
        async
    {
        if !force, revision <= knownRevision(key) { return }
        if deferWhileBusy(key, ending: ending) { return }
        let newest = max(revision, fleet?.revisions[key] ?? 0)
        fleet?.revisions[key] = newest
        defer { wakeFleetWaiters(key) }
        guard let entry = entries[key], entry.record != nil else { return }
        let ending = ending ?? SessionEnding(kind: .logoutSuccess)
        table.publish(key, SessionView(state: .logout, record: nil))
        emit(ending.kind, key, reason: ending.reason)
        _ = entries[key]?.machine.logoutRequested()
        entries[key]?.machine.logoutFinished(succeeded: true)
        _ = entries[key]?.machine.sessionEnded(ending.kind, now: clock.now())
        forget(key)
        rearmTimer()
        var logFields = fields(key, event: ending.kind.rawValue)
        logFields["reason"] = ending.reason
        log.info("logged out on another host", logFields)
    }

    /// The revision of the last change of `key` this host applied or wrote
    /// itself (a login's plain write is known before the feed brings it: an
    /// older change the feed brings first must not undo it).
    private func knownRevision(_ key: SessionKey) -> StoreRevision {
        max(fleet?.revisions[key] ?? 0, gate.lastOwnWrite(key))
    }

    /// A change of a session with a login, logout or replace in flight here
    /// is not applied now (the local change is half done); once that ends,
    /// the session is read from the store again and what it holds then is
    /// applied. Returns false when nothing is in flight.
    private func deferWhileBusy(_ key: SessionKey, ending: SessionEnding?) -> Bool {
        guard let entry = entries[key], entry.login != nil || entry.logout != nil || entry.replace != nil else {
            return false
        }
        spawn {
            await self.waitForChangeInFlight(key)
            await self.resyncShared(key, ending: ending)
        }
        return true
    }

    /// A session this host does not know of, asked for by a client (GetToken,
    /// GetSession, Refresh, Logout): another
    /// host may have logged it in a moment ago, ahead of the feed (a watch
    /// resuming after a member died). Read from the store once, so that a
    /// client that logged in on one host is served on the next; the same
    /// miss is read at most once a second. Nothing on a single host. A
    /// store that cannot be read throws its error: "not logged in" would be
    /// a guess.
    public func catchUpShared(_ key: SessionKey) async throws(VaultError) {
        guard fleet != nil, entries[key] == nil else { return }
        if let reading = fleet?.catchingUp[key] {
            try await Self.finished(reading)
            return
        }
        let now = clock.preciseNow()
        if let last = fleet?.lookedUp[key], now - last < 1 { return }
        if (fleet?.lookedUp.count ?? 0) >= 1024 { fleet?.lookedUp = [:] }
        fleet?.lookedUp[key] = now
        // On this actor: the record is applied before any waiter resumes.
        let reading = Task { () async throws in
            defer { fleet?.catchingUp[key] = nil }
            let stored: SharedRecord?
            do throws(VaultError) {
                stored = try await gate.loadShared(key)
            } catch {
                // Read again at the next ask, not a second later.
                fleet?.lookedUp[key] = nil
                throw error
            }
            if let stored { await applySharedPut(stored.record, revision: stored.revision, force: true) }
        }
        fleet?.catchingUp[key] = reading
        try await Self.finished(reading)
    }

    /// Waits for a catch-up read; its error is the store's.
    private static func finished(_ reading: Task<Void, any Error>) async throws(VaultError) {
        do {
            try await reading.value
        } catch let error as VaultError {
            throw error
        } catch {
            throw VaultError(.internalError, "reading the session from the store failed: \(error)")
        }
    }

    /// Applies what the store holds of `key` now, whatever revision this host saw last.
    func resyncShared(_ key: SessionKey, ending: SessionEnding?) async {
        let stored: SharedRecord?
        do throws(VaultError) {
            stored = try await gate.loadShared(key)
        } catch {
            // Gone: the store's return reloads everything.
            return
        }
        if let stored {
            await applySharedPut(stored.record, revision: stored.revision, force: true)
        } else {
            await applySharedDelete(key, ending: ending, revision: fleet?.revisions[key] ?? 0, force: true)
        }
    }

    /// Reads the whole store and applies what differs: the feed lost changes
    /// (`reset`), or the store is back after this host could not reach it.
    /// A change the feed applied meanwhile at a later revision is kept.
    func reloadShared() async {
        let contents: SharedContents
        do throws(VaultError) {
            contents = try await gate.loadShared()
        } catch {
            // Gone again: the gate probes, and this runs when it is back.
            return
        }
        var stored = Set<SessionKey>()
        for shared in contents.records {
            stored.insert(shared.record.key)
            await applySharedPut(shared.record, revision: shared.revision)
        }
        for key in entries.keys.sorted() where !stored.contains(key) && entries[key]?.record != nil {
            await applySharedDelete(key, ending: contents.endings[key], revision: contents.revision)
        }
        log.notice(
            "caught up with the shared store",
            ["event": "storeChanged", "revision": String(contents.revision), "sessions": String(stored.count)])
    }

    func wakeFleetWaiters(_ key: SessionKey) {
        fleet?.wakeups[key, default: 0] &+= 1
        guard let waiting = fleet?.waiters[key] else { return }
        fleet?.waiters[key] = nil
        for waiter in waiting { waiter.wake() }
    }

    // MARK: One refresh per account across the fleet

    /// The refresh of a fleet's session: takes the account's lock first.
    /// Granted: the stored record is read under it; tokens another host
    /// stored meanwhile are served as they are, else the provider is asked
    /// and the new tokens written only over the revision read
    /// (`performRefresh`), then the lock is released. Held by another host:
    /// waits for that host's tokens, at most until its lease ends, then tries
    /// again. Store unreachable: no refresh (a failure the timers back off from).
    func performFleetRefresh(_ key: SessionKey, entryID: UInt64, provider: any TokenProvider, snapshot: SessionRecord)
        async -> Result<SessionRecord, VaultError>
    {
        let account = key.account
        // Counted by `refresh`, which decided it.
        defer { fleet?.refreshing -= 1 }
        // Bounded: each pass waits at most one lease.
        for _ in 0..<16 {
            guard let entry = entries[key], entry.id == entryID, let current = entry.record else {
                return .failure(.notLoggedIn(account))
            }
            if current.tokens != snapshot.tokens {
                // Another host's tokens arrived while this one waited.
                await endFleetRefresh(key, entryID)
                return .success(current)
            }
            let answer: RefreshLockAnswer
            let wakeupsBefore = fleet?.wakeups[key] ?? 0
            do throws(VaultError) {
                answer = try await gate.acquireRefreshLock(key)
            } catch {
                return await fleetRefreshFailed(key, entryID, error)
            }
            switch answer {
            case .heldBy(let host, let until):
                var logFields = fields(key, event: "tokenRefreshed")
                logFields["holder"] = host
                log.info("another host refreshes this session; waiting for its tokens", logFields)
                // A put or release applied while the lock was asked for: look again at once.
                if (fleet?.wakeups[key] ?? 0) != wakeupsBefore { continue }
                await waitForOtherHost(key, until: until)
            case .granted(let lease):
                let stored: SharedRecord?
                do throws(VaultError) {
                    stored = try await gate.loadShared(key)
                } catch {
                    try? await gate.releaseRefreshLock(key, lease: lease)
                    return await fleetRefreshFailed(key, entryID, error)
                }
                guard let stored, stored.record.phase == .active else {
                    // Ended on another host: its delete reaches this one through the feed.
                    try? await gate.releaseRefreshLock(key, lease: lease)
                    await endFleetRefresh(key, entryID)
                    return .failure(.notLoggedIn(account))
                }
                if stored.record.tokens != current.tokens {
                    // Refreshed on another host, and the feed has not told this one yet.
                    try? await gate.releaseRefreshLock(key, lease: lease)
                    await applySharedPut(stored.record, revision: stored.revision)
                    await endFleetRefresh(key, entryID)
                    guard let served = entries[key]?.record else { return .failure(.notLoggedIn(account)) }
                    return .success(served)
                }
                if fleet?.shared.stillHolds(lease, at: clock.preciseNow()) != true {
                    // The lease ended while the store was read (this process stalled):
                    // another host may hold the lock now. Released (a store that
                    // renews the lease may still hold it for this host) and asked for again.
                    try? await gate.releaseRefreshLock(key, lease: lease)
                    continue
                }
                let result = await performRefresh(
                    key, entryID: entryID, provider: provider, snapshot: current, ifRevision: stored.revision)
                // Rotated tokens the store did not take keep the lock until its
                // lease ends: no host may refresh from the stored, rotated-away token.
                if !(entries[key]?.id == entryID && entries[key]?.timers.status.unsaved == true) {
                    try? await gate.releaseRefreshLock(key, lease: lease)
                }
                return result
            }
        }
        return await fleetRefreshFailed(
            key, entryID,
            VaultError(.networkError, "refreshing \(account) waited for other hosts too long; it is tried again"))
    }

    /// The refresh in flight of this entry is over, without tokens of its
    /// own (any it adopted told the timers already; this one is a no-op then).
    private func endFleetRefresh(_ key: SessionKey, _ entryID: UInt64) async {
        guard entries[key]?.id == entryID else { return }
        entries[key]?.refresh = nil
        await handle(key, .refreshAbandoned)
    }

    /// A refresh that could not take the lock or read the store: a failure
    /// the session's timers back off from; the current token is still served.
    private func fleetRefreshFailed(_ key: SessionKey, _ entryID: UInt64, _ error: VaultError) async -> Result<
        SessionRecord, VaultError
    > {
        if entries[key]?.id == entryID { entries[key]?.refresh = nil }
        guard entries[key]?.id == entryID, let record = entries[key]?.record else {
            return .failure(.notLoggedIn(key.account))
        }
        let now = clock.now()
        log.warning(
            "the shared store could not be reached to refresh; the current token is still served",
            fields(key, event: "connectFailed", code: error.code))
        await handle(
            key,
            .refreshFailed(error, retryAfter: nil, random: random(), now: now, expired: record.isExpired(at: now)))
        return .failure(error)
    }

    /// Waits until a change of `key` is applied or `until` (the other host's
    /// lease's end) passes on the clock.
    private func waitForOtherHost(_ key: SessionKey, until: Double) async {
        let waiter = FleetWaiter()
        fleet?.waiters[key, default: []].append(waiter)
        let clock = self.clock
        guard
            let timeout = spawn({
                try? await clock.sleep(until: until)
                waiter.wake()
            })
        else { return wakeFleetWaiters(key) }
        fleet?.refreshing -= 1
        await waiter.wait()
        fleet?.refreshing += 1
        background[timeout]?.cancel()
        fleet?.waiters[key]?.removeAll { $0 === waiter }
        if fleet?.waiters[key]?.isEmpty == true { fleet?.waiters[key] = nil }
    }

    /// Writes refreshed tokens over the revision read under the lock. A
    /// record written meanwhile that still holds the tokens this refresh
    /// started from (a write that changed no token: a logout put back, a
    /// retried write) is written over too: the tokens obtained here are its
    /// successors, and dropping them would leave the store a rotated-away
    /// refresh token. A record that holds the tokens written here is this
    /// write, landed on an attempt whose answer was lost: saved.
    func saveShared(_ record: SessionRecord, ifRevision: StoreRevision, refreshedFrom: TokenSet) async -> FleetWrite {
        var compared = ifRevision
        fleet?.writing[record.key] = record.tokens
        defer { fleet?.writing[record.key] = nil }
        // Bounded: each pass follows one write that changed no token.
        for _ in 0..<4 {
            do throws(VaultError) {
                switch try await gate.saveShared(record, ifRevision: compared) {
                case .saved(let revision):
                    if (fleet?.revisions[record.key] ?? 0) < revision { fleet?.revisions[record.key] = revision }
                    return .saved
                case .conflict(let current, let revision):
                    if let current, current.phase == .active, current.tokens == record.tokens {
                        // These very tokens are stored: an earlier attempt of this
                        // write landed and its answer was lost (the etcd client sent
                        // it again to another member, where the comparison then
                        // failed on the write itself). No other host has them but
                        // from this write.
                        if (fleet?.revisions[record.key] ?? 0) < revision { fleet?.revisions[record.key] = revision }
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
    func persistShared(_ key: SessionKey, entryID: UInt64) async {
        let stored: SharedRecord?
        do throws(VaultError) {
            stored = try await gate.loadShared(key)
        } catch {
            await handle(key, .saveFailed(now: clock.now()))
            return
        }
        guard entries[key]?.id == entryID, let served = entries[key]?.record else { return }
        if let stored, stored.record.phase == .active, stored.record.tokens == served.tokens {
            await handle(key, .saved)
            return
        }
        let known = knownRevision(key)
        guard let stored, stored.revision <= known else {
            // Changed by another host since: the store wins.
            return await resyncShared(key, ending: nil)
        }
        switch await saveShared(served, ifRevision: stored.revision, refreshedFrom: stored.record.tokens) {
        case .saved:
            await handle(key, .saved)
            await revokeReplacedTokens(key)
        case .conflict:
            await resyncShared(key, ending: nil)
        case .failed:
            await handle(key, .saveFailed(now: clock.now()))
        }
    }

    /// The store did not take refreshed tokens: another host wrote the
    /// session after the revision read under the lock (its lease ended while
    /// this host refreshed). Its record is served; the tokens obtained here
    /// are never handed out (nor revoked: with rotation, revoking them
    /// would revoke the grant the stored tokens belong to).
    func refreshConflicted(_ key: SessionKey, entryID: UInt64, stored: SessionRecord?, revision: StoreRevision) async
        -> Result<SessionRecord, VaultError>
    {
        log.warning(
            "another host wrote this session while it was refreshed here; the stored tokens are served and the ones obtained here dropped",
            fields(key, event: "tokenRefreshed"))
        guard entries[key]?.id == entryID else { return .failure(.notLoggedIn(key.account)) }
        if let stored, stored.phase == .active {
            await applySharedPut(stored, revision: revision)
            if let served = entries[key]?.record, served.tokens == stored.tokens {
                await handle(key, .refreshAbandoned)
                return .success(served)
            }
        }
        if entries[key]?.id == entryID { await handle(key, .refreshAbandoned) }
        return .failure(.notLoggedIn(key.account))
    }
}
