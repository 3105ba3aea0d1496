import Synchronization
import VaultCore
import VaultDaemon
import VaultSystem

/// Lease-backed locks in etcd, one per name (an account), for "one refresh
/// per account across the fleet".
///
/// `tryAcquire` grants a lease of `ttl` seconds and, in one transaction,
/// creates the lock's key attached to it only if the key does not exist
/// (`create_revision == 0`); the key's value names the holder (this host's
/// id). The holder keeps the lease alive every TTL/3 until `release()`
/// revokes it; a holder that dies (or is cut off from the quorum) stops
/// renewing it, etcd expires the lease after its TTL and deletes the key,
/// and the next contender gets the lock. `acquire` waits for the holder's
/// key to go through a watch of that key (re-checked at least every second,
/// should the watch not be streaming) until a deadline.
///
/// A holder that cannot renew its lease for a whole TTL must assume it lost
/// the lock (another host may hold it now): `EtcdHeldLock.isHeld` turns
/// false and `onLost` is called. Writes made under the lock should go through
/// `EtcdClient.compareAndPut(_:_:expectedModRevision:whileHolding:)`, which
/// checks in the same transaction that the lock is still this one.
final class EtcdLocks: Sendable {
    /// The client the locks' calls go through.
    let client: EtcdClient
    /// The prefix of the locks' keys (`/vaultd/locks/`): a lock's key is the prefix and its name.
    let prefix: [UInt8]
    /// Who this host is, the value of the keys it holds (what `held(by:)` names to the others).
    let holder: String
    /// The lease's time to live, in seconds, when `tryAcquire` is given none.
    let defaultTTL: Int64
    /// The client a held lock's renewals go through (`client` by default):
    /// one whose calls end well within the TTL.
    let renewalClient: EtcdClient

    /// Locks under `prefix` held in the name of `holder`, each living `defaultTTL` seconds without renewal.
    init(
        client: EtcdClient, prefix: [UInt8], holder: String, defaultTTL: Int64 = 10, renewalClient: EtcdClient? = nil
    ) {
        self.client = client
        self.renewalClient = renewalClient ?? client
        self.prefix = prefix
        self.holder = holder
        self.defaultTTL = defaultTTL
    }

    /// The key of the lock `name`.
    func key(_ name: String) -> [UInt8] { prefix + Array(name.utf8) }

    /// What one attempt found.
    enum Attempt: Sendable {
        /// This host holds the lock now.
        case acquired(EtcdHeldLock)
        /// `holder` holds it under `lease` (0: the key went meanwhile); its
        /// key is at `revision` (the store's revision when read).
        case held(by: String, revision: Int64, lease: Int64)
    }

    /// One attempt at the lock `name`: a lease of `ttl` seconds (the default
    /// when nil) and the key created with it when absent. `onLost` is called
    /// (once, from a task of the keep-alive) if the lease is found gone or
    /// cannot be renewed for a whole TTL before `release()`.
    func tryAcquire(_ name: String, ttl: Int64? = nil, onLost: @escaping @Sendable () -> Void = {})
        async throws(VaultError) -> Attempt
    {
        let ttl = max(2, ttl ?? defaultTTL)
        let key = key(name)
        // The lease lives from its grant at the latest: renewals count from here.
        let asked = ContinuousClock.now
        let lease = try await client.grantLease(ttl: ttl)
        let result: EtcdTxnResult
        do {
            result = try await client.txn(
                [.createRevision(key, equals: 0)], success: [.put(key, Array(holder.utf8), lease: lease.id)],
                failure: [.range(key)])
        } catch {
            // The put may have landed (a timeout after it was applied): the
            // revoke deletes the key with the lease, so no orphan lock lasts.
            try? await client.revokeLease(lease.id)
            throw error
        }
        guard result.succeeded else {
            try? await client.revokeLease(lease.id)
            let current = result.ranges.first?.first
            return .held(
                by: current.map { String(decoding: $0.value, as: UTF8.self) } ?? "nobody (it was just released)",
                revision: result.revision, lease: current?.lease ?? 0)
        }
        let held = EtcdHeldLock(
            client: client, renewalClient: renewalClient, name: name, key: key, leaseID: lease.id,
            ttl: lease.ttl > 0 ? lease.ttl : ttl,
            revision: result.revision, granted: asked, onLost: onLost)
        held.startKeepAlive()
        return .acquired(held)
    }

