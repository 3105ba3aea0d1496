import Glibc
import Synchronization
import Varlink
import VaultCore
import VaultDaemon
import VaultSystem

/// What an `EtcdStore`'s fleet calls share: the revision its feed starts
/// after, the feed and its watch, and the refresh locks this host holds.
struct FleetFeedState {
    /// The highest revision a load of every session was read at.
    var loadedRevision: Int64 = 0
    /// The feed `changes()` gave out, nil before it is asked for and after close.
    var continuation: AsyncStream<SharedChange>.Continuation?
    /// The watch that feeds it, nil between a reset and the next watch.
    var watch: EtcdWatch?
    /// The refresh locks this host holds, by lease id.
    var held: [UInt64: HeldRefreshLock] = [:]
    /// Set by `close()`: no watch starts after it.
    var closed = false
    /// The work that starts the feed's watch (`startWatch`), the latest one:
    /// cancelled when another replaces it and at `close()`.
    var starting: Task<Void, Never>?
}

/// A refresh lock held here, and the task that stops renewing it once the
/// longest refresh is over (`EtcdStore.refreshHoldSeconds`).
struct HeldRefreshLock {
    var lock: EtcdHeldLock
    var bound: Task<Void, Never>
}

/// The fleet's side of the etcd store, one to one on etcd:
/// - a record's revision is its key's `mod_revision`; `save(_:ifRevision:)`
///   is a transaction comparing it (0: the key must not exist; nil: none);
/// - `delete(_:ending:)` deletes the record and puts its ending under
///   `PREFIX/endings/` in one transaction, so the other hosts read both at
///   the revision of the delete; a later save of the session removes it;
/// - the refresh lock is `PREFIX/locks/PROVIDER/USER/OWNER`, created only when
///   absent under a lease of `LockTTL=` (`EtcdLocks`), renewed while this
///   host's refresh runs (at most `refreshHoldSeconds`), revoked at release;
///   a host that dies holding it loses it when the lease ends;
/// - `changes()` is a watch of the whole prefix from the revision the last
///   load was read at, resumed by `EtcdWatch` on another member after a
///   disconnect; a lock's key deleted (released, lapsed) gives `unlocked`;
///   a compacted revision gives `reset`, after which a new watch
///   starts from the revision then (the manager's reload reads at that one
///   or later, so nothing falls between the two).
extension EtcdStore: SharedSessionStore {
    /// `host-name pid N`: what a lock this vaultd holds says to the others.
    public static func defaultHostName() -> String {
        var name = [UInt8](repeating: 0, count: 256)
        let named = name.withUnsafeMutableBufferPointer { buffer in
            buffer.withMemoryRebound(to: CChar.self) { gethostname($0.baseAddress!, $0.count - 1) == 0 }
        }
        let host = named ? String(decoding: name.prefix { $0 != 0 }, as: UTF8.self) : "unknown-host"
        return "\(host) pid \(getpid())"
    }

    /// The feed starts after the latest revision a whole load was read at.
    func noteLoaded(_ revision: Int64) {
        fleet.withLock { $0.loadedRevision = max($0.loadedRevision, revision) }
    }

    public func loadShared(_ key: SessionKey?) async throws(VaultError) -> SharedContents {
        if let key {
            // One session's key; a record that cannot be read is an error here.
            let range = try await client.range(sessionKey(key.account, owner: try ownerName(key.owner)))
            var records: [SharedRecord] = []
            if let item = range.kvs.first {
                records.append(
                    SharedRecord(try self.record(of: item, key: key), revision: StoreRevision(item.modRevision)))
            }
            return SharedContents(records: records, endings: [:], revision: StoreRevision(range.revision))
        }
        // One range over the whole prefix: records and endings at one revision.
        let range = try await client.rangeAll(bytes(""), pageSize: pageSize)
        var records: [SharedRecord] = []
        var endings: [SessionKey: SessionEnding] = [:]
        for item in range.kvs {
            if segments(of: item.key, under: "endings", count: 3) != nil {
                if let key = sessionKey(ofPath: item.key, under: "endings"), let ending = Self.ending(item.value) {
                    endings[key] = ending
                }
                continue
            }
            guard item.key.starts(with: bytes("sessions/")) else { continue }
            switch decodeSession(item) {
            case .record(let record): records.append(SharedRecord(record, revision: StoreRevision(item.modRevision)))
            case .unreadable(let label):
                log.warning("a stored item could not be read as a session and is ignored", ["item": label])
            case .unknownOwner(let account, let owner): warnOfUnknownOwner(account, owner)
            }
        }
        noteLoaded(range.revision)
        return SharedContents(records: records, endings: endings, revision: StoreRevision(range.revision))
    }

