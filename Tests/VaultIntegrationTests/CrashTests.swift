import Foundation
import Glibc
import Synchronization
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultDaemon
import VaultProtocol

/// One vaultd that the test kills and restarts on the same socket and store
/// (the keyring scope, or the SQLite database and its key), the token server
/// it refreshes and revokes at, and a reader of the store (vaultd's own
/// `LibsecretStore` or `SQLiteStore` over the same scope or file) for what is
/// really stored.
final class CrashRig {
    let server: TokenServer
    let fixture: DaemonFixture
    private(set) var daemon: RunningDaemon
    let engine: StoreEngine
    private let keyring: LibsecretStore?
    /// Seconds from each restart to vaultd's `ready`.
    private(set) var restartSeconds: [Double] = []

    /// An oauth2 provider `oauth` (rotating refresh tokens, revocation) and a
    /// static `demo`, vaultd on `engine` (SQLite: its key from a credential).
    /// `oauthTimeout`: the `Timeout=` of `oauth`, when not vaultd's default.
    init(engine: StoreEngine, serverArguments: [String] = ["--lifetime", "600"], oauthTimeout: String? = nil) throws {
        self.engine = engine
        server = try TokenServer(serverArguments)
        // The extra text follows [Provider oauth]'s lines: a Timeout= there is oauth's.
        let timeout = oauthTimeout.map { "Timeout=\($0)\n" } ?? ""
        fixture = try DaemonFixture(
            oauthServer: server, revocation: true, extra: timeout + "\n[Provider demo]\nType=static\n", engine: engine)
        daemon = try fixture.start()
        keyring = engine == .secretService ? try LibsecretStore.open(timeoutSeconds: 10, scope: fixture.scope) : nil
    }

    /// The store as it is now: the keyring's one connection, or the
    /// database opened for this look (a second connection beside vaultd's;
    /// WAL lets it read while vaultd writes).
    func store() async throws -> any SessionStore {
        if let keyring { return keyring }
        return try await fixture.store.open()
    }

    var socket: String { fixture.socketPath }

    /// SIGKILL, then waits (bounded) until the process is gone.
    func kill() {
        Glibc.kill(daemon.process.processIdentifier, SIGKILL)
        _ = daemon.waitForExit()
    }

    /// Starts vaultd again on the same socket and store, and waits for `ready`.
    func restart() throws {
        let started = Date()
        daemon = try fixture.start()
        restartSeconds.append(Date().timeIntervalSince(started))
    }

    /// One call on a connection of its own.
    func call(_ method: VaultMethod, _ parameters: [String: JSON]) throws -> VarlinkReply {
        try VarlinkClient(path: socket, timeoutSeconds: 30).call(method.rawValue, parameters)
    }

    /// A subscriber to one account's events, past its snapshot.
    func subscribe(_ provider: String, _ user: String, timeoutSeconds: Int = 10) throws -> VarlinkClient {
        try subscription(socket, provider: provider, user: user, timeoutSeconds: timeoutSeconds).watcher
    }

    /// The kinds of the events `watcher` gets until one of `kind` arrives (bounded in count and by its timeout).
    func kinds(until kind: String, on watcher: VarlinkClient) -> [String] {
        var seen: [String] = []
        for _ in 0..<20 {
            guard let reply = try? watcher.nextReply(), let event = reply.parameters["event"],
                let name = event["kind"]?.stringValue
            else { break }
            seen.append(name)
            if name == kind { break }
        }
        return seen
    }

    /// The token server's counter `name`.
    func counter(_ name: String) async throws -> Int64 { try await server.stats()[name]?.integerValue ?? -1 }
}

/// The state one account may be found in after the next restart: each access
/// token it may hold, nil for logged out, `anyNew` for tokens a refresh got.
struct Allowed: CustomStringConvertible {
    static let anyNew = "<refreshed>"
    var values: Set<String?>

    func admits(_ token: String?, old: String?) -> Bool {
        if values.contains(token) { return true }
        return token != nil && token != old && values.contains(Self.anyNew)
    }

