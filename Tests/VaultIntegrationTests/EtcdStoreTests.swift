import Foundation
import Glibc
import Testing
import VaultCore

@testable import VaultDaemon

/// A fleet's data key as systemd passes it: `data-key` (32 random bytes) in
/// a credentials directory of its own, the same for every host of a test.
struct EtcdFleetKey {
    let directory: String

    /// A new random key in `parent/NAME/data-key`.
    init(in parent: TemporaryDirectory, name: String = "credentials") throws {
        directory = parent.path(name)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let bytes = (0..<DataKey.byteCount).map { _ in UInt8.random(in: 0...255) }
        guard
            FileManager.default.createFile(
                atPath: directory + "/" + CredentialDataKeys.name, contents: Data(bytes),
                attributes: [.posixPermissions: 0o600])
        else { throw HarnessError("cannot write the data key in \(directory)") }
    }

    var keys: CredentialDataKeys { CredentialDataKeys(directory: directory) }
}

/// What etcd holds under `prefix`, keys and values, as `etcdctl get --prefix`
/// prints them: etcd's own client, not vaultd's code.
func etcdctlDump(_ fleet: EtcdFleet, prefix: String) throws -> String {
    let result = try runCommand(
        URL(fileURLWithPath: "/usr/bin/etcdctl"),
        ["--endpoints", fleet.endpoints.joined(separator: ","), "--command-timeout=20s", "get", "--prefix", prefix],
        environment: ["ETCDCTL_API": "3"])
    guard result.status == 0 else { throw HarnessError("etcdctl get failed: \(result.stderr)") }
    return result.stdout
}

/// Whether `secret` is in `dump` (etcdctl's output) as it is, or inside the
/// base64 of a value's `sealed` member: a value that was encoded, not sealed,
/// must not pass for sealed.
func etcdHoldsInClear(_ dump: String, _ secret: String) -> Bool {
    if dump.contains(secret) { return true }
    for line in dump.split(separator: "\n") {
        guard let document = try? JSON.parse(String(line)), let sealed = document["sealed"]?.stringValue,
            let bytes = Data(base64Encoded: sealed)
        else { continue }
        if String(decoding: bytes, as: UTF8.self).contains(secret) { return true }
    }
    return false
}

/// EtcdStore against a real three-member etcd fleet on loopback: sealed
/// values (no token in clear), the fleet's one key, owners by name across
/// hosts whose uids differ, and availability by quorum.
@Suite("etcd store", .serialized, .timeLimit(.minutes(5)), .etcdStep)
struct EtcdStoreTests {
    static let log = Logger(level: .error, target: .discard)

    static func settings(_ fleet: EtcdFleet, prefix: String = "/vaultd/", timeout: Int64 = 20) -> EtcdSettings {
        var settings = EtcdSettings()
        settings.endpoints = fleet.endpoints
        settings.keyPrefix = prefix
        settings.timeoutSeconds = timeout
        return settings
    }

    /// Host A: uid 1000 is alice; host B: alice is 2000; host C has no alice.
    static let hostA = OwnerNames(name: { $0 == 1000 ? "alice" : nil }, uid: { $0 == "alice" ? 1000 : nil })
    static let hostB = OwnerNames(name: { $0 == 2000 ? "alice" : nil }, uid: { $0 == "alice" ? 2000 : nil })
    static let hostC = OwnerNames(name: { _ in nil }, uid: { _ in nil })

    static func record(user: String, owner: UInt32, token: String, refresh: String) -> SessionRecord {
        var tokens = TokenSet(accessToken: Secret(token))
        tokens.refreshToken = Secret(refresh)
        return SessionRecord(
            account: Account(provider: "oauth", user: user), user: UserProfile(uid: user), tokens: tokens,
            createdAt: UnixTime(seconds: 1_700_000_000), expiresAt: nil, ownerUID: owner)
    }

    /// Should store sessions, revocations and client secrets sealed (etcdctl
    /// finds no token), read them back, and name the owner by user name.
    @Test func sealedRoundTripWithoutTokensInClear() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let store = try await EtcdStore.open(
            settings: Self.settings(fleet), keys: key.keys, log: Self.log, names: Self.hostA)
        let token = "access-\(UUID().uuidString)"
        let refresh = "refresh-\(UUID().uuidString)"
        let record = Self.record(user: "bot/1", owner: 1000, token: token, refresh: refresh)
        try await store.save(record)
        let revocation = PendingRevocation(
            queueing: Self.record(user: "gone", owner: 1000, token: "revoke-\(token)", refresh: "revoke-\(refresh)"))
        try await store.savePendingRevocation(revocation)
        try await store.saveProviderSecret("oauth", Secret("client-secret-\(token)"))

