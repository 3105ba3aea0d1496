import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

@testable import VaultDaemon
@testable import VaultFleet

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
@Suite("etcd store", .serialized, .ownThreads, .timeLimit(.minutes(5)), .etcdStep)
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
        try await store.apply(.save(record))
        let revocation = PendingRevocation(
            queueing: Self.record(user: "gone", owner: 1000, token: "revoke-\(token)", refresh: "revoke-\(refresh)"))
        try await store.apply(.savePendingRevocation(revocation))
        try await store.apply(.saveProviderSecret("oauth", Secret("client-secret-\(token)")))

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

        try await store.apply(.delete(record.key))
        try await store.apply(.deletePendingRevocation(revocation))
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
        try await hostA.apply(.save(record))

        let hostB = try await EtcdStore.open(settings: settings, keys: key.keys, log: Self.log, names: Self.hostB)
        let onB = try #require(try await hostB.loadAll().records.first)
        #expect(onB.ownerUID == 2000)
        #expect(onB.tokens == record.tokens)

        let hostC = try await EtcdStore.open(settings: settings, keys: key.keys, log: Self.log, names: Self.hostC)
        #expect(try await hostC.loadAll().records.isEmpty)
        #expect(try etcdctlDump(fleet, prefix: "/vaultd/sessions/").contains("/vaultd/sessions/oauth/bot/alice"))
        // A host that cannot name the owner cannot write the session either.
        await #expect(throws: VaultError.self) { try await hostC.apply(.save(record)) }
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
        try await store.apply(.save(Self.record(user: "bot", owner: 1000, token: "t", refresh: "r")))
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

    /// Should reach members that serve https and require a client
    /// certificate with [Etcd] CAFile=, CertFile= and KeyFile=, and fail
    /// without the client certificate.
    @Test func tlsWithClientCertificate() async throws {
        let temp = try TemporaryDirectory()
        let certificates = try EtcdTestCertificates(in: temp.url.path)
        let fleet = try await EtcdFleet(tls: certificates)
        let key = try EtcdFleetKey(in: temp)
        var settings = Self.settings(fleet)
        #expect(settings.endpoints.allSatisfy { $0.hasPrefix("https://") })
        settings.caFile = certificates.caFile
        settings.certFile = certificates.clientCert
        settings.keyFile = certificates.clientKey
        let store = try await EtcdStore.open(settings: settings, keys: key.keys, log: Self.log, names: Self.hostA)
        let record = Self.record(user: "bot", owner: 1000, token: "t-\(UUID().uuidString)", refresh: "r")
        try await store.apply(.save(record))
        #expect(try await store.loadAll().records == [record])

        var withoutCertificate = settings
        withoutCertificate.certFile = nil
        withoutCertificate.keyFile = nil
        withoutCertificate.timeoutSeconds = 5
        let refused = await #expect(throws: VaultError.self) {
            _ = try await EtcdStore.open(
                settings: withoutCertificate, keys: key.keys, log: Self.log, names: Self.hostA)
        }
        #expect(refused?.code == .storeUnavailable, "\(refused?.message ?? "")")
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

/// Real vaultd processes with `Store=etcd` on a three-member fleet, with an
/// oauth2 provider at the test token server: sessions restored from etcd, by
/// the same host after a restart and by a second host; the store gate while
/// the fleet loses its quorum.
final class EtcdDaemonFixture {
    let fleet: EtcdFleet
    let server: TokenServer
    let directory: TemporaryDirectory
    let key: EtcdFleetKey
    let configPath: String
    var daemons: [RunningDaemon] = []