    /// The record of `item`, the stored session of `key`; an error when it cannot be read.
    private func record(of item: EtcdKeyValue, key: SessionKey) throws(VaultError) -> SessionRecord {
        guard case .record(var record) = decodeSession(item) else {
            throw VaultError(
                .storeFailed,
                "the record of \(key.account) in etcd under \(prefix) cannot be read (damaged, or sealed under another key); log the session in again"
            )
        }
        record.ownerUID = key.owner
        return record
    }

    /// A plain write is a transaction without a comparison: the record and
    /// the removal of its ending at one revision (the session lives again).
    public func save(_ record: SessionRecord, ifRevision: StoreRevision?) async throws(VaultError) -> ConditionalSave {
        let owner = try ownerName(record.ownerUID)
        let path = path(record.account, owner: owner)
        let sessionKey = bytes("sessions/" + path)
        let result = try await client.txn(
            ifRevision.map { [.modRevision(sessionKey, equals: Int64($0))] } ?? [],
            success: [.put(sessionKey, sealedValue(record, owner: owner)), .delete(bytes("endings/" + path))],
            failure: ifRevision == nil ? [] : [.range(sessionKey)])
        if result.succeeded || ifRevision == nil { return .saved(revision: StoreRevision(result.revision)) }
        guard let current = result.ranges.first?.first else {
            return .conflict(current: nil, revision: StoreRevision(result.revision))
        }
        return .conflict(
            current: try self.record(of: current, key: record.key), revision: StoreRevision(current.modRevision))
    }

    @discardableResult
    public func delete(_ key: SessionKey, ending: SessionEnding) async throws(VaultError) -> StoreRevision {
        let path = path(key.account, owner: try ownerName(key.owner))
        var document: [String: JSON] = ["kind": .string(ending.kind.rawValue)]
        if let reason = ending.reason { document["reason"] = .string(reason) }
        let result = try await client.txn(
            [],
            success: [
                .put(bytes("endings/" + path), JSON.object(document).serialized()), .delete(bytes("sessions/" + path)),
            ])
        return StoreRevision(result.revision)
    }

    /// The ending stored as `value`; nil when it is not one.
    static func ending(_ value: [UInt8]) -> SessionEnding? {
        guard let document = try? JSON.parse(value),
            let kind = document["kind"]?.stringValue.flatMap({ EventKind(rawValue: $0) })
        else { return nil }
        return SessionEnding(kind: kind, reason: document["reason"]?.stringValue)
    }

    /// The session named by a key `PREFIX/KIND/PROVIDER/USER/OWNER`; nil when
    /// it is not one, or its owner is not a user of this host.
    func sessionKey(ofPath key: [UInt8], under kind: String) -> SessionKey? {
        guard let parts = segments(of: key, under: kind, count: 3),
            let account = try? Account.validate(provider: parts[0], user: parts[1]), let uid = names.uid(parts[2])
        else { return nil }
        return SessionKey(owner: uid, account: account)
    }

    // MARK: Refresh locks

