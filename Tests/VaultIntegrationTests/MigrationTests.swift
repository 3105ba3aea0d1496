import Foundation
import Glibc
import Testing
import VaultCore

/// One instance whose sessions move between the two store engines with
/// `vaultd --migrate-store`: a config with a static provider and an oauth2
/// provider at a real token server (revocation and client credentials), its
/// own database file and store scope in the suite's private keyring.
final class MigrationFixture {
    let directory: TemporaryDirectory
    let socketPath: String
    let configPath: String
    let databasePath: String
    let server: TokenServer
    /// The static sessions' tokens, by user.
    var tokens: [String: String] = [:]

    /// What a populated instance holds: the static sessions, one queued
    /// revocation, one client secret.
    var expected: StoreCounts { StoreCounts(sessions: tokens.count, revocations: 1, secrets: 1) }

    init() throws {
        server = try TokenServer(["--lifetime", "600", "--client-secret", "s3cr3t-client"])
        directory = try TemporaryDirectory()
        socketPath = directory.path("vaultd.sock")
        configPath = directory.path("vaultd.conf")
        databasePath = directory.path("state/sessions.db")
        try ("[Provider demo]\nType=static\n\n" + server.providerSection(revocation: true))
            .write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    var scope: String { RunningDaemon.scope(for: socketPath) }

    /// The environment every vaultd of this instance runs with.
    func environment(_ engine: String? = nil) -> [String: String] {
        var env = ["VAULTD_DATABASE": databasePath, "VAULTD_STORE_SCOPE": scope]
        if let engine { env["VAULTD_STORE"] = engine }
        return env
    }

    /// Starts vaultd on `engine`.
    func start(_ engine: String) throws -> RunningDaemon {
        try RunningDaemon(socketPath: socketPath, configPath: configPath, environment: environment(engine))
    }

    /// The command line of a migration.
    /// The command line of a migration of the instance on `socket` (default: this fixture's).
    func migrationArguments(_ from: String, _ to: String, socket: String? = nil) -> [String] {
        ["--config", configPath, "--socket", socket ?? socketPath, "--migrate-store", from, to]
    }

    /// Runs `vaultd --migrate-store from to` to its end (or to the step `killAt`).
    func migrate(_ from: String, _ to: String, killAt: String? = nil, socket: String? = nil) throws -> CommandResult {
        var env = environment()
        if let killAt { env["VAULTD_TEST_KILL_AT"] = killAt }
        return try runCommand(Binaries.vaultd, migrationArguments(from, to, socket: socket), environment: env)
    }

    /// Logs in three static sessions, stores the oauth client secret, and
    /// queues one revocation (an oauth session logged out while the
    /// revocation endpoint fails), through a real vaultd on `engine`.
    func populate(on engine: String) async throws {
        let daemon = try start(engine)
        for index in 0..<3 {
            let user = uniqueName("mig\(index)")
            let token = "tok-\(user)-\(UUID().uuidString)"
            let login = try vaultctl(socketPath, ["login", "demo", user], input: token)
            try #require(login.status == 0, "\(login.stderr)")
            tokens[user] = token
        }
        let secret = try vaultctl(socketPath, ["provider-secret", "oauth"], input: "s3cr3t-client\n")
        try #require(secret.status == 0, "\(secret.stderr)")
        try await server.post("/control/mode", json: ["mode": "error500", "target": "revoke"])
        let revoked = uniqueName("migrev")
        let grant = try await server.post(
            "/token", form: "grant_type=client_credentials&client_id=vaultd-test&client_secret=s3cr3t-client")
        let login = try vaultctl(socketPath, ["login", "oauth", revoked], input: grant.text)
        try #require(login.status == 0, "\(login.stderr)")
        try #require(try vaultctl(socketPath, ["logout", "oauth", revoked]).status == 0)
        let counts = try await eventually({ try self.counts(engine) }, until: { $0 == self.expected })
        try #require(counts == expected, "the store holds what was put in it: \(counts)")
        daemon.stop()
    }

    /// What the store of `engine` holds (nil: the database does not exist).
    func counts(_ engine: String) throws -> StoreCounts? {
        engine == "sqlite" ? try databaseCounts() : try keyringCounts()
    }

    /// The items of this scope in the keyring, by schema (secret-tool; no secret is printed here).
    func keyringCounts() throws -> StoreCounts {
        let search = try runCommand(URL(fileURLWithPath: "/usr/bin/secret-tool"), ["search", "--all", "scope", scope])
        let lines = (search.stdout + search.stderr).split(separator: "\n")
        func count(_ schema: String) -> Int { lines.filter { $0 == "schema = \(schema)" }.count }
        return StoreCounts(
            sessions: count("io.vaultd.Session"), revocations: count("io.vaultd.PendingRevocation"),
            secrets: count("io.vaultd.ProviderSecret"))
    }

    /// The number of data key items of this scope in the keyring.
    func dataKeyIDs() throws -> [String] {
        let search = try runCommand(
            URL(fileURLWithPath: "/usr/bin/secret-tool"),
            ["search", "--all", "xdg:schema", "io.vaultd.DataKey", "scope", scope])
        return (search.stdout + search.stderr).split(separator: "\n").filter { $0.hasPrefix("attribute.key_id = ") }
            .map { String($0.dropFirst("attribute.key_id = ".count)) }.sorted()
    }

    /// The rows of the database (read-only; nil when the file does not exist).
    func databaseCounts() throws -> StoreCounts? {
        guard FileManager.default.fileExists(atPath: databasePath) else { return nil }
        let output = try sqlite(
            "SELECT (SELECT count(*) FROM sessions), (SELECT count(*) FROM revocations), (SELECT count(*) FROM provider_secrets);"
        )
        let rows = output.split(separator: "|").compactMap { Int($0.trimmingCharacters(in: .whitespacesAndNewlines)) }
        guard rows.count == 3 else {
            throw VaultError(.storeFailed, "sqlite3 could not count the rows of \(databasePath): \(output)")
        }
        return StoreCounts(sessions: rows[0], revocations: rows[1], secrets: rows[2])
    }

    /// One query through the sqlite3 command, on a copy of the database and
    /// its WAL (not its shared-memory index): what the next vaultd to open it
    /// reads. A read-only open of the file itself cannot rebuild the index a
    /// killed writer left half-updated, and would fail where vaultd does not.
    func sqlite(_ query: String) throws -> String {
        let copy = FileManager.default.temporaryDirectory.appendingPathComponent("vaultd-migration-\(UUID())")
        try FileManager.default.createDirectory(at: copy, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(at: copy) }
        let copied = copy.appendingPathComponent("sessions.db").path
        try FileManager.default.copyItem(atPath: databasePath, toPath: copied)
        if FileManager.default.fileExists(atPath: databasePath + "-wal") {
            try FileManager.default.copyItem(atPath: databasePath + "-wal", toPath: copied + "-wal")
        }
        let result = try runCommand(URL(fileURLWithPath: "/usr/bin/sqlite3"), [copied, query])
        return result.stdout + result.stderr
    }

    /// What `engine` holds, for messages.
    func state(_ engine: String) -> String {
        do {
            guard let counts = try counts(engine) else { return "\(engine): no database" }
            return "\(engine): \(counts)"
        } catch {
            return "\(engine): unreadable (\(error))"
        }
    }

    /// The store `engine` holds exactly what was populated.
    func isWhole(_ engine: String) throws -> Bool { try counts(engine) == expected }

    /// The store `engine` holds nothing: no item in the scope, or no database.
    func isEmpty(_ engine: String) throws -> Bool {
        engine == "sqlite" ? try databaseCounts() == nil : try keyringCounts() == StoreCounts()
    }

    /// Starts vaultd on `engine` and checks what it serves: every static
    /// token as it was logged in, the queued revocation delivered once the
    /// endpoint works, and the client secret (a client-credentials login).
    func verifyServed(on engine: String) async throws {
        try await server.post("/control/mode", json: ["mode": "normal"])
        let daemon = try start(engine)
        for (user, token) in tokens {
            let served = try vaultctl(socketPath, ["token", "demo", user])
            #expect(
                served.status == 0 && served.stdout.trimmingCharacters(in: .newlines) == token,
                "\(user) on \(engine): \(served.stderr)")
        }
        let revoked = try await eventually({ try await self.server.revocations() }, until: { !$0.isEmpty })
        #expect(!revoked.isEmpty, "the queued revocation came along and was delivered")
        let user = uniqueName("migcc")
        let login = try vaultctl(socketPath, ["login", "oauth", user, "--from-provider"])
        #expect(login.status == 0, "the client secret came along: \(login.stderr)")
        #expect(!daemon.allOutput.contains("s3cr3t-client"))
        daemon.stop()
    }
}