    var description: String {
        values.map { $0.map { $0 == Self.anyNew ? $0 : Secret.mask($0) } ?? "logged out" }.sorted().joined(
            separator: " or ")
    }
}

/// SIGKILL of the real vaultd at random points of its writes, restarted on the
/// same store each time and checked against what the test was told: on each
/// engine, in every run (so not again in the SQLite run).
@Suite(
    "Crash consistency: SIGKILL of vaultd", .requiresKeyring, .bothEnginesInOrdinaryRun, .ownThreads,
    .timeLimit(.minutes(5)),
    .serialized)
struct CrashTests {
    enum Operation: String, CaseIterable {
        case login, refresh, logout, kick, providerSecret
    }

    /// What a round left to check.
    struct Round {
        var operation: Operation
        var user: String?
        var acknowledged = false
        var reply: String = "none"
        /// The session's refresh token before a refresh round, and the server's refresh count then.
        var refreshTokenBefore: String?
        var refreshRequestsBefore: Int64 = 0
    }

    /// The seed: `VAULTD_CRASH_SEED` replays one run.
    static func seed() -> UInt64 {
        if let text = ProcessInfo.processInfo.environment["VAULTD_CRASH_SEED"], let seed = UInt64(text) { return seed }
        return UInt64.random(in: 1...UInt64(UInt32.max))
    }

    /// The long form's 1,000 kills come in five parts of 200, each under the suite's time limit.
    static let parts = Array(0..<Soak.size(short: 1, long: 5))