    /// Takes the lock `name`, waiting while another host holds it until
    /// `deadline`; nil when it was still held then (or the task was cancelled). The wait follows the
    /// holder's key through a watch and tries again as soon as it is deleted
    /// (released, or its lease expired).
    func acquire(
        _ name: String, ttl: Int64? = nil, deadline: ContinuousClock.Instant,
        onLost: @escaping @Sendable () -> Void = {}
    ) async throws(VaultError) -> EtcdHeldLock? {
        // Bounded: each round either returns or waits until the key changes,
        // a second passes or the deadline does.
        while true {
            let attempt = try await tryAcquire(name, ttl: ttl, onLost: onLost)
            switch attempt {
            case .acquired(let held):
                return held
            case .held(_, let revision, _):
                // A cancelled caller's wait returns at once: it stops trying.
                guard ContinuousClock.now < deadline, !Task.isCancelled else { return nil }
                await waitForDeletion(key(name), after: revision, until: deadline)
            }
        }
    }

    /// Returns when the key is deleted after `revision`, the watch ends, a
    /// second passes (the re-check should the watch not be streaming) or
    /// `deadline` comes, whichever is first.
    private func waitForDeletion(_ key: [UInt8], after revision: Int64, until deadline: ContinuousClock.Instant)
        async
    {
        let signal = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        let watch = EtcdWatch(
            client: client, prefix: key, exactKey: true, fromRevision: revision + 1, idleTimeoutSeconds: 5,
            onEvents: { events, _ in
                if events.contains(where: { $0.kind == .delete }) { signal.continuation.yield() }
            },
            onReset: { _ in signal.continuation.yield() })
        // The stream is cut at once: the wait for its thread is a few milliseconds.
        defer { watch.stop(waitingAtMost: 1) }
        guard (try? watch.start()) != nil else { return }
        let wait = min(deadline, ContinuousClock.now + .seconds(1))
        await withTaskGroup(of: Void.self) { group in
            group.addTask {
                var iterator = signal.stream.makeAsyncIterator()
                _ = await iterator.next()
            }
            group.addTask { try? await Task.sleep(until: wait, clock: .continuous) }
            _ = await group.next()
            group.cancelAll()
        }
    }
}

/// A lock this host holds: its lease is kept alive every TTL/3 until
/// `release()`. `revision` (the store's revision when the key was created)
/// is the lock's fencing token: `compareAndPut(..., whileHolding:)` writes
/// only while the key is still the one created then.
final class EtcdHeldLock: Sendable {
    /// The lock's name and key.
    let name: String
    let key: [UInt8]
    /// The lease the key is attached to.
    let leaseID: Int64
    /// The lease's time to live, in seconds.
    let ttl: Int64
    /// The revision the key was created at.
    let revision: Int64

    private let client: EtcdClient
    private let renewalClient: EtcdClient
    private let onLost: @Sendable () -> Void
    private struct State {
        var held = true
        var keepAlive: Task<Void, Never>?
        /// When the lease was last known alive for a whole TTL more: asked
        /// for (granted or renewed) at this instant, at the latest.
        var renewed: ContinuousClock.Instant
    }
    private let state: Mutex<State>

    init(
        client: EtcdClient, renewalClient: EtcdClient? = nil, name: String, key: [UInt8], leaseID: Int64, ttl: Int64,
        revision: Int64,
        granted: ContinuousClock.Instant = .now, onLost: @escaping @Sendable () -> Void
    ) {
        self.client = client
        self.renewalClient = renewalClient ?? client
        self.name = name
        self.key = key
        self.leaseID = leaseID
        self.ttl = ttl
        self.revision = revision
        self.onLost = onLost
        state = Mutex(State(renewed: granted))
    }

    /// False once the lock was released, or its lease found gone or not
    /// renewed for a whole TTL (another host may hold it now).
    var isHeld: Bool { state.withLock { $0.held } }