    public func acquireRefreshLock(_ key: SessionKey) async throws(VaultError) -> RefreshLockAnswer {
        let name = path(key.account, owner: try ownerName(key.owner))
        let log = self.log
        let account = key.account.description
        // Counted from before the grant was asked for: the lease cannot end earlier.
        let asked = clock.preciseNow()
        let attempt = try await locks.tryAcquire(
            name, ttl: lockTTL,
            onLost: {
                log.warning(
                    "the refresh lock could not be renewed for a whole LockTTL; another host may refresh this session now",
                    ["account": account, "event": "tokenRefreshed"])
            })
        switch attempt {
        case .acquired(let held):
            let lease = RefreshLease(id: UInt64(bitPattern: held.leaseID), expiresAt: asked + Double(held.ttl))
            let hold = refreshHoldSeconds
            // Weakly: a lock released (or dropped) stops being renewed anyway.
            let bound = Task { [weak held] in
                try? await Task.sleep(for: .seconds(hold))
                guard !Task.isCancelled else { return }
                held?.abandon()
            }
            fleet.withLock { $0.held[lease.id] = HeldRefreshLock(lock: held, bound: bound) }
            return .granted(lease)
        case .held(_, _, let leaseID)
        where leaseID != 0 && fleet.withLock({ $0.held[UInt64(bitPattern: leaseID)]?.lock.isHeld == true }):
            // This host holds it still (refreshed tokens the store did not
            // take kept it): its next refresh goes on under it.
            return .granted(RefreshLease(id: UInt64(bitPattern: leaseID), expiresAt: asked + Double(lockTTL)))
        case .held(let holder, _, let leaseID):
            // The holder renews its lease while it refreshes; its end is what
            // the lease has left now (rounded down by etcd, so a second more).
            var left = Double(lockTTL)
            if leaseID != 0, let ttl = try? await client.leaseTimeToLive(leaseID) { left = Double(max(ttl, 0)) + 1 }
            return .heldBy(host: holder, expiresAt: clock.preciseNow() + left)
        }
    }

    /// Held while its renewals go on and the last one leaves the lease a
    /// margin (a quarter of the TTL, at most a second) before it could end.
    public func stillHolds(_ lease: RefreshLease, at now: Double) -> Bool {
        guard let held = fleet.withLock({ $0.held[lease.id]?.lock }), held.isHeld else { return false }
        let margin = Duration.milliseconds(min(1000, lockTTL * 250))
        return ContinuousClock.now + margin < held.heldUntil
    }

    public func releaseRefreshLock(_ key: SessionKey, lease: RefreshLease) async throws(VaultError) {
        guard let held = fleet.withLock({ $0.held.removeValue(forKey: lease.id) }) else { return }
        held.bound.cancel()
        try await held.lock.release()
    }

    // MARK: The change feed

    public func changes() -> AsyncStream<SharedChange> {
        let (stream, continuation) = AsyncStream.makeStream(of: SharedChange.self)
        // A second call replaces the first feed (which ends).
        let (from, previous) = fleet.withLock { state -> (Int64?, EtcdWatch?) in
            guard !state.closed else { return (nil, nil) }
            state.continuation?.finish()
            defer { state.watch = nil }
            state.continuation = continuation
            return (state.loadedRevision, state.watch)
        }
        previous?.stop(waitingAtMost: 1)
        guard let from else {
            continuation.finish()
            return stream
        }
        startWatchLater(after: from, thenReset: false)
        return stream
    }

    /// Starts the feed's watch (`startWatch`) off the caller, as the store's
    /// own work: it replaces (cancels) one still starting; `close()` cancels it.
    private func startWatchLater(after revision: Int64, thenReset: Bool) {
        fleet.withLock { state in
            guard !state.closed else { return }
            state.starting?.cancel()
            state.starting = Task { await self.startWatch(after: revision, thenReset: thenReset) }
        }
    }

    /// Starts the feed's watch after `revision` (0: after the store's
    /// revision now), then, with `thenReset`, tells the feed to reload.
    /// Tries to read the revision for at most about an hour (the store away).
    private func startWatch(after revision: Int64, thenReset: Bool) async {
        var from = revision
        var pause = Duration.milliseconds(50)
        // Bounded: about an hour of tries two seconds apart, the store away all along.
        for _ in 0..<2000 where from == 0 {
            if Task.isCancelled || fleet.withLock({ $0.closed }) { return }
            do throws(VaultError) {
                from = try await client.range(bytes("meta/key-id")).revision
            } catch {
                try? await Task.sleep(for: pause)
                pause = min(pause * 2, .seconds(2))
            }
        }
        guard from > 0 else {
            // Never from revision 1 (every change since the fleet began).
            log.error(
                "etcd could not be read for an hour; other hosts' changes are no longer followed: restart vaultd",
                ["event": "storeChanged"])
            return
        }
        let watch = EtcdWatch(
            client: client, prefix: bytes(""), fromRevision: from + 1,
            onEvents: { [weak self] events, _ in self?.deliver(events) },
            onReset: { [weak self] error in self?.feedLost(error) })
        let (continuation, replaced) = fleet.withLock {
            state -> (AsyncStream<SharedChange>.Continuation?, EtcdWatch?) in
            guard !state.closed, let continuation = state.continuation else { return (nil, nil) }
            defer { state.watch = watch }
            return (continuation, state.watch)
        }
        // One watch feeds at a time: one this replaces would deliver its changes twice.
        replaced?.stop(waitingAtMost: 1)
        guard let continuation else { return }
        do throws(VaultError) {
            try watch.start()
        } catch {
            log.error(
                "the etcd watch could not start; other hosts' changes are not followed: restart vaultd",
                ["error": error.message])
            return
        }
        if thenReset { continuation.yield(.reset) }
    }