    @Test(
        "Should lose no acknowledged change, undo no acknowledged logout, half-write nothing and send no rotated refresh token again across random SIGKILLs",
        arguments: TestStore.localEngines, parts)
    func randomKills(engine: StoreEngine, part: Int) async throws {
        let environment = ProcessInfo.processInfo.environment
        let kills = environment["VAULTD_CRASH_KILLS"].flatMap(Int.init) ?? Soak.size(short: 50, long: 200)
        // VAULTD_CRASH_ONLY=refresh: every round a refresh (or the login one needs), to measure the window.
        let only = environment["VAULTD_CRASH_ONLY"].flatMap(Operation.init(rawValue:))
        let seed = Self.seed() &+ UInt64(part)
        print(
            "CrashTests.randomKills: \(engine.rawValue), part \(part), seed \(seed), \(kills) kills (replay: VAULTD_CRASH_SEED=\(seed))"
        )
        var rng = SplitMix(seed)
        let rig = try CrashRig(engine: engine)
        let run = uniqueName("k")
        let oauthUsers = (0..<4).map { "\(run)-o\($0)" }
        let staticUsers = (0..<3).map { "\(run)-s\($0)" }
        func provider(_ user: String) -> String { oauthUsers.contains(user) ? "oauth" : "demo" }

        // The oracle: per account, what it may show; what the store held at the last look.
        var allowed: [String: Allowed] = [:]
        var current: [String: SessionRecord] = [:]
        for user in oauthUsers + staticUsers { allowed[user] = Allowed(values: [nil]) }
        var secretAllowed: Set<String?> = [nil]
        /// Refresh tokens of sessions seen logged out: each must reach /revoke.
        var owedRevocations: [String] = []
        var windowHits = 0
        var counts: [Operation: (rounds: Int, acknowledged: Int)] = [:]
        var failures = 0

        // How long each operation takes here, unkilled: the kill delays are drawn from 0 to 1.3 times that.
        var duration: [Operation: Double] = [:]
        let calibration = "\(run)-cal"
        func timed(_ method: VaultMethod, _ parameters: [String: JSON]) throws -> Double {
            let started = Date()
            let reply = try rig.call(method, parameters)
            #expect(reply.error == nil, "\(method.rawValue): \(reply)")
            return Date().timeIntervalSince(started)
        }
        for _ in 0..<2 {
            let account: [String: JSON] = ["provider": "oauth", "user": .string(calibration)]
            let grant = try JSON.parse(try await rig.server.grant())
            let measured: [(Operation, Double)] = [
                (.login, try timed(.login, account.merging(["tokenResponse": grant]) { a, _ in a })),
                (.refresh, try timed(.refresh, account)),
                (.kick, try timed(.forceLogout, account.merging(["reason": "crash-test"]) { a, _ in a })),
                (.providerSecret, try timed(.setProviderSecret, ["provider": "oauth", "secret": "cs-calibration"])),
            ]
            let again = try JSON.parse(try await rig.server.grant())
            _ = try rig.call(.login, account.merging(["tokenResponse": again]) { a, _ in a })
            let logout = try timed(.logout, account)
            for (operation, seconds) in measured + [(.logout, logout)] {
                duration[operation] = max(duration[operation] ?? 0, seconds)
            }
        }
        secretAllowed = ["cs-calibration"]
        print(
            "CrashTests.randomKills: operations unkilled take \(duration.map { "\($0.key.rawValue) \(Int($0.value * 1000)) ms" }.sorted())"
        )

        /// Checks the store and what vaultd serves against the oracle, then takes them as the new truth.
        func check(_ round: Round, _ index: Int) async throws {
            let context =
                "\(engine.rawValue) seed \(seed) round \(index) \(round.operation.rawValue) \(round.user ?? "-") (reply: \(round.reply))"
            let store = try await rig.store()
            let contents = try await store.loadAll()
            #expect(contents.unreadable.isEmpty, "every stored item decodes: \(contents.unreadable) — \(context)")
            var found: [String: SessionRecord] = [:]
            for record in contents.records where allowed[record.account.user] != nil {
                #expect(found[record.account.user] == nil, "one item per session — \(context)")
                #expect(record.phase == .active, "no logout left half done after the start — \(context)")
                found[record.account.user] = record
            }
            for user in oauthUsers + staticUsers {
                let stored = found[user]
                let token = stored?.tokens.accessToken.revealed
                let old = current[user]?.tokens.accessToken.revealed
                if !(allowed[user]!.admits(token, old: old)) { failures += 1 }
                #expect(
                    allowed[user]!.admits(token, old: old),
                    "\(user) holds \(token.map { Secret.mask($0) } ?? "nothing"), expected \(allowed[user]!) — \(context)"
                )
                let served = try rig.call(.getToken, ["provider": .string(provider(user)), "user": .string(user)])
                #expect(
                    served.parameters["token"]?.stringValue == token,
                    "vaultd serves what the store holds for \(user) — \(context)")
                if let before = current[user], stored == nil, let refreshToken = before.tokens.refreshToken?.revealed {
                    owedRevocations.append(String(refreshToken.prefix(6)))
                }
                current[user] = stored
                allowed[user] = Allowed(values: [token])
            }
            let secret = try await store.loadProviderSecret("oauth")?.revealed
            #expect(secretAllowed.contains(secret), "the client secret is the old or the new one — \(context)")
            secretAllowed = [secret]
        }

        for index in 0..<kills {
            // Pick an operation whose precondition holds.
            let present = (oauthUsers + staticUsers).filter { current[$0] != nil }
            let absent = (oauthUsers + staticUsers).filter { current[$0] == nil }
            // Refreshes weigh most: they hold the one window the issue documents.
            let roll = rng.next() % 100
            var operation: Operation =
                roll < 35 ? .refresh : roll < 55 ? .login : roll < 70 ? .logout : roll < 85 ? .kick : .providerSecret
            if operation == .login && absent.isEmpty { operation = .logout }
            if (operation == .logout || operation == .kick) && present.isEmpty { operation = .login }
            let refreshable = oauthUsers.filter { current[$0] != nil }
            if let only { operation = only }
            let oauthAbsent = oauthUsers.filter { current[$0] == nil }
            if operation == .refresh && refreshable.isEmpty { operation = .login }
            if operation == .login && only == .refresh && oauthAbsent.isEmpty { operation = .logout }

            var round = Round(operation: operation)
            var parameters: [String: JSON] = [:]
            let method: VaultMethod
            switch operation {
            case .login:
                // Mostly oauth sessions, which the refresh rounds need.
                let pool = !oauthAbsent.isEmpty && (only == .refresh || rng.next() % 4 != 0) ? oauthAbsent : absent
                let user = pool[Int(rng.next() % UInt64(pool.count))]
                round.user = user
                if provider(user) == "oauth" {
                    let grant = try JSON.parse(try await rig.server.grant())
                    parameters = ["provider": "oauth", "user": .string(user), "tokenResponse": grant]
                    allowed[user]!.values.insert(grant["access_token"]?.stringValue)
                } else {
                    let token = "tok-\(String(rng.next(), radix: 36))-crash"
                    parameters = ["provider": "demo", "user": .string(user), "token": .string(token)]
                    allowed[user]!.values.insert(token)
                }
                method = .login
            case .refresh:
                let user = refreshable[Int(rng.next() % UInt64(refreshable.count))]
                round.user = user
                round.refreshTokenBefore = current[user]?.tokens.refreshToken?.revealed
                round.refreshRequestsBefore = try await rig.counter("refresh_requests")
                parameters = ["provider": "oauth", "user": .string(user)]
                allowed[user]!.values.insert(Allowed.anyNew)
                method = .refresh
            case .logout, .kick:
                let user = present[Int(rng.next() % UInt64(present.count))]
                round.user = user
                parameters = ["provider": .string(provider(user)), "user": .string(user)]
                if operation == .kick { parameters["reason"] = "crash-test" }
                allowed[user]!.values.insert(nil)
                method = operation == .kick ? .forceLogout : .logout
            case .providerSecret:
                let secret = "cs-\(String(rng.next(), radix: 36))"
                parameters = ["provider": "oauth", "secret": .string(secret)]
                secretAllowed.insert(secret)
                method = .setProviderSecret
            }

            // Send, wait a random delay inside the operation's usual duration, kill.
            let client = try VarlinkClient(path: rig.socket, timeoutSeconds: 10)
            let delay = Double(rng.next() % 10_000) / 10_000 * 1.3 * (duration[operation] ?? 0.05)
            try client.send(VarlinkCall(method: method.rawValue, parameters: parameters))
            // The kill's timing is the fault injected, not a wait for anything.
            usleep(UInt32(delay * 1_000_000))
            rig.kill()
            let reply = try? client.nextReply()
            round.acknowledged = reply != nil && reply?.error == nil
            round.reply = reply.map { $0.error ?? "ok" } ?? "none"
            counts[operation, default: (0, 0)].rounds += 1
            if round.acknowledged { counts[operation, default: (0, 0)].acknowledged += 1 }
            if round.acknowledged {
                // Acknowledged: only the new state may be found.
                if let user = round.user {
                    switch operation {
                    case .login:
                        allowed[user]!.values.remove(nil)
                    case .refresh:
                        allowed[user]!.values = [Allowed.anyNew]
                    case .logout, .kick:
                        allowed[user]!.values = [nil]
                    case .providerSecret: break
                    }
                } else if case .string(let secret)? = parameters["secret"] {
                    secretAllowed = [secret]
                }
            }

            try rig.restart()
            let refreshTokenBefore = round.refreshTokenBefore
            try await check(round, index)

            if operation == .refresh, let user = round.user {
                let requests = try await rig.counter("refresh_requests") - round.refreshRequestsBefore
                #expect(
                    (0...1).contains(requests), "one refresh request at most per refresh — seed \(seed) round \(index)")
                let now = current[user]?.tokens.refreshToken?.revealed
                if now != nil && now == refreshTokenBefore && requests == 1 {
                    // The documented window: the server rotated, the kill came before the write.
                    // The restarted vaultd holds the rotated-away token: one invalid_grant, one
                    // tokenInvalid, no retry.
                    windowHits += 1
                    let watcher = try rig.subscribe("oauth", user)
                    let before = try await rig.counter("refresh_requests")
                    let again = try rig.call(.refresh, ["provider": "oauth", "user": .string(user)])
                    #expect(
                        again.error == "io.vaultd.Vault.GrantRevoked", "\(again) — seed \(seed) round \(index)")
                    let kinds = rig.kinds(until: "tokenInvalid", on: watcher)
                    #expect(kinds.filter { $0 == "tokenInvalid" }.count == 1, "\(kinds) — seed \(seed) round \(index)")
                    let token = try rig.call(.getToken, ["provider": "oauth", "user": .string(user)])
                    #expect(token.error == "io.vaultd.Vault.NotLoggedIn")
                    #expect(try await rig.counter("refresh_requests") - before == 1, "one request, no retry")
                    if let refreshToken = now { owedRevocations.append(String(refreshToken.prefix(6))) }
                    current[user] = nil
                    allowed[user] = Allowed(values: [nil])
                } else if now != refreshTokenBefore {
                    #expect(requests == 1, "new tokens come from the server — seed \(seed) round \(index)")
                }
            }
            // No refresh token the server rotated away was sent again, but in the window.
            let reused = try await rig.counter("reused_refresh_tokens")
            #expect(reused == Int64(windowHits), "reuse only in the documented window — seed \(seed) round \(index)")
            if failures > 3 { break }
        }

        // Every revocation reaches the provider, and the queue empties.
        let revocations = try await eventually(
            tries: 150, interval: .milliseconds(100), { try await rig.server.revocations() },
            until: { list in
                owedRevocations.allSatisfy { owed in list.contains { $0["token"]?.stringValue == owed } }
            })
        let missing = owedRevocations.filter { owed in !revocations.contains { $0["token"]?.stringValue == owed } }
        #expect(
            missing.isEmpty,
            "every revocation reaches the provider: \(missing.count) of \(owedRevocations.count) missing")
        let pending = try await eventually(
            tries: 100, interval: .milliseconds(100), { try await rig.store().loadPendingRevocations() },
            until: { $0.isEmpty })
        #expect(pending.isEmpty, "the revocation queue empties: \(pending.count) left")

        let restarts = rig.restartSeconds.sorted()
        let stats = try await rig.server.stats()
        print(
            "CrashTests.randomKills: \(engine.rawValue) seed \(seed): \(kills) kills; "
                + Operation.allCases.map {
                    "\($0.rawValue) \(counts[$0]?.rounds ?? 0) (\(counts[$0]?.acknowledged ?? 0) acknowledged)"
                }
                .joined(separator: ", ")
                + "; refresh requests \(stats["refresh_requests"]?.integerValue ?? -1), reused refresh tokens \(stats["reused_refresh_tokens"]?.integerValue ?? -1) (window hits \(windowHits)); revocations owed \(owedRevocations.count), received \(stats["revocations"]?.arrayValue?.count ?? 0); restart median \(Int(restarts[restarts.count / 2] * 1000)) ms"
        )
        for user in oauthUsers + staticUsers where current[user] != nil {
            _ = try rig.call(.logout, ["provider": .string(provider(user)), "user": .string(user)])
        }
    }
}