    /// The earliest the lease can end unless renewed again: a TTL after the
    /// last grant or renewal was asked for (etcd counts from when it got it).
    var heldUntil: ContinuousClock.Instant { state.withLock { $0.renewed + .seconds(ttl) } }

    deinit {
        // Dropped without release(): the lease is no longer renewed and the
        // lock goes when it expires, as when its holder dies.
        state.withLock { $0.keepAlive?.cancel() }
    }

    /// Starts renewing the lease every TTL/3 (counted from the grant) until
    /// `release()` or `abandon()`.
    func startKeepAlive() {
        let granted = state.withLock { $0.renewed }
        // The task holds the lock weakly: a lock dropped stops being renewed.
        let task = Task { [weak self, renewalClient, leaseID, ttl] in
            let interval = Duration.milliseconds(max(1, ttl) * 1000 / 3)
            var lastRenewed = granted
            // The next renewal is due a third of a TTL after the last one was asked for.
            var due = granted + interval
            while !Task.isCancelled, self != nil {
                try? await Task.sleep(until: due, clock: .continuous)
                guard !Task.isCancelled else { return }
                let asked = ContinuousClock.now
                do {
                    if try await renewalClient.keepAlive(leaseID) > 0 {
                        lastRenewed = asked
                        due = asked + interval
                        self?.state.withLock { $0.renewed = asked }
                        continue
                    }
                } catch {
                    // No quorum answered: the lease may still live; give up only
                    // after a whole TTL, trying again soon (it runs out meanwhile).
                    if ContinuousClock.now - lastRenewed < .seconds(ttl) {
                        due = ContinuousClock.now + interval / 4
                        continue
                    }
                }
                guard !Task.isCancelled else { return }
                self?.lose()
                return
            }
        }
        state.withLock { $0.keepAlive = task }
    }

    /// Marks the lock lost and tells the owner, once.
    private func lose() {
        let wasHeld = state.withLock { state in
            defer { state.held = false }
            return state.held
        }
        if wasHeld { onLost() }
    }

    /// Stops renewing the lease without revoking it, as a holder that died
    /// would: the lock goes when the lease expires. For tests of that case.
    func abandon() {
        state.withLock { state in
            state.held = false
            state.keepAlive?.cancel()
            state.keepAlive = nil
        }
    }

    /// Releases the lock: stops the keep-alive and revokes the lease, which
    /// deletes the key, so a waiting host gets the lock at once. When etcd
    /// cannot be reached the lock goes when the lease expires.
    func release() async throws(VaultError) {
        state.withLock { state in
            state.held = false
            state.keepAlive?.cancel()
            state.keepAlive = nil
        }
        try await client.revokeLease(leaseID)
    }
}

/// What a compare-and-put did.
struct EtcdCompareAndPut: Sendable, Equatable {
    /// True when the value was written.
    var succeeded: Bool
    /// The store's revision after the transaction (the written key's new mod revision when it succeeded).
    var revision: Int64
    /// When it failed: the key as it is now (nil when absent).
    var current: EtcdKeyValue?
}

extension EtcdClient {
    /// Writes `value` to `key` only if the key is still at `expectedModRevision`
    /// (0: only if it does not exist), and, given `lock`, only while that lock
    /// is still held by this host (its key created at its revision): "write the
    /// rotated tokens only if the record is still at the revision I refreshed
    /// from, and I still hold the refresh lock". On failure, the key as it is now.
    func compareAndPut(
        _ key: [UInt8], _ value: [UInt8], expectedModRevision: Int64, whileHolding lock: EtcdHeldLock? = nil
    ) async throws(VaultError) -> EtcdCompareAndPut {
        var compares: [EtcdCompare] = [.modRevision(key, equals: expectedModRevision)]
        if let lock { compares.append(.createRevision(lock.key, equals: lock.revision)) }
        let result = try await txn(compares, success: [.put(key, value)], failure: [.range(key)])
        return EtcdCompareAndPut(
            succeeded: result.succeeded, revision: result.revision,
            current: result.succeeded ? nil : result.ranges.first?.first)
    }
}
