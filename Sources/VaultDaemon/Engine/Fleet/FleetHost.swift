import Synchronization
import VaultCore

/// A host of a fleet: several vaultd share one store (`SharedSessionStore`).
/// Each serves from memory, as a single host does, and follows the store's
/// change feed: another host's login, refresh and logout reach this host's
/// table, its subscribers and its timers. A refresh is made by one host at a
/// time, the one holding the account's refresh lock; the others wait for
/// its tokens (FleetHost+Refresh.swift). A host that cannot reach the store
/// serves the tokens it has, refuses logins and logouts (`StoreGate`), never
/// refreshes, and reloads the store when it is back. See docs/LIFECYCLE.md, "Fleet".
///
/// Besides the manager's entries it keeps the revision of each session's
/// last change it applied (a change at or below it is one it has seen); the
/// refreshes waiting for another host's wait on the manager
/// (`Waiter.Purpose.otherHost`).
final class FleetHost: StoreSharing {
    /// The store the fleet shares, called through the manager's gate.
    let store: FleetStore
    var shared: any SharedSessionStore { store.shared }
    /// Per session, the revision of the last change applied here.
    var revisions: [SessionKey: StoreRevision] = [:]
    /// Refreshes under way here and not waiting for another host.
    var refreshing = 0
    /// The background work that applies the feed (`follow`), stopped first at shutdown.
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
    /// client (`catchUp`), so that repeated misses read it once a second.
    var lookedUp: [SessionKey: Double] = [:]
    /// The store reads of `catchUp` in flight: a client that asks for
    /// the same session meanwhile waits for that read instead of being
    /// answered "not logged in" by the once-a-second limit.
    var catchingUp: [SessionKey: Task<Void, any Error>] = [:]

    init(_ store: FleetStore) { self.store = store }

    var revokesSupersededTokens: Bool { false }

    func refreshDecided(_ key: SessionKey) { refreshing += 1 }

    var deleteRecord: @Sendable (SessionKey, SessionEnding) async throws(VaultError) -> Void {
        { [store] key, ending throws(VaultError) in try await store.deleteShared(key, ending: ending) }
    }

    /// Catches up with the store first, then writes what this host could
    /// not (over the revision it last saw, `persist`: another host's newer
    /// change wins). The store holds other hosts' sessions too: nothing is
    /// removed.
    func writeThrough(_ manager: isolated SessionManager) async {
        await reload(manager)
        for key in manager.entries.keys.sorted() {
            guard let entry = manager.entries[key], entry.record != nil, entry.login == nil, entry.logout == nil,
                entry.replace == nil, entry.refresh == nil, entry.timers.status.unsaved || entry.unqueue != nil
            else { continue }
            await manager.persist(key)
        }
    }

    func saveBeforeStopping(_ key: SessionKey, entryID: UInt64, _ manager: isolated SessionManager) async {
        // Over the revision last seen: another host may have rotated these tokens away since.
        await persist(key, entryID: entryID, manager)
        if manager.entries[key]?.id == entryID, manager.entries[key]?.timers.status.unsaved == true {
            manager.log.error(
                "refreshed tokens could not be stored before stopping", manager.fields(key, event: "tokenRefreshed"))
        }
    }

    // MARK: Following the store

    func follow(_ manager: isolated SessionManager) {
        let changes = shared.changes()
        follower = manager.spawn {
            for await change in changes { await manager.applySharedChange(change) }
        }
    }

    func stopFollowing(_ manager: isolated SessionManager) {
        // The feed never ends by itself: other hosts' changes stop here.
        if let id = follower { manager.background[id]?.cancel() }
    }

    /// Applies one change of the shared store's feed.
    func apply(_ change: SharedChange, _ manager: isolated SessionManager) async {
        switch change {
        case .put(let record, let revision): applyPut(record, revision: revision, manager)
        case .deleted(let key, let ending, let revision):
            applyDelete(key, ending: ending, revision: revision, manager)
        case .unlocked(let key): wakeWaiters(key, manager)
        case .reset: await reload(manager)
        }
    }