        let raw = try etcdctlDump(fleet, prefix: "/vaultd/")
        #expect(raw.contains("/vaultd/sessions/oauth/bot%2F1/alice"))
        #expect(raw.contains("/vaultd/revocations/oauth/gone/\(revocation.id)"))
        #expect(raw.contains("/vaultd/provider-secrets/oauth"))
        #expect(raw.contains("/vaultd/meta/key-id"))
        for secret in [token, refresh, "access-", "refresh-", "client-secret"] {
            #expect(!etcdHoldsInClear(raw, secret), "etcd holds '\(secret)' in clear")
        }

        #expect(try await store.loadAll().records == [record])
        let loadedRevocations = try await store.loadPendingRevocations()
        #expect(loadedRevocations.map(\.id) == [revocation.id])
        #expect(loadedRevocations.first?.record.tokens == revocation.record.tokens)
        #expect(try await store.loadProviderSecret("oauth")?.revealed == "client-secret-\(token)")

        try await store.delete(record.key)
        try await store.deletePendingRevocation(revocation)
        #expect(try await store.loadAll().records.isEmpty)
        #expect(try await store.loadPendingRevocations().isEmpty)
        #expect(try !etcdctlDump(fleet, prefix: "/vaultd/sessions/").contains("alice"))
    }

    /// Should give another host the session under its own uid for the same
    /// user name, and skip (leaving it in etcd) a session whose owner it does not know.
    @Test func ownersAreNamedAcrossHosts() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let settings = Self.settings(fleet)
        let hostA = try await EtcdStore.open(settings: settings, keys: key.keys, log: Self.log, names: Self.hostA)
        let record = Self.record(user: "bot", owner: 1000, token: "t-\(UUID().uuidString)", refresh: "r")
        try await hostA.save(record)

        let hostB = try await EtcdStore.open(settings: settings, keys: key.keys, log: Self.log, names: Self.hostB)
        let onB = try #require(try await hostB.loadAll().records.first)
        #expect(onB.ownerUID == 2000)
        #expect(onB.tokens == record.tokens)

        let hostC = try await EtcdStore.open(settings: settings, keys: key.keys, log: Self.log, names: Self.hostC)
        #expect(try await hostC.loadAll().records.isEmpty)
        #expect(try etcdctlDump(fleet, prefix: "/vaultd/sessions/").contains("/vaultd/sessions/oauth/bot/alice"))
        // A host that cannot name the owner cannot write the session either.
        await #expect(throws: VaultError.self) { try await hostC.save(record) }
    }

    /// Should refuse to open without the credential, and with a key other
    /// than the one the prefix's sessions are sealed under.
    @Test func refusesAMissingOrDifferentKey() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let settings = Self.settings(fleet)
        let missing = await #expect(throws: VaultError.self) {
            _ = try await EtcdStore.open(settings: settings, keys: nil, log: Self.log, names: Self.hostA)
        }
        #expect(missing?.message.contains("credential data-key") == true)

        let first = try EtcdFleetKey(in: temp, name: "first")
        let store = try await EtcdStore.open(settings: settings, keys: first.keys, log: Self.log, names: Self.hostA)
        try await store.save(Self.record(user: "bot", owner: 1000, token: "t", refresh: "r"))
        let other = try EtcdFleetKey(in: temp, name: "other")
        let refused = await #expect(throws: VaultError.self) {
            _ = try await EtcdStore.open(settings: settings, keys: other.keys, log: Self.log, names: Self.hostA)
        }
        #expect(refused?.code == .storeFailed)
        #expect(refused?.message.contains("every host of a fleet needs the same data key") == true)
        // Another prefix is another fleet: its first host records its own key.
        _ = try await EtcdStore.open(
            settings: Self.settings(fleet, prefix: "/other/"), keys: other.keys, log: Self.log, names: Self.hostA)
    }

    /// Should probe available with a quorum, unavailable without one, and
    /// available again when it returns.
    @Test func probeFollowsTheQuorum() async throws {
        let fleet = try await EtcdFleet()
        let temp = try TemporaryDirectory()
        let key = try EtcdFleetKey(in: temp)
        let store = try await EtcdStore.open(
            settings: Self.settings(fleet, timeout: 4), keys: key.keys, log: Self.log, names: Self.hostA)
        #expect(await store.probe() == .available)
        fleet.stop(0)
        fleet.stop(1)
        let probe = await store.probe()
        guard case .unavailable(let reason) = probe else {
            Issue.record("probe without a quorum: \(probe)")
            return
        }
        #expect(reason.contains("no etcd endpoint answered"))
        try fleet.start(0)
        try fleet.start(1)
        try await fleet.waitUntilServing()
        let back = try await eventually(
            tries: 100, interval: .milliseconds(100), { await store.probe() }, until: { $0 == .available })
        #expect(back == .available)
    }
}