/// The crash window of refresh-token rotation, landed on purpose, and the
/// spread of the refreshes a restart finds overdue: real vaultd, real token
/// server, on each engine (the private keyring, or SQLite) in every run.
@Suite(
    "Crash consistency: the rotation window and overdue refreshes", .requiresKeyring, .bothEnginesInOrdinaryRun,
    .ownThreads, .timeLimit(.minutes(5)))
struct CrashWindowTests {
    /// A token response from `server` that vaultd finds overdue for its refresh
    /// once it is restarted: issued 280 s ago, living 300 s.
    func overdueGrant(_ server: TokenServer) async throws -> JSON {
        guard case .object(var members) = try JSON.parse(try await server.grant()) else {
            throw HarnessError("the token server answered no object")
        }
        members["expires_in"] = 300
        members["issued_at"] = .string(String((Int64(Date().timeIntervalSince1970) - 280) * 1000))
        return .object(members)
    }

    @Test(
        "Should end a session killed after the server rotated and before the write in one invalid_grant and one tokenInvalid, with no retry",
        arguments: TestStore.localEngines)
    func rotationWindowOutcome(engine: StoreEngine) async throws {
        // vaultd waits for the held answer as long as the test may take (its
        // default 30 s, or a 20 s hold, let a starved test process see the
        // answer arrive, and be stored, before its kill).
        let rig = try CrashRig(engine: engine, oauthTimeout: "10min")
        let user = uniqueName("window")
        let grant = try await overdueGrant(rig.server)
        // The server rotates, then holds its answer until the test is over:
        // vaultd is killed inside the window. Set before the login: the session
        // is close to expiry, so vaultd may refresh it by itself before the
        // Refresh below, and that first refresh must be the held one.
        try await rig.server.post("/control/mode", json: ["mode": "slow", "count": 1, "hang_seconds": 600])
        let login = try rig.call(.login, ["provider": "oauth", "user": .string(user), "tokenResponse": grant])
        try #require(login.error == nil, "\(login)")
        let rotatedAway = try #require(grant["refresh_token"]?.stringValue)

        let client = try VarlinkClient(path: rig.socket, timeoutSeconds: 30)
        try client.send(
            VarlinkCall(method: VaultMethod.refresh.rawValue, parameters: ["provider": "oauth", "user": .string(user)]))
        let rotated = try await eventually({ try await rig.counter("refresh_requests") }, until: { $0 == 1 })
        try #require(rotated == 1, "the server took the refresh")
        rig.kill()
        try await rig.server.post("/control/mode", json: ["mode": "normal"])
        let stored = try await rig.store().loadAll().records.first { $0.account.user == user }
        #expect(stored?.tokens.refreshToken?.revealed == rotatedAway, "the store holds the rotated-away token")

        // The restarted vaultd finds the session overdue and refreshes it by
        // itself, at a point of the restart's spread (~9 s) that the account
        // decides: as early as 0.1 s after the start, before a subscriber is
        // in (a fresh-clone run saw no event at all). The server holds its
        // invalid_grant until the watcher subscribed.
        try await rig.server.post("/control/mode", json: ["mode": "held", "count": 1, "hang_seconds": 600])
        try rig.restart()
        let watcher = try rig.subscribe("oauth", user, timeoutSeconds: 60)
        let asked = try await eventually(tries: 1_000, { try await rig.counter("held_answers") }, until: { $0 == 1 })
        try #require(asked == 1, "the restarted vaultd refreshed the overdue session")
        try await rig.server.post("/control/release", json: [:])
        let kinds = rig.kinds(until: "tokenInvalid", on: watcher)
        #expect(kinds.filter { $0 == "tokenInvalid" }.count == 1, "one tokenInvalid: \(kinds)")
        // Clients keep asking: nothing more goes to the server.
        for _ in 0..<20 {
            let reply = try rig.call(
                .getToken, ["provider": "oauth", "user": .string(user), "minValidSeconds": 100_000])
            #expect(reply.error == "io.vaultd.Vault.NotLoggedIn", "\(reply)")
            let refresh = try rig.call(.refresh, ["provider": "oauth", "user": .string(user)])
            #expect(refresh.error == "io.vaultd.Vault.NotLoggedIn", "\(refresh)")
        }
        let stats = try await rig.server.stats()
        #expect(stats["refresh_requests"]?.integerValue == 2, "the killed refresh and one more, no retry: \(stats)")
        #expect(stats["reused_refresh_tokens"]?.integerValue == 1, "the old token was sent once: \(stats)")
        // The view says `logout` while the logout's writes are out, then the session is gone.
        let status = try await eventually(
            { try vaultctl(rig.socket, ["status", "oauth", user]) }, until: { $0.status != 0 })
        #expect(status.status == 1 && status.stderr.contains("ERR_NOT_LOGGED_IN"), "\(status)")
        // Its end is a logout like any: the token is revoked at the provider, nothing stays stored.
        let prefix = String(rotatedAway.prefix(6))
        let revoked = try await eventually(
            tries: 100, interval: .milliseconds(100), { try await rig.server.revocations() },
            until: { $0.contains { $0["token"]?.stringValue == prefix } })
        #expect(revoked.contains { $0["token"]?.stringValue == prefix })
        #expect(try await rig.store().loadAll().records.contains { $0.account.user == user } == false)
        let log = rig.daemon.allOutput
        #expect(log.components(separatedBy: "refresh refused; the session is logged out").count - 1 == 1, "\(log)")
    }