    /// `etcd` is added to the `[Etcd]` section (`LockTTL=3`, for one); with
    /// `revocation` the provider revokes at the token server's /revoke.
    init(timeout: Int = 10, etcd: String = "", revocation: Bool = false) async throws {
        fleet = try await EtcdFleet()
        // Tokens outlive the test: a refresh would change the token it compares.
        server = try TokenServer(["--lifetime", "600"])
        directory = try TemporaryDirectory()
        key = try EtcdFleetKey(in: directory)
        configPath = directory.path("vaultd.conf")
        let text =
            "[Vault]\nStore=etcd\nMinRefreshInterval=0\n\n" + server.providerSection(revocation: revocation)
            + "\n[Etcd]\nEndpoints="
            + fleet.endpoints.joined(separator: ",") + "\nTimeout=\(timeout)\n" + etcd
        try text.write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    /// The socket of host `host` (a vaultd of the fleet).
    func socket(_ host: Int) -> String { directory.path("vaultd-\(host).sock") }

    /// Starts the vaultd of `host` on the fleet and waits for ready.
    @discardableResult
    func start(_ host: Int, environment: [String: String] = [:]) throws -> RunningDaemon {
        let daemon = try RunningDaemon(
            socketPath: socket(host), configPath: configPath,
            environment: environment.merging(["CREDENTIALS_DIRECTORY": key.directory]) { $1 }, engine: .etcd)
        daemons.append(daemon)
        return daemon
    }

    func login(_ host: Int, _ user: String) async throws -> CommandResult {
        try vaultctl(socket(host), ["login", "oauth", user], input: try await server.grant())
    }

    /// The access token `host` serves for `user`, nil when it serves none.
    func token(_ host: Int, _ user: String) throws -> String? {
        let result = try vaultctl(socket(host), ["token", "oauth", user])
        return result.status == 0 ? result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) : nil
    }

    /// `store` as ListSessions answers it on `host`.
    func storeState(_ host: Int) throws -> String? {
        let client = try VarlinkClient(path: socket(host), timeoutSeconds: 30)
        return try client.call(VaultMethod.listSessions.rawValue).parameters["store"]?.stringValue
    }

    /// What etcd holds under the sessions' prefix.
    func sessionKeys() throws -> String { try etcdctlDump(fleet, prefix: "/vaultd/sessions/") }

    deinit { for daemon in daemons { daemon.stop() } }
}

@Suite("vaultd on etcd", .serialized, .ownThreads, .timeLimit(.minutes(5)), .etcdStep)
struct EtcdDaemonTests {
    /// Should restore a login from etcd after a restart and on a second host,
    /// keep no token in clear in etcd, and remove the key at logout.
    @Test func sessionsLiveInEtcd() async throws {
        let fixture = try await EtcdDaemonFixture()
        let first = try fixture.start(0)
        let user = uniqueName("fleet")
        let login = try await fixture.login(0, user)
        #expect(login.status == 0, "\(login.stderr)")
        let token = try #require(try fixture.token(0, user))
        #expect(try fixture.sessionKeys().contains("/vaultd/sessions/oauth/\(user)/root"))
        let dump = try etcdctlDump(fixture.fleet, prefix: "/vaultd/")
        #expect(!etcdHoldsInClear(dump, token), "etcd holds the access token in clear")

        #expect(first.stop() == 0)
        fixture.daemons.removeAll()
        try fixture.start(0)
        #expect(try fixture.token(0, user) == token, "restored from etcd after a restart")

        // A second host, another socket, the same prefix and key.
        try fixture.start(1)
        #expect(try fixture.token(1, user) == token, "restored from etcd by a second host")

        let logout = try vaultctl(fixture.socket(0), ["logout", "oauth", user])
        #expect(logout.status == 0, "\(logout.stderr)")
        #expect(try !fixture.sessionKeys().contains(user))
    }

