import Foundation
import Synchronization
import Testing
import VaultCore

@testable import VaultDaemon
@testable import VaultFleet

/// EtcdLocks against a real three-member etcd fleet on loopback: one holder
/// among contenders, hand-over on release, a holder that stops renewing its
/// lease (as a killed one does) losing the lock, and compare-and-put.
@Suite(
    "etcd lock", .serialized, .ownThreads, .timeLimit(.minutes(5)), .etcdStep)
struct EtcdLockTests {
    static let callTimeout = 20.0
    static let prefix = Array("/vaultd/locks/".utf8)

    /// Three hosts' lock clients, each with a client of its own.
    static func hosts(_ fleet: EtcdFleet, ttl: Int64 = 10) -> [EtcdLocks] {
        ["host-a", "host-b", "host-c"].map {
            EtcdLocks(
                client: EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: callTimeout), prefix: prefix,
                holder: $0, defaultTTL: ttl)
        }
    }

    /// Should let exactly one of three contenders trying at once hold the
    /// lock, the others told who holds it; after release another gets it.
    @Test func oneHolderAmongContenders() async throws {
        let fleet = try await EtcdFleet()
        let hosts = Self.hosts(fleet)
        let attempts = try await withThrowingTaskGroup(of: (String, EtcdLocks.Attempt).self) { group in
            for host in hosts {
                group.addTask { (host.holder, try await host.tryAcquire("demo/alice")) }
            }
            var all: [(String, EtcdLocks.Attempt)] = []
            for try await attempt in group { all.append(attempt) }
            return all
        }
        var winners: [(String, EtcdHeldLock)] = []
        var holders: [String] = []
        for (host, attempt) in attempts {
            switch attempt {
            case .acquired(let held): winners.append((host, held))
            case .held(let holder, _, _): holders.append(holder)
            }
        }
        try #require(winners.count == 1, "holders: \(winners.map(\.0))")
        let (winner, held) = winners[0]
        #expect(holders == [winner, winner])
        let stored = try await hosts[0].client.range(hosts[0].key("demo/alice")).kvs.first
        #expect(stored.map { String(decoding: $0.value, as: UTF8.self) } == winner)
        #expect(stored?.lease == held.leaseID)
        #expect(held.isHeld)

        // Another lock name is independent.
        let other = try await hosts[0].tryAcquire("demo/bob")
        guard case .acquired(let bob) = other else {
            Issue.record("demo/bob should be free")
            return
        }

        // A waiter gets the lock once the holder releases it.
        let waiter = try #require(hosts.first { $0.holder != winner })
        let waiting = Task {
            try await waiter.acquire("demo/alice", deadline: .now + .seconds(30))
        }
        try await held.release()
        #expect(!held.isHeld)
        let next = try #require(try await waiting.value)
        #expect(next.isHeld)
        let now = try await waiter.client.range(waiter.key("demo/alice")).kvs.first
        #expect(now.map { String(decoding: $0.value, as: UTF8.self) } == waiter.holder)
        try await next.release()
        try await bob.release()
    }

    /// Should give the lock to a waiting host within TTL + 1 s once the
    /// holder stops renewing its lease without revoking it (a killed holder).
    @Test func abandonedLockGoesWhenItsLeaseExpires() async throws {
        let fleet = try await EtcdFleet()
        let ttl: Int64 = 3
        let hosts = Self.hosts(fleet, ttl: ttl)
        guard case .acquired(let held) = try await hosts[0].tryAcquire("demo/carol") else {
            Issue.record("demo/carol should be free")
            return
        }
        // The keep-alive holds it past its first TTL: the key stays, checked
        // every 100 ms for TTL + 1 s (a property over time, not a wait).
        let key = hosts[0].key("demo/carol")
        let held0 = ContinuousClock.now
        while ContinuousClock.now - held0 < .seconds(ttl + 1) {
            let kvs = try await hosts[1].client.range(key).kvs
            try #require(kvs.first?.lease == held.leaseID, "the lock went while its keep-alive ran")
            try await Task.sleep(for: .milliseconds(100))
        }
        guard case .held(let holder, _, _) = try await hosts[1].tryAcquire("demo/carol") else {
            Issue.record("the lock went while its keep-alive ran")
            return
        }
        #expect(holder == "host-a")

        let waiting = Task { try await hosts[1].acquire("demo/carol", deadline: .now + .seconds(30)) }
        let abandoned = ContinuousClock.now
        held.abandon()
        let next = try #require(try await waiting.value)
        let failover = ContinuousClock.now - abandoned
        print("etcd lock: abandoned with TTL \(ttl)s, taken over after \(failover)")
        #expect(failover <= .seconds(ttl + 1), "the lock went after \(failover), TTL \(ttl)s")
        #expect(next.isHeld)
        try await next.release()
    }

    /// Should tell the holder it lost the lock when its lease is gone (revoked or expired behind its back).
    @Test func holderLearnsOfALostLease() async throws {
        let fleet = try await EtcdFleet()
        let hosts = Self.hosts(fleet, ttl: 3)
        let lost = Mutex(false)
        guard
            case .acquired(let held) = try await hosts[0].tryAcquire(
                "demo/dave", onLost: { lost.withLock { $0 = true } })
        else {
            Issue.record("demo/dave should be free")
            return
        }
        try await hosts[1].client.revokeLease(held.leaseID)
        let told = try await eventually(
            tries: 100, interval: .milliseconds(50), { lost.withLock { $0 } }, until: { $0 })
        #expect(told)
        #expect(!held.isHeld)
    }

    /// Should write only at the expected revision (and only while holding the
    /// lock when given one), and name the current revision when refused.
    @Test func compareAndPutRefusesAStaleRevision() async throws {
        let fleet = try await EtcdFleet()
        let hosts = Self.hosts(fleet)
        let client = hosts[0].client
        let key = Array("/vaultd/sessions/demo/alice".utf8)

        let created = try await client.compareAndPut(key, Array("v1".utf8), expectedModRevision: 0)
        #expect(created.succeeded)
        let exists = try await client.compareAndPut(key, Array("v1 again".utf8), expectedModRevision: 0)
        #expect(!exists.succeeded)
        #expect(exists.current?.modRevision == created.revision)

        let swapped = try await client.compareAndPut(key, Array("v2".utf8), expectedModRevision: created.revision)
        #expect(swapped.succeeded)
        let stale = try await client.compareAndPut(key, Array("v3".utf8), expectedModRevision: created.revision)
        #expect(!stale.succeeded)
        #expect(stale.current?.modRevision == swapped.revision)
        #expect(stale.current?.value == Array("v2".utf8))
        #expect(try await client.range(key).kvs.first?.value == Array("v2".utf8))

        // Under the lock: written while it is held, refused once it is gone.
        guard case .acquired(let held) = try await hosts[0].tryAcquire("demo/alice") else {
            Issue.record("demo/alice should be free")
            return
        }
        let locked = try await client.compareAndPut(
            key, Array("v3".utf8), expectedModRevision: swapped.revision, whileHolding: held)
        #expect(locked.succeeded)
        try await held.release()
        let unlocked = try await client.compareAndPut(
            key, Array("v4".utf8), expectedModRevision: locked.revision, whileHolding: held)
        #expect(!unlocked.succeeded)
        #expect(try await client.range(key).kvs.first?.value == Array("v3".utf8))
    }
}
