import Foundation
import Synchronization
import Testing
import Varlink
import VaultCore

@testable import VaultDaemon
@testable import VaultFleet

/// EtcdStore as a fleet's shared store (`SharedSessionStore`) against a real
/// three-member etcd: conditional writes on `mod_revision`, endings beside
/// deletes, the refresh lock between two hosts, and the change feed (another
/// host's writes with their revisions, a compacted revision as `reset`).
@Suite("etcd as the fleet's shared store", .serialized, .ownThreads, .timeLimit(.minutes(5)), .etcdStep)
struct EtcdSharedStoreTests {
    static let log = Logger(level: .error, target: .discard)
    static let names = OwnerNames(name: { $0 == 1000 ? "alice" : nil }, uid: { $0 == "alice" ? 1000 : nil })

    static func open(_ fleet: EtcdFleet, _ key: EtcdFleetKey, host: String, lockTTL: Int64 = 10) async throws
        -> EtcdStore
    {
        var settings = EtcdStoreTests.settings(fleet)
        settings.lockTTLSeconds = lockTTL
        return try await EtcdStore.open(
            settings: settings, keys: key.keys, log: log, names: names, host: host, refreshHoldSeconds: 30)
    }

    static func record(_ user: String, token: String) -> SessionRecord {
        EtcdStoreTests.record(user: user, owner: 1000, token: token, refresh: "refresh-\(token)")
    }

    /// Should write over the revision compared only, answer a conflict with
    /// the record etcd holds and its revision, and read the record back at
    /// it; a plain write lands over anything, at the revision it answers.
    @Test func conditionalWritesCompareTheRevision() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let store = try await Self.open(fleet, key, host: "a")
        let first = Self.record("carol", token: "t1")
        guard case .saved(let revision) = try await store.save(first, ifRevision: 0) else {
            Issue.record("a first write over revision 0 (no record) was refused")
            return
        }
        #expect(try await store.loadShared(first.key).records.first == SharedRecord(first, revision: revision))

        let second = Self.record("carol", token: "t2")
        let stale = try await store.save(second, ifRevision: 0)
        #expect(stale == .conflict(current: first, revision: revision), "a write over a stale revision landed")
        let wrong = try await store.save(second, ifRevision: revision + 100)
        #expect(wrong == .conflict(current: first, revision: revision))
        guard case .saved(let later) = try await store.save(second, ifRevision: revision) else {
            Issue.record("a write over the current revision was refused")
            return
        }
        #expect(later > revision)
        #expect(try await store.loadShared(first.key).records.first?.record == second)