    /// Should keep working with one member down; with two down refuse logins
    /// with ERR_SECRET_STORE_UNAVAILABLE, serve a logged session's token and
    /// report the store unavailable; and take logins again once they return.
    @Test func quorumLossGatesChanges() async throws {
        let fixture = try await EtcdDaemonFixture(timeout: 3)
        let notify = try NotifyListener(path: fixture.directory.path("notify"))
        try fixture.start(0, environment: ["NOTIFY_SOCKET": notify.path])
        let kept = uniqueName("kept")
        #expect(try await fixture.login(0, kept).status == 0)
        let token = try #require(try fixture.token(0, kept))

        fixture.fleet.stop(0)
        let second = uniqueName("second")
        let login = try await fixture.login(0, second)
        #expect(login.status == 0, "one member down: \(login.stderr)")
        let logout = try vaultctl(fixture.socket(0), ["logout", "oauth", second])
        #expect(logout.status == 0, "one member down: \(logout.stderr)")
        #expect(try !fixture.sessionKeys().contains(second))

        fixture.fleet.stop(1)
        let asked = ContinuousClock.now
        let refused = try await fixture.login(0, uniqueName("refused"))
        // Within one Timeout= (3 s) of tries over every endpoint.
        let took = ContinuousClock.now - asked
        #expect(took < .seconds(5), "the first refused login took \(took) with Timeout=3")
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("ERR_SECRET_STORE_UNAVAILABLE"), "\(refused.stderr)")
        #expect(try fixture.token(0, kept) == token, "served from memory without a quorum")
        let state = try await eventually(tries: 100, interval: .milliseconds(100)) {
            try fixture.storeState(0)
        } until: {
            $0 == "unavailable"
        }
        #expect(state == "unavailable")
        // The gate's probes (from 0.5 s on) find no quorum either: the store
        // stays unavailable while the members are down, watched for 3 s.
        let stays = try await eventually(tries: 30, interval: .milliseconds(100)) {
            try fixture.storeState(0)
        } until: {
            $0 != "unavailable"
        }
        #expect(stays == "unavailable", "a probe without a quorum found the store \(stays ?? "nil")")
        // Refused by the gate at once, saying what brings an etcd store back (not the Secret Service's remedy).
        let gated = try await fixture.login(0, uniqueName("gated"))
        #expect(gated.status != 0)
        #expect(gated.stderr.contains("a quorum of the etcd members"), "\(gated.stderr)")
        #expect(!gated.stderr.contains("gnome-keyring"), "\(gated.stderr)")
        // Said where an operator looks: systemd's STATUS= and vaultctl's list.
        #expect(notify.wait(for: "store=unavailable (no quorum): read-only") != nil, "\(notify.messages)")
        let list = try vaultctl(fixture.socket(0), ["list"])
        #expect(list.stdout.hasPrefix("store: unavailable:"), "\(list.stdout)")
        let listJSON = try vaultctl(fixture.socket(0), ["--json", "list"])
        #expect(try JSON.parse(listJSON.stdout)["store"]?.stringValue == "unavailable", "\(listJSON.stdout)")

        try fixture.fleet.start(0)
        try fixture.fleet.start(1)
        try await fixture.fleet.waitUntilServing()
        // The gate probes with backoff (at most 15 s apart).
        let back = try await eventually(tries: 600, interval: .milliseconds(100)) {
            try fixture.storeState(0)
        } until: {
            $0 == "available"
        }
        #expect(back == "available")
        let again = uniqueName("again")
        let relogin = try await fixture.login(0, again)
        #expect(relogin.status == 0, "quorum back: \(relogin.stderr)")
        #expect(try fixture.sessionKeys().contains("/vaultd/sessions/oauth/\(again)/root"))
    }

    /// Should skip, with a warning naming the user, a session whose owner has
    /// no account on this host, and leave it in etcd.
    @Test func unknownOwnerIsSkipped() async throws {
        let fixture = try await EtcdDaemonFixture()
        let stranger = "nobody-here-\(UUID().uuidString.prefix(6).lowercased())"
        let names = OwnerNames(name: { _ in stranger }, uid: { _ in 0 })
        var settings = EtcdSettings()
        settings.endpoints = fixture.fleet.endpoints
        settings.timeoutSeconds = 20
        let seeder = try await EtcdStore.open(
            settings: settings, keys: fixture.key.keys, log: Logger(level: .error, target: .discard), names: names)
        try await seeder.apply(
            .save(
                SessionRecord(
                    account: Account(provider: "oauth", user: "elsewhere"), user: UserProfile(uid: "elsewhere"),
                    tokens: TokenSet(accessToken: Secret("elsewhere-token")), createdAt: UnixTime(seconds: 1),
                    expiresAt: nil, ownerUID: 4242)))

        let daemon = try fixture.start(0)
        #expect(daemon.output.text.contains(stranger), "the warning names the owner: \(daemon.output.text)")
        #expect(try fixture.token(0, "elsewhere") == nil)
        #expect(try fixture.sessionKeys().contains("/vaultd/sessions/oauth/elsewhere/\(stranger)"))
    }
}