    /// The `storedAfterMs` of every "token refreshed" line in vaultd's output, in order.
    func storedAfter(_ output: String) -> [Int] {
        output.split(separator: "\n").filter { $0.contains("token refreshed") }.compactMap { line -> Int? in
            guard let range = line.range(of: "storedAfterMs=") else { return nil }
            return Int(line[range.upperBound...].prefix { $0.isNumber })
        }
    }

    @Test(
        "Should write rotated tokens promptly while other writes crowd the store: the window's figures",
        arguments: TestStore.localEngines)
    func rotationWindowUnderStoreLoad(engine: StoreEngine) async throws {
        let rig = try CrashRig(engine: engine)
        let run = uniqueName("load")
        let sessions = (0..<20).map { "\(run)-o\($0)" }
        let setup = try VarlinkClient(path: rig.socket, timeoutSeconds: 30)
        for user in sessions {
            let grant = try JSON.parse(try await rig.server.grant())
            let reply = try setup.call(
                VaultMethod.login.rawValue, ["provider": "oauth", "user": .string(user), "tokenResponse": grant])
            try #require(reply.error == nil, "\(reply)")
        }
        // One refresh at a time, nothing else going on: the window's floor.
        for user in sessions {
            _ = try setup.call(VaultMethod.refresh.rawValue, ["provider": "oauth", "user": .string(user)])
        }
        // vaultd's output is read on its own thread: wait (bounded) for the last lines.
        let alone = try await eventually(
            { storedAfter(rig.daemon.allOutput) }, until: { $0.count >= sessions.count }
        ).sorted()
        #expect(alone.count == sessions.count)
        if !alone.isEmpty {
            print(
                "CrashWindowTests: \(alone.count) rotations one at a time: new tokens in memory only for p50 \(alone[alone.count / 2]) ms, max \(alone.last!) ms"
            )
        }
        // Four clients log static sessions in and out while the refreshes run: writes queue at the store.
        let socket = rig.socket
        let churning = Mutex(true)
        let churn = Thread {
            DispatchQueue.concurrentPerform(iterations: 4) { lane in
                guard let client = try? VarlinkClient(path: socket, timeoutSeconds: 30) else { return }
                for index in 0..<2000 {
                    if !churning.withLock({ $0 }) { return }
                    let account: [String: JSON] = ["provider": "demo", "user": .string("\(run)-s\(lane)-\(index % 5)")]
                    _ = try? client.call(
                        VaultMethod.login.rawValue, account.merging(["token": "tok-churn-abcdefgh"]) { a, _ in a })
                    _ = try? client.call(VaultMethod.logout.rawValue, account)
                }
            }
        }
        churn.start()
        defer { churning.withLock { $0 = false } }
        let rounds = Soak.size(short: 3, long: 20)
        for _ in 0..<rounds {
            DispatchQueue.concurrentPerform(iterations: sessions.count) { index in
                _ = try? VarlinkClient(path: socket, timeoutSeconds: 30).call(
                    VaultMethod.refresh.rawValue, ["provider": "oauth", "user": .string(sessions[index])])
            }
        }
        churning.withLock { $0 = false }
        let all = try await eventually(
            { storedAfter(rig.daemon.allOutput) }, until: { $0.count >= (rounds + 1) * sessions.count })
        let windows = Array(all.dropFirst(alone.count)).sorted()
        #expect(windows.count == rounds * sessions.count, "every refresh was written")
        #expect(try await rig.counter("reused_refresh_tokens") == 0)
        guard !windows.isEmpty else { return }
        print(
            "CrashWindowTests: \(windows.count) rotations under store load: new tokens in memory only for p50 \(windows[windows.count / 2]) ms, p90 \(windows[windows.count * 9 / 10]) ms, max \(windows.last!) ms"
        )
        for user in sessions {
            _ = try setup.call(VaultMethod.logout.rawValue, ["provider": "oauth", "user": .string(user)])
        }
    }