/// Items of one instance, by kind.
struct StoreCounts: Equatable, CustomStringConvertible {
    var sessions = 0
    var revocations = 0
    var secrets = 0

    var description: String { "\(sessions) sessions, \(revocations) revocations, \(secrets) secrets" }
}

/// The other engine.
func otherEngine(_ engine: String) -> String { engine == "sqlite" ? "secret-service" : "sqlite" }

/// True when `status` says the process was killed by SIGKILL.
func killed(_ status: Int32) -> Bool { status == SIGKILL || status == 128 + SIGKILL }

/// `vaultd --migrate-store` between the Secret Service and SQLite engines:
/// real vaultd processes, the suite's private gnome-keyring, a real token
/// server; crashes are real SIGKILLs, at every named step and at random moments.
@Suite("Store migration", .requiresKeyring, .bothEnginesInOrdinaryRun, .ownThreads, .timeLimit(.minutes(5)))
struct MigrationTests {
    /// The steps of each direction at which `VAULTD_TEST_KILL_AT` kills the migration.
    static let steps = [
        "sqlite": [
            "source-read", "target-written", "target-synced", "renamed", "directory-synced", "source-partly-deleted",
            "source-deleted",
        ],
        "secret-service": [
            "source-read", "target-partly-written", "target-written", "target-verified", "renamed",
            "directory-synced", "keys-deleted",
        ],
    ]