    /// A record written by any host: a session this host does not serve
    /// begins here (`loginSuccess`); newer tokens of one it serves are
    /// served (`tokenRefreshed`). A session with a login, logout or replace
    /// in flight here is left to it; a logout's mark is left to its delete.
    func applyPut(
        _ record: SessionRecord, revision: StoreRevision, force: Bool = false, _ manager: isolated SessionManager
    ) {
        let key = record.key
        if !force, revision <= knownRevision(key, manager) { return }
        if record.phase == .active, let own = writing[key], own == record.tokens {
            // This host's own write, ahead of the store's answer: its writer goes on with it.
            if (revisions[key] ?? 0) < revision { revisions[key] = revision }
            return
        }
        if deferWhileBusy(key, ending: nil, manager) { return }
        revisions[key] = max(revision, revisions[key] ?? 0)
        defer { wakeWaiters(key, manager) }
        guard record.phase == .active else { return }
        let entry = manager.entries[key]
        let now = manager.clock.now()
        switch entry?.machine.state ?? .loggedOut {
        case .loggedOut:
            var fresh = entry ?? manager.makeEntry(record.account)
            _ = fresh.machine.loginRequested()
            fresh.machine.loginSucceeded(record)
            manager.entries[key] = fresh
            manager.renewParkedEntry(key)
            manager.handle(
                key, .stored(manager.facts(record, refreshedAt: record.tokens.issuedAt ?? record.createdAt), now: now))
            manager.log.info("logged in on another host", manager.fields(key, event: "loginSuccess"))
            manager.emit(.loginSuccess, key)
            manager.wakeLoginWaiters(key)
        case .loggedIn(let served):
            guard served.tokens != record.tokens else { return }
            manager.entries[key]?.machine.refreshed(record)
            // Served before it is announced, as a refresh of this host's own.
            manager.publishView(key)
            manager.log.info("tokens refreshed on another host", manager.fields(key, event: "tokenRefreshed"))
            manager.events(
                VaultEvent(
                    kind: .tokenRefreshed, account: key.account, ownerUID: key.owner, time: now,
                    expiresAt: record.expiresAt))
            // A fresh timed life (an end this host could not store while it
            // was cut off is the old tokens'), refreshed now.
            let newFacts = manager.facts(record, refreshedAt: record.tokens.issuedAt ?? now)
            manager.handle(key, .replaced(newFacts, now: now))
            manager.handle(key, .refreshed(newFacts, saved: true, now: now))
        case .loggingIn, .loggingOut, .replacing:
            return
        }
    }

    /// A session deleted by any host: ended here with the event its
    /// tombstone names (a plain delete: `logoutSuccess`). Its revocation is
    /// the business of the host that ended it; so is an automatic login after it.
    func applyDelete(
        _ key: SessionKey, ending: SessionEnding?, revision: StoreRevision, force: Bool = false,
        _ manager: isolated SessionManager
    ) {
        if !force, revision <= knownRevision(key, manager) { return }
        if deferWhileBusy(key, ending: ending, manager) { return }
        revisions[key] = max(revision, revisions[key] ?? 0)
        defer { wakeWaiters(key, manager) }
        guard let entry = manager.entries[key], entry.record != nil else { return }
        let ending = ending ?? SessionEnding(kind: .logoutSuccess)
        manager.table.publish(key, SessionView(state: .logout, record: nil))
        manager.emit(ending.kind, key, reason: ending.reason)
        _ = manager.entries[key]?.machine.logoutRequested()
        manager.entries[key]?.machine.logoutFinished(succeeded: true)
        _ = manager.entries[key]?.machine.sessionEnded(ending.kind, now: manager.clock.now())
        manager.forget(key)
        manager.rearmTimer()
        var logFields = manager.fields(key, event: ending.kind.rawValue)
        logFields["reason"] = ending.reason
        manager.log.info("logged out on another host", logFields)
    }

    /// The revision of the last change of `key` this host applied or wrote
    /// itself (a login's plain write is known before the feed brings it: an
    /// older change the feed brings first must not undo it).
    func knownRevision(_ key: SessionKey, _ manager: isolated SessionManager) -> StoreRevision {
        max(revisions[key] ?? 0, store.writes.last(key))
    }

    /// A change of a session with a login, logout or replace in flight here
    /// is not applied now (the local change is half done); once that ends,
    /// the session is read from the store again and what it holds then is
    /// applied. Returns false when nothing is in flight.
    private func deferWhileBusy(_ key: SessionKey, ending: SessionEnding?, _ manager: isolated SessionManager) -> Bool {
        guard let entry = manager.entries[key], entry.login != nil || entry.logout != nil || entry.replace != nil
        else { return false }
        manager.spawn {
            await manager.waitForChangeInFlight(key)
            await manager.resyncShared(key, ending: ending)
        }
        return true
    }