    @Test(
        "Should spread the refreshes of 60 sessions overdue at a restart over seconds, not all at once",
        arguments: TestStore.localEngines)
    func overdueRefreshesSpreadAfterRestart(engine: StoreEngine) async throws {
        let rig = try CrashRig(engine: engine)
        let run = uniqueName("due")
        let users = (0..<60).map { "\(run)-\($0)" }
        let client = try VarlinkClient(path: rig.socket, timeoutSeconds: 30)
        for user in users {
            let grant = try await overdueGrant(rig.server)
            let reply = try client.call(
                VaultMethod.login.rawValue, ["provider": "oauth", "user": .string(user), "tokenResponse": grant])
            try #require(reply.error == nil, "\(reply)")
        }
        // Sessions logged in early may have had their (due) refresh before the kill,
        // when the logins took seconds: those are not overdue at the restart.
        let refreshedBefore = try await rig.counter("refresh_requests")
        let overdue = 60 - refreshedBefore
        rig.kill()
        try await rig.server.post("/control/reset")
        try rig.restart()
        let started = Date()
        // The server's count of refreshes, sampled until all 60 came (bounded: 120 s
        // and 4,000 samples; under load the keyring writes alone took past 30 s).
        var samples: [(seconds: Double, count: Int64)] = []
        for _ in 0..<4000 where Date().timeIntervalSince(started) < 120 {
            let count = try await rig.counter("refresh_requests")
            samples.append((Date().timeIntervalSince(started), count))
            if count >= overdue { break }
            try await Task.sleep(for: .milliseconds(50))
        }
        let counts = samples.map(\.count)
        #expect((counts.last ?? 0) >= overdue, "every overdue session refreshed (\(overdue)): \(counts)")
        // The most refreshes the server saw between two samples at most half a second apart
        // (samples that a loaded machine spaced further apart bound nothing).
        var densest: Int64 = 0
        for (index, sample) in samples.enumerated() {
            for later in samples[index...] where later.seconds - sample.seconds <= 0.5 {
                densest = max(densest, later.count - sample.count)
            }
        }
        let first = samples.first { $0.count > 0 }?.seconds ?? 0
        let last = samples.first { $0.count >= overdue }?.seconds ?? 0
        print(
            "CrashWindowTests: \(overdue) overdue refreshes from \(first) s to \(last) s after ready; at most \(densest) in 0.5 s"
        )
        #expect(densest <= 30, "no half second takes most of them: \(densest) of 60")
        // The spread is measured only when the sampling caught its start: a starved
        // test process whose first look after the start already saw half of them
        // (seen in a CI run: 60 "from 8.1 s to 8.7 s", no two samples within 0.5 s)
        // knows nothing of when they began.
        let caughtStart = (samples.first { $0.count > 0 }?.count ?? 0) < Int64(overdue) / 2
        if caughtStart { #expect(last - first >= 2, "spread over seconds: \(first) s to \(last) s") }
        #expect(try await rig.counter("reused_refresh_tokens") == 0)
        // The 60 sessions stay in this test's own store scope of the private keyring: logging
        // them out would cost seconds of keyring writes and test nothing more.
    }
}

/// SplitMix64: a seed names one run exactly.
struct SplitMix: RandomNumberGenerator {
    var state: UInt64
    init(_ seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