    @Test("Should move sessions, queued revocations and client secrets to SQLite and back, serving the same tokens")
    func bothWays() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "secret-service")
        let there = try expectSuccess(fixture.migrate("secret-service", "sqlite"))
        #expect(there.stdout.contains("migrated 3 sessions, 1 queued revocations, 1 client secrets"), "\(there.stdout)")
        #expect(try fixture.isWhole("sqlite"), "\(fixture.state("sqlite"))")
        #expect(try fixture.isEmpty("secret-service"), "\(fixture.state("secret-service"))")
        #expect(try fixture.sqlite("SELECT count(*) FROM meta WHERE name = 'migration_pending';").hasPrefix("0"))

        let again = try fixture.migrate("secret-service", "sqlite")
        #expect(
            again.status == 0 && again.stdout.contains("nothing to migrate"),
            "a finished migration run again: \(again.stderr)")

        try expectSuccess(fixture.migrate("sqlite", "secret-service"))
        let backAgain = try fixture.migrate("sqlite", "secret-service")
        #expect(backAgain.status == 0 && backAgain.stdout.contains("nothing to migrate"), "\(backAgain.stderr)")
        #expect(try fixture.isWhole("secret-service"), "\(fixture.state("secret-service"))")
        #expect(try fixture.isEmpty("sqlite"), "the database is gone")
        #expect(try fixture.dataKeyIDs().isEmpty, "the database's key went with it")
        #expect(!FileManager.default.fileExists(atPath: fixture.databasePath + ".removing"))
        try await fixture.verifyServed(on: "secret-service")
    }

    @Test("Should serve from SQLite after a migration what vaultd served from the Secret Service")
    func servedAfterMigration() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "secret-service")
        #expect(try fixture.migrate("secret-service", "sqlite").status == 0)
        try await fixture.verifyServed(on: "sqlite")
    }

    @Test("Should migrate from SQLite to the Secret Service what a vaultd on SQLite stored")
    func fromSQLite() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "sqlite")
        try expectSuccess(fixture.migrate("sqlite", "secret-service"))
        try await fixture.verifyServed(on: "secret-service")
    }

    @Test("Should leave the old store or the new one whole when killed at any step, and finish when run again")
    func killedAtEveryStep() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "secret-service")
        var from = "secret-service"
        for index in 0..<Self.steps["sqlite"]!.count {
            // One step of each direction per round: there, then back.
            for _ in 0..<2 {
                let to = otherEngine(from)
                let step = Self.steps[to]![index]
                let run = try fixture.migrate(from, to, killAt: step)
                #expect(killed(run.status), "killed at \(step) (\(from) → \(to)): \(run.status) \(run.stderr)")
                let whole = try (fixture.isWhole(from), fixture.isWhole(to))
                #expect(
                    whole.0 || whole.1,
                    "killed at \(step) (\(from) → \(to)): \(fixture.state(from)), \(fixture.state(to))"
                )
                let rerun = try fixture.migrate(from, to)
                #expect(rerun.status == 0, "the rerun after \(step) (\(from) → \(to)) finishes: \(rerun.stderr)")
                #expect(try fixture.isWhole(to), "after \(step): \(fixture.state(to))")
                #expect(try fixture.isEmpty(from), "after \(step): \(fixture.state(from))")
                from = to
            }
        }
        #expect(try fixture.dataKeyIDs().isEmpty)
        try await fixture.verifyServed(on: from)
    }

    @Test("Should leave the old store or the new one whole when killed at a random moment, and finish when run again")
    func killedAtRandomMoments() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "secret-service")
        // How long a whole migration takes here bounds the random delays.
        var durations: [String: Double] = [:]
        var from = "secret-service"
        for _ in 0..<2 {
            let to = otherEngine(from)
            let started = Date()
            #expect(try fixture.migrate(from, to).status == 0)
            durations[to] = Date().timeIntervalSince(started)
            from = to
        }
        var generator = SystemRandomNumberGenerator()
        var outcomes: [String] = []
        var killedCount = 0
        // A migration that ended before its kill halves the next delay's
        // bound: the first, timed migrations start cold and can take longer
        // than the later ones (six kills drawn up to 0.51 s all came after
        // migrations that had already finished, in CI).
        var bounds = durations
        for _ in 0..<Soak.size(short: 6, long: 40) {
            let to = otherEngine(from)
            let process = Process()
            process.executableURL = Binaries.vaultd
            process.arguments = fixture.migrationArguments(from, to)
            process.environment = ProcessInfo.processInfo.environment.merging(
                fixture.environment(), uniquingKeysWith: { _, new in new })
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            let delay = Double.random(in: 0...(bounds[to] ?? 0.5), using: &generator)
            try process.run()
            // The delay is the point of the test (a kill at an arbitrary moment), not a
            // synchronisation. usleep, not Task.sleep: under parallel suites a task's
            // wake-up waits for a free pool thread, long past a whole migration.
            usleep(UInt32(delay * 1_000_000))
            kill(process.processIdentifier, SIGKILL)
            let status = try reap(process)
            outcomes.append(String(format: "%.3fs:%d", delay, status))
            if killed(status) { killedCount += 1 } else { bounds[to] = (bounds[to] ?? 0.5) / 2 }
            let whole = try (fixture.isWhole(from), fixture.isWhole(to))
            #expect(
                whole.0 || whole.1,
                "killed after \(delay)s (\(from) → \(to)): \(fixture.state(from)), \(fixture.state(to))")
            let rerun = try fixture.migrate(from, to)
            #expect(rerun.status == 0, "the rerun after a kill at \(delay)s finishes: \(rerun.stderr)")
            #expect(try fixture.isWhole(to) && fixture.isEmpty(from), "after a kill at \(delay)s (\(from) → \(to))")
            from = to
        }
        print("migration kills (delay:status): \(outcomes.joined(separator: " "))")
        #expect(killedCount > 0, "at least one migration was killed on its way: \(outcomes)")
        try await fixture.verifyServed(on: from)
    }

    @Test("Should refuse a target that already holds sessions, in either direction, and change nothing")
    func refusesNonEmptyTarget() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "secret-service")
        // A session of its own in the database.
        let daemon = try fixture.start("sqlite")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", uniqueName("other")], input: "other").status == 0)
        daemon.stop()
        let before = try (fixture.keyringCounts(), fixture.databaseCounts())

        try expectFailure(fixture.migrate("secret-service", "sqlite"), saying: "already holds 1 sessions")
        try expectFailure(fixture.migrate("sqlite", "secret-service"), saying: "already holds 3 sessions")
        let after = try (fixture.keyringCounts(), fixture.databaseCounts())
        #expect(before == after, "nothing changed: \(before) → \(after)")
    }

    @Test("Should refuse to migrate while vaultd serves the database, and refuse a second vaultd on it")
    func refusesWhileServing() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "sqlite")
        let daemon = try fixture.start("sqlite")
        let run = try fixture.migrate("sqlite", "secret-service")
        #expect(
            run.status == 1 && run.stderr.contains("pid \(daemon.process.processIdentifier)) serves"), "\(run.stderr)")
        // Named by another socket, the instance is still found by its database's lock.
        let elsewhere = fixture.directory.path("elsewhere.sock")
        try expectFailure(fixture.migrate("sqlite", "secret-service", socket: elsewhere), saying: "is in use")
        try expectFailure(fixture.migrate("secret-service", "sqlite", socket: elsewhere), saying: "is in use")
        #expect(try fixture.isWhole("sqlite") && fixture.isEmpty("secret-service"))

        let second = try RunningDaemon(
            socketPath: fixture.directory.path("second.sock"), configPath: fixture.configPath,
            environment: fixture.environment("sqlite"), waitForReady: false)
        let status = second.waitForExit()
        #expect(status == 1, "a second vaultd on one database does not start")
        #expect(second.output.text.contains("is in use"), "\(second.output.text)")
        daemon.stop()
    }

    @Test("Should refuse to migrate while a vaultd on the Secret Service engine serves the instance's socket")
    func refusesBesideSecretServiceDaemon() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "secret-service")
        let daemon = try fixture.start("secret-service")
        let run = try fixture.migrate("secret-service", "sqlite")
        #expect(
            run.status == 1 && run.stderr.contains("pid \(daemon.process.processIdentifier)) serves"), "\(run.stderr)")
        #expect(try fixture.isWhole("secret-service") && fixture.isEmpty("sqlite"), "nothing moved")
        daemon.stop()
        let after = try fixture.migrate("secret-service", "sqlite")
        #expect(after.status == 0, "once it stopped, the migration runs: \(after.stderr)")
    }
}
