import Foundation
import Glibc
import Testing
import VaultCore
import VaultDaemon
import VaultSystem

/// The SQLite engine's own cases, run in every `scripts/test` (not only in
/// the SQLite run): its key from the keyring, a wrong key, a damaged row and
/// a database file holding nothing in the clear. Real vaultd, real files,
/// the private keyring for the key item.
@Suite("The SQLite engine with a real vaultd", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct SQLiteEngineTests {
    static let token = "tok_sqlite_q8w7e6r5t4y3u2i1o0p9"

    /// The database file and its WAL, whatever of them is there.
    func databaseBytes(_ files: SQLiteFiles) -> [UInt8] {
        ["", "-wal", "-journal"].flatMap { readBytes(files.database + $0) ?? [] }
    }

    /// Flips one bit in the middle of the sealed session row of `user`, with
    /// Python's sqlite3 (another program, as a damaged disk or a careless
    /// operator would): its tag no longer matches.
    func damageRow(_ database: String, user: String) throws -> CommandResult {
        let script = """
            import sqlite3, sys
            c = sqlite3.connect(sys.argv[1])
            (sealed,) = c.execute("SELECT sealed FROM sessions WHERE user = ?", (sys.argv[2],)).fetchone()
            damaged = bytearray(sealed)
            damaged[len(damaged) // 2] ^= 1
            c.execute("UPDATE sessions SET sealed = ? WHERE user = ?", (bytes(damaged), sys.argv[2]))
            c.commit()
            """
        return try runCommand(URL(fileURLWithPath: "/usr/bin/env"), ["python3", "-c", script, database, user])
    }

    @Test("Should keep the data key as one io.vaultd.DataKey item in the keyring when no credential is given")
    func keyInTheKeyring() async throws {
        let fixture = try DaemonFixture(engine: .sqlite, dataKey: .secretService)
        let user = uniqueName("sskey")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: Self.token).status == 0)
        let items = try runCommand(
            URL(fileURLWithPath: "/usr/bin/secret-tool"),
            ["search", "--all", "xdg:schema", LibsecretStore.dataKeySchemaName, "scope", fixture.scope])
        let text = items.stdout + items.stderr
        #expect(text.components(separatedBy: "label = ").count - 1 == 1, "one key item: \(text)")
        // The sessions are in the database, not in the keyring.
        #expect(try secretToolSearch(provider: "demo", user: user).contains("label =") == false)
        #expect(try await fixture.store.records(provider: "demo", user: user).count == 1)
        // A restart finds the same key: the session is back.
        #expect(fixture.daemon?.stop() == 0)
        try fixture.start()
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", user]).stdout == Self.token + "\n")
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test(
        "Should refuse to start over a database sealed under another key, naming both key ids, and start with it back")
    func wrongCredentialRefused() async throws {
        let fixture = try DaemonFixture(engine: .sqlite)
        let files = SQLiteFiles(socketPath: fixture.socketPath)
        let user = uniqueName("wrongkey")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: Self.token).status == 0)
        #expect(fixture.daemon?.stop() == 0)

        let keyPath = files.credentials + "/" + CredentialDataKeys.name
        let original = try #require(readBytes(keyPath))
        let right = try DataKey(copying: original, source: "the test")
        let otherBytes = (0..<DataKey.byteCount).map { _ in UInt8.random(in: 0...255) }
        try Data(otherBytes).write(to: URL(fileURLWithPath: keyPath))
        let wrong = try DataKey(copying: otherBytes, source: "the test")
        let refused = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath, waitForReady: false, engine: .sqlite)
        #expect(refused.waitForExit() == 1, "\(refused.output.text)")
        let text = refused.output.text
        #expect(text.contains(right.id) && text.contains(wrong.id), "both key ids named: \(text)")
        #expect(!text.contains("notice: ready"))
        #expect(!Files.exists(fixture.socketPath), "no socket over a database it cannot read")

        try Data(original).write(to: URL(fileURLWithPath: keyPath))
        try fixture.start()
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", user]).stdout == Self.token + "\n")
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should start past a damaged row, naming its account, and keep the rest")
    func damagedRowIsReported() async throws {
        let fixture = try DaemonFixture(start: false, engine: .sqlite)
        let good = uniqueName("good")
        let broken = uniqueName("broken")
        for user in [good, broken] {
            try await fixture.store.seed(
                storedSession("demo", user, tokens: TokenSet(accessToken: Secret(Self.token))))
        }
        try expectSuccess(damageRow(SQLiteFiles(socketPath: fixture.socketPath).database, user: broken))
        let daemon = try fixture.start()
        #expect(
            daemon.output.text.contains("a stored item could not be read as a session and is ignored"),
            "\(daemon.output.text)")
        #expect(daemon.output.text.contains("session \(broken) @ demo"), "\(daemon.output.text)")
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", good]).stdout == Self.token + "\n")
        #expect(try vaultctl(fixture.socketPath, ["status", "demo", broken]).status == 1)
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", good]).status == 0)
    }

    /// Another program holding the database's write lock (Python's sqlite3,
    /// `BEGIN EXCLUSIVE`, as a migration or an operator's sqlite3 would)
    /// until `release()`.
    final class WriteLock {
        let process = Process()
        private let input = Pipe()
        private let output: OutputCollector

        init(_ database: String) throws {
            let script = """
                import sqlite3, sys
                c = sqlite3.connect(sys.argv[1], isolation_level=None)
                c.execute("BEGIN EXCLUSIVE")
                print("LOCKED", flush=True)
                sys.stdin.read()
                c.execute("ROLLBACK")
                """
            process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
            process.arguments = ["python3", "-c", script, database]
            let out = Pipe()
            process.standardOutput = out
            process.standardError = FileHandle.nullDevice
            process.standardInput = input
            output = OutputCollector(out)
            try process.run()
            guard output.wait(for: "LOCKED") else { throw HarnessError("the lock holder did not start") }
        }

        /// Lets go of the lock and waits (bounded) for the holder to exit.
        func release() throws {
            try input.fileHandleForWriting.close()
            _ = try reap(process)
        }

        deinit {
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            _ = try? reap(process)
        }
    }

    @Test(
        "Should refuse a write while another program holds the database, naming the account it was writing, serve on, and write once it lets go"
    )
    func lockedByAnotherProgram() async throws {
        let fixture = try DaemonFixture(start: false, engine: .sqlite)
        try fixture.configure("[Vault]\nStoreTimeout=2\n\n[Provider demo]\nType=static\n")
        try fixture.start()
        let first = uniqueName("first")
        let second = uniqueName("second")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", first], input: Self.token).status == 0)

        let lock = try WriteLock(SQLiteFiles(socketPath: fixture.socketPath).database)
        let refused = try vaultctl(fixture.socketPath, ["login", "demo", second], input: Self.token)
        #expect(refused.status == 1, "\(refused.stdout)")
        // The message names this write's account, never the one an earlier write was for.
        #expect(refused.stderr.contains("writing \(second) @ demo"), "\(refused.stderr)")
        #expect(!refused.stderr.contains(first), "\(refused.stderr)")
        #expect(refused.stderr.contains("another process holds the database"), "\(refused.stderr)")
        #expect(try vaultctl(fixture.socketPath, ["token", "demo", first]).stdout == Self.token + "\n")
        try expectFailure(vaultctl(fixture.socketPath, ["logout", "demo", first]), saying: first)

        try lock.release()
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", second], input: Self.token).status == 0)
        #expect(fixture.daemon?.stop() == 0)
        try fixture.start()
        for user in [first, second] {
            #expect(try vaultctl(fixture.socketPath, ["token", "demo", user]).stdout == Self.token + "\n")
            #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
        }
    }

    @Test("Should write no token, refresh token or client secret to the database file or its WAL")
    func nothingInTheClear() async throws {
        let fixture = try DaemonFixture(start: false, engine: .sqlite)
        // Port 9 (discard) on loopback: the client secret is only stored, never sent.
        try
            "[Provider demo]\nType=static\n\n[Provider other]\nType=oauth2\nTokenURL=http://127.0.0.1:9/token\nClientID=vaultd-test\n"
            .write(toFile: fixture.configPath, atomically: true, encoding: .utf8)
        try fixture.start()
        let files = SQLiteFiles(socketPath: fixture.socketPath)
        let user = uniqueName("clear")
        let clientSecret = "cs-sqlite-clear-" + UUID().uuidString
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: Self.token).status == 0)
        #expect(try vaultctl(fixture.socketPath, ["provider-secret", "other"], input: clientSecret).status == 0)
        let whileRunning = databaseBytes(files)
        #expect(!whileRunning.isEmpty)
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
        #expect(fixture.daemon?.stop() == 0)
        for (when, bytes) in [("while vaultd ran", whileRunning), ("after it stopped", databaseBytes(files))] {
            let text = String(decoding: bytes.map { $0 == 0 ? 0x0A : $0 }, as: UTF8.self)
            #expect(!text.contains(Self.token), "the token is in the database \(when)")
            #expect(!text.contains(clientSecret), "the client secret is in the database \(when)")
            #expect(!text.contains("accessToken"), "a record's JSON is in the database \(when)")
        }
    }
}