    /// A session this host does not know of, asked for by a client (GetToken,
    /// GetSession, Refresh, Logout): another host may have logged it in a
    /// moment ago, ahead of the feed (a watch resuming after a member died).
    /// Read from the store once, so that a client that logged in on one host
    /// is served on the next; the same miss is read at most once a second.
    /// A store that cannot be read throws its error: "not logged in" would
    /// be a guess.
    func catchUp(_ key: SessionKey, _ manager: isolated SessionManager) async throws(VaultError) {
        guard manager.entries[key] == nil else { return }
        if let reading = catchingUp[key] {
            try await Self.finished(reading)
            return
        }
        let now = manager.clock.preciseNow()
        if let last = lookedUp[key], now - last < 1 { return }
        if lookedUp.count >= 1024 { lookedUp = [:] }
        lookedUp[key] = now
        // On the manager: the record is applied before any waiter resumes. A
        // task runs isolated to the isolated parameter it uses in its body
        // (a capture list does not count), hence the first line.
        let reading = Task { () async throws in
            _ = manager
            defer { self.catchingUp[key] = nil }
            let stored: SharedRecord?
            do throws(VaultError) {
                stored = try await store.loadShared(key)
            } catch {
                // Read again at the next ask, not a second later.
                self.lookedUp[key] = nil
                throw error
            }
            if let stored { self.applyPut(stored.record, revision: stored.revision, force: true, manager) }
        }
        catchingUp[key] = reading
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
    func resync(_ key: SessionKey, ending: SessionEnding?, _ manager: isolated SessionManager) async {
        let stored: SharedRecord?
        do throws(VaultError) {
            stored = try await store.loadShared(key)
        } catch {
            // Gone: the store's return reloads everything.
            return
        }
        if let stored {
            applyPut(stored.record, revision: stored.revision, force: true, manager)
        } else {
            applyDelete(key, ending: ending, revision: revisions[key] ?? 0, force: true, manager)
        }
    }

    /// Reads the whole store and applies what differs: the feed lost changes
    /// (`reset`), or the store is back after this host could not reach it.
    /// A change the feed applied meanwhile at a later revision is kept.
    func reload(_ manager: isolated SessionManager) async {
        let contents: SharedContents
        do throws(VaultError) {
            contents = try await store.loadShared()
        } catch {
            // Gone again: the gate probes, and this runs when it is back.
            return
        }
        var stored = Set<SessionKey>()
        for shared in contents.records {
            stored.insert(shared.record.key)
            applyPut(shared.record, revision: shared.revision, manager)
        }
        for key in manager.entries.keys.sorted() where !stored.contains(key) && manager.entries[key]?.record != nil {
            applyDelete(key, ending: contents.endings[key], revision: contents.revision, manager)
        }
        manager.log.notice(
            "caught up with the shared store",
            ["event": "storeChanged", "revision": String(contents.revision), "sessions": String(stored.count)])
    }

    /// A change of `key` was applied: the refreshes waiting for another
    /// host's tokens of it look again.
    func wakeWaiters(_ key: SessionKey, _ manager: isolated SessionManager) {
        wakeups[key, default: 0] &+= 1
        manager.wakeWaiters(for: .otherHost(key))
    }
}

/// The fleet's part of the manager, as tests and the feed's task reach it.
extension SessionManager {
    /// The host of a fleet this manager is, if it is one.
    var fleetHost: FleetHost? { sharing as? FleetHost }

    /// The sessions whose refresh waits for another host's tokens now (tests wait for them).
    public var waitingForOtherHosts: Set<SessionKey> {
        Set(
            waiting {
                if case .otherHost(let key) = $0 { key } else { nil }
            })
    }

    /// Refreshes under way on this host that do not wait for another host
    /// (the simulation moves its clock only when there are none). A refresh
    /// counts from when it is decided, and again from when its wait is ended
    /// (before its task resumes): a clock moved in either gap could end a
    /// lease with a refresh about to present the token.
    public var fleetRefreshesUnderWay: Int {
        guard let fleet = fleetHost else { return 0 }
        let woken = waiters.values.count {
            if case .otherHost = $0.purpose { $0.continuation == nil } else { false }
        }
        return fleet.refreshing + woken
    }

    /// Applies one change of the shared store's feed (the feed's task calls
    /// this; the simulation delivers changes itself). Nothing on a single host.
    public func applySharedChange(_ change: SharedChange) async {
        await fleetHost?.apply(change, self)
    }

    /// Applies what the store holds of `key` now (`FleetHost.resync`).
    func resyncShared(_ key: SessionKey, ending: SessionEnding?) async {
        await fleetHost?.resync(key, ending: ending, self)
    }
}
