import Foundation
import Glibc
import Testing
import VaultCore

/// `vaultd --rotate-key` on the SQLite store: real vaultd processes, the data
/// key in the suite's private gnome-keyring or in a credential directory,
/// the database read with the sqlite3 command.
@Suite("Data key rotation", .requiresKeyring, .bothEnginesInOrdinaryRun, .ownThreads, .timeLimit(.minutes(5)))
struct RotationTests {
    /// The key id the database names, and the distinct key ids on its rows.
    func keyIDs(_ fixture: MigrationFixture) throws -> (meta: String, rows: [String]) {
        let meta = try fixture.sqlite("SELECT value FROM meta WHERE name = 'key_id';")
            .trimmingCharacters(in: .whitespacesAndNewlines)
        let rows = try fixture.sqlite(
            "SELECT key_id FROM sessions UNION SELECT key_id FROM revocations UNION SELECT key_id FROM provider_secrets;"
        ).split(separator: "\n").map(String.init).sorted()
        return (meta, rows)
    }

    func rotate(_ fixture: MigrationFixture, environment: [String: String] = [:], killAt: String? = nil) throws
        -> CommandResult
    {
        var env = fixture.environment("sqlite").merging(environment, uniquingKeysWith: { _, new in new })
        if let killAt { env["VAULTD_TEST_KILL_AT"] = killAt }
        return try runCommand(Binaries.vaultd, ["--config", fixture.configPath, "--rotate-key"], environment: env)
    }

    /// Starts vaultd on the database and checks every static token.
    func expectServed(_ fixture: MigrationFixture, environment: [String: String] = [:]) throws {
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath,
            environment: fixture.environment("sqlite").merging(environment, uniquingKeysWith: { _, new in new }))
        for (user, token) in fixture.tokens {
            let served = try vaultctl(fixture.socketPath, ["token", "demo", user])
            #expect(
                served.status == 0 && served.stdout.trimmingCharacters(in: .newlines) == token,
                "\(user): \(served.stderr)")
        }
        daemon.stop()
    }

    @Test("Should seal every row under a new key, name both ids, keep serving the tokens, and drop the old key's item")
    func rotatesSecretServiceKey() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "sqlite")
        let before = try keyIDs(fixture)
        #expect(before.rows == [before.meta], "every row is under the database's key")
        #expect(try fixture.dataKeyIDs() == [before.meta])

        let run = try expectSuccess(rotate(fixture))
        let after = try keyIDs(fixture)
        #expect(after.meta != before.meta, "the key changed")
        #expect(after.rows == [after.meta], "every row is under the new key: \(after.rows)")
        #expect(run.stdout.contains("from \(before.meta) to \(after.meta): 5 rows"), "\(run.stdout)")
        #expect(try fixture.dataKeyIDs() == [after.meta], "only the new key is left in the keyring")
        try expectServed(fixture)
    }

    @Test("Should leave a database that opens when killed at any step of a rotation, and rotate when run again")
    func killedMidRotation() async throws {
        let fixture = try MigrationFixture()
        try await fixture.populate(on: "sqlite")
        for step in ["rotate-key-kept", "rotate-resealed"] {
            let before = try keyIDs(fixture)
            let run = try rotate(fixture, killAt: step)
            #expect(killed(run.status), "killed at \(step): \(run.status) \(run.stderr)")
            let between = try keyIDs(fixture)
            #expect(between.rows == [between.meta], "after \(step) every row is under one key: \(between.rows)")
            #expect(try fixture.dataKeyIDs().contains(between.meta), "after \(step) the keyring holds that key")
            try expectServed(fixture)
            let rerun = try rotate(fixture)
            #expect(rerun.status == 0, "the rotation after \(step) runs: \(rerun.stderr)")
            let after = try keyIDs(fixture)
            #expect(after.meta != before.meta && after.meta != between.meta)
            #expect(try fixture.dataKeyIDs() == [after.meta], "one key is left after \(step)")
        }
        try expectServed(fixture)
    }

    @Test("Should re-seal under the credential data-key from data-key.previous, and say when there is nothing to do")
    func rotatesCredentialKey() async throws {
        let fixture = try MigrationFixture()
        let credentials = fixture.directory.path("credentials")
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: false)
        func writeKey(_ name: String, _ bytes: [UInt8]) throws {
            try Data(bytes).write(to: URL(fileURLWithPath: credentials + "/" + name))
        }
        let old = (0..<32).map { _ in UInt8.random(in: 0...255) }
        try writeKey("data-key", old)
        let environment = ["CREDENTIALS_DIRECTORY": credentials]
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath,
            environment: fixture.environment("sqlite").merging(environment, uniquingKeysWith: { _, new in new }))
        let user = uniqueName("cred")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: "tok-cred").status == 0)
        fixture.tokens[user] = "tok-cred"
        daemon.stop()
        let before = try keyIDs(fixture)

        let nothing = try rotate(fixture, environment: environment)
        #expect(nothing.status == 0 && nothing.stdout.contains("nothing to rotate"), "\(nothing.stdout)")
        #expect(try keyIDs(fixture).meta == before.meta)

        try writeKey("data-key.previous", old)
        try writeKey("data-key", (0..<32).map { _ in UInt8.random(in: 0...255) })
        let run = try expectSuccess(rotate(fixture, environment: environment))
        let after = try keyIDs(fixture)
        #expect(after.meta != before.meta && after.rows == [after.meta])
        #expect(run.stdout.contains("from data key \(before.meta)") && run.stdout.contains(after.meta), "\(run.stdout)")
        #expect(try fixture.dataKeyIDs().isEmpty, "a credential key is never copied into the keyring")
        try FileManager.default.removeItem(atPath: credentials + "/data-key.previous")
        try expectServed(fixture, environment: environment)
    }

    @Test("Should refuse to rotate the Secret Service store, or while vaultd serves the database")
    func refusals() async throws {
        let fixture = try MigrationFixture()
        try expectFailure(
            runCommand(
                Binaries.vaultd, ["--config", fixture.configPath, "--rotate-key"],
                environment: fixture.environment("secret-service")), saying: "rotates the data key of the SQLite store")

        try await fixture.populate(on: "sqlite")
        let before = try keyIDs(fixture)
        let daemon = try fixture.start("sqlite")
        try expectFailure(rotate(fixture), saying: "is in use")
        daemon.stop()
        #expect(try keyIDs(fixture).meta == before.meta)
    }
}