        try await store.delete(first.key, ending: SessionEnding(kind: .kickedOffline, reason: "admin"))
        #expect(try await store.loadShared(first.key).records.first == nil)
        let gone = try await store.save(first, ifRevision: later)
        #expect(gone == .conflict(current: nil, revision: gone.revision), "a write over a deleted record landed")
        // A plain write lands whatever the store holds, at the revision it answers.
        guard case .saved(let plain) = try await store.save(first, ifRevision: nil) else {
            Issue.record("a plain write was refused")
            return
        }
        #expect(plain > later)
        #expect(try await store.loadShared(first.key).records.first == SharedRecord(first, revision: plain))
        await store.close()
    }

    /// Should keep a delete's ending for a reload, and drop it when the session is stored again.
    @Test func endingsLastUntilTheNextLogin() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let store = try await Self.open(fleet, key, host: "a")
        let record = Self.record("dave", token: "t1")
        try await store.apply(.save(record))
        try await store.delete(record.key, ending: SessionEnding(kind: .kickedOffline, reason: "kicked by ops"))
        let ended = try await store.loadShared(nil)
        #expect(ended.records.isEmpty)
        #expect(ended.endings[record.key] == SessionEnding(kind: .kickedOffline, reason: "kicked by ops"))
        #expect(ended.revision > 0)

        try await store.apply(.save(record))
        let again = try await store.loadShared(nil)
        #expect(again.records.map(\.record) == [record])
        #expect(again.endings[record.key] == nil, "a stored session kept the ending of its last logout")
        #expect(try !etcdctlDump(fleet, prefix: "/vaultd/endings/").contains("dave"))
        await store.close()
    }

    /// Should grant an account's refresh lock to one host, tell the other who
    /// holds it and until about when, and grant it to the other once released.
    @Test func refreshLockBetweenTwoHosts() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let hostA = try await Self.open(fleet, key, host: "host-a", lockTTL: 6)
        let hostB = try await Self.open(fleet, key, host: "host-b", lockTTL: 6)
        let account = Self.record("erin", token: "t1").key
        guard case .granted(let lease) = try await hostA.acquireRefreshLock(account) else {
            Issue.record("the first host was not granted a free lock")
            return
        }
        let now = SystemWallClock().preciseNow()
        guard case .heldBy(let holder, let until) = try await hostB.acquireRefreshLock(account) else {
            Issue.record("a second host was granted a lock another host holds")
            return
        }
        #expect(holder == "host-a")
        // etcd rounds the lease's time left down; one second is added.
        #expect(until > now + 3 && until <= now + 8, "the holder's lease ends at \(until - now) s from now")
        #expect(try etcdctlDump(fleet, prefix: "/vaultd/locks/").contains("/vaultd/locks/oauth/erin/alice"))

        try await hostA.releaseRefreshLock(account, lease: lease)
        guard case .granted(let second) = try await hostB.acquireRefreshLock(account) else {
            Issue.record("a released lock was not granted to the next host")
            return
        }
        try await hostB.releaseRefreshLock(account, lease: second)
        await hostA.close()
        await hostB.close()
    }

    /// Should keep renewing a held lock past its TTL while this host holds
    /// it, and let it lapse once the holder stops renewing (as when it dies).
    @Test func heldLockIsRenewedAndLapsesWithItsHolder() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let hostA = try await Self.open(fleet, key, host: "host-a", lockTTL: 2)
        let hostB = try await Self.open(fleet, key, host: "host-b", lockTTL: 2)
        let account = Self.record("frank", token: "t1").key
        guard case .granted = try await hostA.acquireRefreshLock(account) else {
            Issue.record("the first host was not granted a free lock")
            return
        }
        // Past the TTL (renewed every 2/3 s): still held.
        let renewedUntil = ContinuousClock.now + .seconds(3)
        while ContinuousClock.now < renewedUntil {
            guard case .heldBy = try await hostB.acquireRefreshLock(account) else {
                Issue.record("a lock its holder renews lapsed")
                return
            }
            try await Task.sleep(for: .milliseconds(250))
        }
        // The holder goes: the lease lapses within its TTL (and etcd's checks).
        await hostA.close()
        let stopped = ContinuousClock.now
        var granted: RefreshLease?
        for _ in 0..<200 where granted == nil && ContinuousClock.now - stopped < .seconds(10) {
            if case .granted(let lease) = try await hostB.acquireRefreshLock(account) { granted = lease }
            try await Task.sleep(for: .milliseconds(100))
        }
        let waited = ContinuousClock.now - stopped
        let lease = try #require(granted, "the lock of a holder that stopped never lapsed")
        #expect(waited < .seconds(4), "the lock lapsed \(waited) after its holder stopped (TTL 2 s)")
        try await hostB.releaseRefreshLock(account, lease: lease)
        await hostB.close()
    }

    /// Should feed another host's puts and deletes with their revisions, a
    /// delete with its ending, and nothing for lock keys.
    @Test func feedCarriesOtherHostsChanges() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let writer = try await Self.open(fleet, key, host: "writer")
        let reader = try await Self.open(fleet, key, host: "reader")
        _ = try await reader.loadAll()
        let feed = FeedLog(reader.changes())

        let record = Self.record("gina", token: "t1")
        guard case .saved(let revision) = try await writer.save(record, ifRevision: 0) else {
            Issue.record("the first write was refused")
            return
        }
        var change = await feed.next()
        #expect(change == .put(record, revision: revision))

        // A lock taken is not a change of the session; released, it says so to the waiters.
        guard case .granted(let lease) = try await writer.acquireRefreshLock(record.key) else {
            Issue.record("a free lock was not granted")
            return
        }
        try await writer.releaseRefreshLock(record.key, lease: lease)
        change = await feed.next()
        #expect(change == .unlocked(record.key), "the feed gave \(String(describing: change)) for a released lock")
        try await writer.delete(record.key, ending: SessionEnding(kind: .kickedOffline, reason: "ops"))
        change = await feed.next()
        guard case .deleted(let deleted, let ending, let at) = change else {
            Issue.record("the feed gave \(String(describing: change)), not the delete")
            return
        }
        #expect(deleted == record.key)
        #expect(ending == SessionEnding(kind: .kickedOffline, reason: "ops"))
        #expect(at > revision)

        try await writer.apply(.save(record))
        change = await feed.next()
        guard case .put(let again, _) = change else {
            Issue.record("the feed gave \(String(describing: change)), not the login")
            return
        }
        #expect(again == record)
        try await writer.apply(.delete(record.key))
        change = await feed.next()
        guard case .deleted(_, let plain, _) = change else {
            Issue.record("the feed gave \(String(describing: change)), not the plain delete")
            return
        }
        #expect(plain == nil, "a plain delete came with the ending of an earlier one")
        await writer.close()
        await reader.close()
    }

    /// Should read a store larger than one answer in pages, all at one
    /// revision: 300 sessions (about 400 KB in etcd's answer, over the 64 KiB
    /// of a token response) with the default page and with pages of 64.
    @Test func largeStoreIsReadInPages() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let writer = try await Self.open(fleet, key, host: "writer")
        var written: [SessionRecord] = []
        for index in 0..<300 {
            let record = Self.record("user\(index)", token: "token-\(index)-" + String(repeating: "x", count: 400))
            written.append(record)
            try await writer.apply(.save(record))
        }
        let expected = written.sorted { $0.key < $1.key }
        var settings = EtcdStoreTests.settings(fleet)
        settings.lockTTLSeconds = 10
        for pageSize: Int64 in [1000, 64] {
            let reader = try await EtcdStore.open(
                settings: settings, keys: key.keys, log: Self.log, names: Self.names, host: "reader", pageSize: pageSize
            )
            let all = try await reader.loadAll().records.sorted { $0.key < $1.key }
            #expect(all == expected, "page size \(pageSize): \(all.count) of 300 read")
            let shared = try await reader.loadShared(nil)
            #expect(shared.records.count == 300, "page size \(pageSize)")
            #expect(Set(shared.records.map(\.revision)).count == 300, "each record at its own write's revision")
            await reader.close()
        }
        await writer.close()
    }

    /// Should give each delete of a batch the ending of its own transaction:
    /// a kick, a login and a logout of one session read in one go.
    @Test func batchedDeletesKeepTheirOwnEndings() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let writer = try await Self.open(fleet, key, host: "writer")
        let reader = try await Self.open(fleet, key, host: "reader")
        let record = Self.record("kim", token: "t1")
        try await writer.apply(.save(record))
        _ = try await reader.loadAll()
        // Before the reader's feed starts: its watch reads the three from the revision it loaded.
        try await writer.delete(record.key, ending: SessionEnding(kind: .kickedOffline, reason: "spam"))
        try await writer.apply(.save(record))
        try await writer.delete(record.key, ending: SessionEnding(kind: .logoutSuccess))
        let feed = FeedLog(reader.changes())
        var kinds: [String] = []
        for _ in 0..<3 {
            switch await feed.next() {
            case .deleted(_, let ending, _)?:
                kinds.append("deleted:\(ending?.kind.rawValue ?? "-"):\(ending?.reason ?? "-")")
            case .put?: kinds.append("put")
            case let other: kinds.append("\(String(describing: other))")
            }
        }
        #expect(kinds == ["deleted:kickedOffline:spam", "put", "deleted:logoutSuccess:-"])
        await writer.close()
        await reader.close()
    }

    /// Should say `reset` when the feed's revision was compacted away, then
    /// go on feeding changes from the revision after it.
    @Test func compactedFeedResets() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let writer = try await Self.open(fleet, key, host: "writer")
        let reader = try await Self.open(fleet, key, host: "reader")
        _ = try await reader.loadAll()
        for index in 0..<3 { try await writer.apply(.save(Self.record("hal\(index)", token: "t\(index)"))) }
        let latest = try await writer.client.range(Array("/vaultd/meta/key-id".utf8)).revision
        _ = try await HTTPClient.postJSON(
            fleet.endpoints[0] + "/v3/kv/compaction",
            JSON.object(["revision": .string(String(latest)), "physical": true]).serialized(), timeoutSeconds: 20)

        let feed = FeedLog(reader.changes())
        var change = await feed.next()
        #expect(change == .reset, "a feed from a compacted revision gave \(String(describing: change))")
        let record = Self.record("ivy", token: "t9")
        try await writer.apply(.save(record))
        change = await feed.next()
        guard case .put(let fed, _) = change else {
            Issue.record("after the reset the feed gave \(String(describing: change))")
            return
        }
        #expect(fed == record)
        await writer.close()
        await reader.close()
    }
}

/// Every change a feed gave, read in order by `next()`.
final class FeedLog: Sendable {
    private final class Received: Sendable {
        let changes = Mutex<[SharedChange]>([])
    }
    private let received = Received()
    private let read = Mutex(0)
    private let task: Task<Void, Never>

    init(_ stream: AsyncStream<SharedChange>) {
        let received = self.received
        task = Task { for await change in stream { received.changes.withLock { $0.append(change) } } }
    }

    deinit { task.cancel() }

    /// The next change not read yet, waiting at most `seconds` for it
    /// (polled every 20 ms); nil when none came.
    func next(seconds: Double = EtcdFleet.waitTimeout) async -> SharedChange? {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        let index = read.withLock { $0 }
        for _ in 0..<100_000 {
            if let change = received.changes.withLock({ $0.count > index ? $0[index] : nil }) {
                read.withLock { $0 = index + 1 }
                return change
            }
            guard ContinuousClock.now < deadline else { return nil }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return nil
    }
}

extension ConditionalSave {
    /// The revision either answer names.
    var revision: StoreRevision {
        switch self {
        case .saved(let revision), .conflict(_, let revision): revision
        }
    }
}