    /// The watch ended for good (its revision compacted away): a new one
    /// starts from the revision now, and the feed says `reset`.
    private func feedLost(_ error: VaultError) {
        log.warning(
            "the etcd watch lost changes (compacted); every session is read again", ["error": error.message])
        startWatchLater(after: 0, thenReset: true)
    }

    /// One batch of the watch as the feed's changes: puts and deletes of
    /// sessions, each delete with the ending its transaction put beside it.
    /// Locks, revocations and keys of other programs are not changes of sessions.
    private func deliver(_ events: [EtcdWatchEvent]) {
        let sessions = bytes("sessions/")
        let endingsPrefix = bytes("endings/")
        // A delete's ending is the one its own transaction put (same path, same revision).
        struct Place: Hashable {
            var path: [UInt8]
            var revision: Int64
        }
        var endings: [Place: SessionEnding] = [:]
        for event in events where event.kind == .put && event.key.starts(with: endingsPrefix) {
            if let ending = Self.ending(event.value) {
                endings[Place(path: Array(event.key.dropFirst(endingsPrefix.count)), revision: event.modRevision)] =
                    ending
            }
        }
        // In the order of the events (revision order), one pass.
        var changes: [SharedChange] = []
        for event in events {
            let revision = StoreRevision(event.modRevision)
            if event.key.starts(with: sessions) {
                switch event.kind {
                case .put:
                    switch decodeSession(EtcdKeyValue(event)) {
                    case .record(let record): changes.append(.put(record, revision: revision))
                    case .unknownOwner: continue
                    case .unreadable(let label):
                        log.warning("a stored item could not be read as a session and is ignored", ["item": label])
                    }
                case .delete:
                    guard let key = sessionKey(ofPath: event.key, under: "sessions") else { continue }
                    let place = Place(path: Array(event.key.dropFirst(sessions.count)), revision: event.modRevision)
                    changes.append(.deleted(key, ending: endings[place], revision: revision))
                }
            } else if event.kind == .delete, let key = sessionKey(ofPath: event.key, under: "locks") {
                // A lock's key goes when it is released or its lease lapses: waiters try at once.
                changes.append(.unlocked(key))
            }
        }
        guard !changes.isEmpty, let continuation = fleet.withLock({ $0.continuation }) else { return }
        for change in changes { continuation.yield(change) }
    }

    /// Ends the feed and its watch; the locks still held stop being renewed
    /// and lapse with their leases (a refresh cut short may have rotated
    /// tokens the store does not hold yet: no other host may refresh from
    /// the stored ones before the lease ends).
    public func close() async {
        let (watch, continuation, held) = fleet.withLock { state in
            state.closed = true
            state.starting?.cancel()
            defer {
                state.watch = nil
                state.continuation = nil
                state.held = [:]
                state.starting = nil
            }
            return (state.watch, state.continuation, Array(state.held.values))
        }
        watch?.stop(waitingAtMost: 1)
        continuation?.finish()
        for lock in held {
            lock.bound.cancel()
            lock.lock.abandon()
        }
    }
}

extension EtcdKeyValue {
    /// The key and value a watch's put delivered.
    init(_ event: EtcdWatchEvent) {
        self.init(
            key: event.key, value: event.value, createRevision: event.createRevision, modRevision: event.modRevision,
            version: 0, lease: 0)
    }
}
