import Foundation
import Testing
import VaultCore

@testable import VaultDaemon
@testable import VaultFleet

/// EtcdClient against a real three-member etcd fleet on loopback: the JSON
/// gateway's key-value, transaction and lease calls, and failover between
/// endpoints as members stop and return.
@Suite(
    "etcd client", .serialized, .ownThreads, .timeLimit(.minutes(5)), .etcdStep)
struct EtcdClientTests {
    /// Every byte value, so that base64 both ways is checked on all of them.
    static let binary: [UInt8] = (0...255).map { UInt8($0) } + [0, 0xFF, 0x0A, 0x22, 0x5C]

    /// Should read back exactly the bytes put, keys and values binary-safe, and range by prefix.
    @Test func putRangeRoundTripIsBinarySafe() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: EtcdFleet.waitTimeout)
        let key: [UInt8] = Array("vaultd/\u{1}\u{FF}".utf8) + [0xFF, 0x00, 0x80]
        let revision = try await client.put(key, Self.binary)
        #expect(revision > 0)
        try await client.put(Array("vaultd/other".utf8), Array("second".utf8))
        try await client.put(Array("vaultdx".utf8), Array("outside the prefix".utf8))

        let one = try await client.range(key)
        #expect(one.kvs.count == 1)
        #expect(one.kvs.first?.key == key)
        #expect(one.kvs.first?.value == Self.binary)
        #expect(one.kvs.first?.modRevision == revision)
        #expect(one.kvs.first?.createRevision == revision)

        let prefixed = try await client.range(Array("vaultd/".utf8), prefix: true)
        // Sorted by key bytes: "vaultd/\u{1}..." before "vaultd/other".
        #expect(prefixed.kvs.map(\.value) == [Self.binary, Array("second".utf8)])
        #expect(try await client.range(Array("absent".utf8)).kvs.isEmpty)

        #expect(try await client.delete(Array("vaultd/".utf8), prefix: true) == 2)
        #expect(try await client.range(key).kvs.isEmpty)
        #expect(try await client.range(Array("vaultdx".utf8)).kvs.count == 1)
    }

    /// Should apply a compare-and-swap on the revision read once, and refuse it on a stale revision.
    @Test func txnCompareAndSwap() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: EtcdFleet.waitTimeout)
        let key = Array("vaultd/account".utf8)

        // Create only when absent (create_revision 0).
        let created = try await client.txn(
            [.createRevision(key, equals: 0)], success: [.put(key, Array("v1".utf8))], failure: [.range(key)])
        #expect(created.succeeded)
        let again = try await client.txn(
            [.createRevision(key, equals: 0)], success: [.put(key, Array("v1 again".utf8))], failure: [.range(key)])
        #expect(!again.succeeded)
        #expect(again.ranges.first?.first?.value == Array("v1".utf8))

        let read = try #require(try await client.range(key).kvs.first)
        let swapped = try await client.txn(
            [.modRevision(key, equals: read.modRevision)], success: [.put(key, Array("v2".utf8))])
        #expect(swapped.succeeded)
        let stale = try await client.txn(
            [.modRevision(key, equals: read.modRevision)], success: [.put(key, Array("v3".utf8))],
            failure: [.range(key)])
        #expect(!stale.succeeded)
        #expect(stale.ranges.first?.first?.value == Array("v2".utf8))
        #expect(try await client.range(key).kvs.first?.value == Array("v2".utf8))
    }

    /// Should attach a key to a lease, keep the lease alive, and drop the key when the lease is revoked.
    @Test func leaseRevokeRemovesItsKeys() async throws {
        let fleet = try await EtcdFleet()
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: EtcdFleet.waitTimeout)
        let key = Array("vaultd/lock/account".utf8)
        let lease = try await client.grantLease(ttl: 10)
        #expect(lease.id != 0)
        #expect(lease.ttl == 10)
        try await client.put(key, Array("host-a".utf8), lease: lease.id)
        #expect(try await client.range(key).kvs.first?.lease == lease.id)
        let ttl = try await client.keepAlive(lease.id)
        #expect(ttl > 0 && ttl <= 10)

        try await client.revokeLease(lease.id)
        #expect(try await client.range(key).kvs.isEmpty)
        #expect(try await client.keepAlive(lease.id) == 0)
    }

    /// Should keep working with one member down, fail with storeUnavailable
    /// within the timeout with two down, and work again once they return.
    @Test func failsOverAndReportsUnavailable() async throws {
        let fleet = try await EtcdFleet()
        let timeout = 4.0
        // The bound asserted below is this client's; every other call waits
        // for an answer (a new leader's election) with the generous one.
        let bounded = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: timeout)
        let client = EtcdClient(endpoints: fleet.endpoints, timeoutSeconds: EtcdFleet.waitTimeout)
        let key = Array("vaultd/failover".utf8)
        try await client.put(key, Array("before".utf8))

        // The first endpoint, the one the client prefers, goes away.
        fleet.kill(0)
        try await client.put(key, Array("one down".utf8))
        #expect(try await client.range(key).kvs.first?.value == Array("one down".utf8))

        fleet.stop(1)
        let started = Date()
        let error = await #expect(throws: VaultError.self) { try await bounded.put(key, Array("no quorum".utf8)) }
        let elapsed = Date().timeIntervalSince(started)
        #expect(error?.code == .storeUnavailable)
        #expect(error?.message.contains("no etcd endpoint answered") == true)
        #expect(elapsed < timeout + 1.5, "the call took \(elapsed)s, its timeout is \(timeout)s")
        await #expect(throws: VaultError.self) { _ = try await bounded.range(key) }

        try fleet.start(0)
        try fleet.start(1)
        try await fleet.waitUntilServing()
        let back = try await eventually(
            tries: 100, interval: .milliseconds(100),
            { () async -> Bool in (try? await client.put(key, Array("after".utf8))) != nil }, until: { $0 })
        #expect(back)
        #expect(try await client.range(key).kvs.first?.value == Array("after".utf8))
    }
}
