import Foundation
import Testing

/// The system instance as systemd/system/vaultd.service runs it: the real
/// vaultd with VAULTD_STORE=sqlite, its database in STATE_DIRECTORY, its
/// data key the credential `data-key` in CREDENTIALS_DIRECTORY (decrypted by
/// systemd-creds from an encrypted credential, as LoadCredentialEncrypted=
/// does), and no D-Bus session bus at all.
@Suite(.serialized, .ownThreads, .timeLimit(.minutes(5)))
struct SystemInstanceStoreTests {
    @Test("Should leave every session in sessions.db alone after a clean stop, so a copy of that one file is a backup")
    func cleanStopLeavesOneFile() throws {
        let unit = try SystemUnitRun()
        try unit.writeKey(SystemUnitRun.randomKey())
        let user = uniqueName("wal")
        let token = "sqlite_checkpoint_token_abcdefghijkl"
        let first = try unit.start()
        #expect(try vaultctl(unit.socket, ["login", "demo", user], input: token).status == 0)
        #expect(first.stop() == 0, "\(first.output.text)")
        let log = unit.database + "-wal"
        let logBytes = (try? FileManager.default.attributesOfItem(atPath: log)[.size] as? Int) ?? 0
        #expect(logBytes == 0, "the write-ahead log kept \(logBytes) bytes after a clean stop")
        // The backup a user would take of a stopped vaultd: sessions.db, nothing else.
        for leftover in [log, unit.database + "-shm"] { try? FileManager.default.removeItem(atPath: leftover) }
        let second = try unit.start()
        let again = try vaultctl(unit.socket, ["token", "demo", user])
        #expect(again.stdout == token + "\n", "\(again.stderr)")
        #expect(second.stop() == 0, "\(second.output.text)")
    }

    @Test(
        "Should keep a session in STATE_DIRECTORY/sessions.db under the credential key, with no D-Bus, across a restart"
    )
    func restartKeepsToken() throws {
        let unit = try SystemUnitRun()
        try unit.makeEncryptedKey()
        let user = uniqueName("sys")
        let token = "sqlite_system_token_abcdefghijklmnop"

        let first = try unit.start()
        let keyID = try #require(SystemUnitRun.keyID(in: first.output.text), "\(first.output.text)")
        #expect(first.output.text.contains("SQLite database \(unit.database)"), "\(first.output.text)")
        #expect(first.output.text.contains("the credential data-key"), "\(first.output.text)")
        try expectSuccess(vaultctl(unit.socket, ["login", "demo", user], input: token))
        #expect(try vaultctl(unit.socket, ["token", "demo", user]).stdout == token + "\n")
        #expect(first.stop() == 0, "\(first.output.text)")

        // The database is the service's alone, and holds the token sealed.
        let attributes = try FileManager.default.attributesOfItem(atPath: unit.database)
        #expect((attributes[.posixPermissions] as? Int) == 0o600, "\(attributes)")
        for (name, bytes) in try unit.stateFiles() {
            #expect(bytes.range(of: Data(token.utf8)) == nil, "\(name) holds the token in the clear")
        }
        // Nothing under XDG_STATE_HOME: STATE_DIRECTORY wins.
        #expect(!FileManager.default.fileExists(atPath: unit.dir.path("xdg-state/vaultd")))

        let second = try unit.start()
        #expect(SystemUnitRun.keyID(in: second.output.text) == keyID, "\(second.output.text)")
        let again = try expectSuccess(vaultctl(unit.socket, ["token", "demo", user]))
        #expect(again.stdout == token + "\n")
        #expect(second.stop() == 0, "\(second.output.text)")
        #expect(!first.allOutput.contains(token) && !second.allOutput.contains(token))
    }

    @Test(
        "Should refuse to start under another 32-byte key, naming the credential and the key id, and leave the database as it was"
    )
    func wrongKeyRefused() throws {
        let unit = try SystemUnitRun()
        try unit.writeKey(SystemUnitRun.randomKey())
        let user = uniqueName("sys")
        let token = "sqlite_wrong_key_token_abcdefghijkl"
        let first = try unit.start()
        let keyID = try #require(SystemUnitRun.keyID(in: first.output.text), "\(first.output.text)")
        #expect(try vaultctl(unit.socket, ["login", "demo", user], input: token).status == 0)
        #expect(first.stop() == 0, "\(first.output.text)")
        let before = try unit.databaseDump()
        let rightKey = try #require(FileManager.default.contents(atPath: unit.keyPath))

        try unit.writeKey(SystemUnitRun.randomKey())
        let refused = try unit.start(waitForReady: false)
        #expect(refused.waitForExit() == 1, "\(refused.output.text)")
        let text = refused.output.text
        #expect(!text.contains("notice: ready"), "\(text)")
        #expect(text.contains("sealed under data key \(keyID)"), "\(text)")
        #expect(text.contains("data-key holds key "), "\(text)")
        #expect(text.contains("\(unit.credentials)"), "\(text)")
        // The same rows and key id. (Not the same bytes: the refused start
        // checkpoints the WAL the previous run left into the main file.)
        #expect(try unit.databaseDump() == before, "the refused start changed the database")

        // The right key opens it again, with the session in it.
        try unit.writeKey(rightKey)
        let back = try unit.start()
        #expect(try vaultctl(unit.socket, ["token", "demo", user]).stdout == token + "\n")
        #expect(back.stop() == 0, "\(back.output.text)")
    }

    @Test(
        "Should refuse a 31-byte key, and a missing one with no Secret Service, each with an error naming the credential"
    )
    func badKeyRefused() throws {
        let unit = try SystemUnitRun()
        try unit.writeKey(Array(SystemUnitRun.randomKey().prefix(31)))
        let short = try unit.start(waitForReady: false)
        #expect(short.waitForExit() == 1, "\(short.output.text)")
        #expect(short.output.text.contains("credential data-key"), "\(short.output.text)")
        #expect(short.output.text.contains("holds 31 bytes"), "\(short.output.text)")
        #expect(short.output.text.contains("exactly 32"), "\(short.output.text)")
        #expect(!short.output.text.contains("notice: ready"))

        try FileManager.default.removeItem(atPath: unit.keyPath)
        let missing = try unit.start(waitForReady: false)
        #expect(missing.waitForExit() == 1, "\(missing.output.text)")
        #expect(missing.output.text.contains("credential data-key"), "\(missing.output.text)")
        #expect(missing.output.text.contains("not there"), "\(missing.output.text)")
        #expect(!missing.output.text.contains("notice: ready"))
    }

    @Test(
        "Should re-seal under a new data-key at start when the old one is given as data-key.previous, as vaultd(8) says"
    )
    func rotationAtStart() throws {
        let unit = try SystemUnitRun()
        let oldKey = SystemUnitRun.randomKey()
        try unit.writeKey(oldKey)
        let user = uniqueName("sys")
        let token = "sqlite_rotation_token_abcdefghijklm"
        let first = try unit.start()
        let oldID = try #require(SystemUnitRun.keyID(in: first.output.text))
        #expect(try vaultctl(unit.socket, ["login", "demo", user], input: token).status == 0)
        #expect(first.stop() == 0, "\(first.output.text)")

        // The rotation drop-in: a new data-key, the old one as data-key.previous.
        try unit.writeKey(SystemUnitRun.randomKey())
        try unit.writeKey(oldKey, name: "data-key.previous")
        let rotating = try unit.start()
        let sealed = try #require(
            rotating.output.text.split(separator: "\n").first {
                $0.contains("sealed the session database under the new data key")
            },
            "\(rotating.output.text)")
        #expect(sealed.contains("from=\(oldID)") && sealed.contains("rows=1"), "\(sealed)")
        let newID = try #require(sealed.split(separator: " ").first { $0.hasPrefix("to=") }?.dropFirst(3))
        #expect(newID != oldID)
        // The ready line names the key the rows are sealed under now.
        #expect(SystemUnitRun.keyID(in: rotating.output.text) == String(newID), "\(rotating.output.text)")
        #expect(try vaultctl(unit.socket, ["token", "demo", user]).stdout == token + "\n")
        #expect(rotating.stop() == 0, "\(rotating.output.text)")

        // The drop-in removed: the new key alone opens every row.
        try FileManager.default.removeItem(atPath: "\(unit.credentials)/data-key.previous")
        let after = try unit.start()
        #expect(SystemUnitRun.keyID(in: after.output.text) == String(newID), "\(after.output.text)")
        #expect(!after.output.text.contains("sealed the session database"), "\(after.output.text)")
        #expect(try vaultctl(unit.socket, ["token", "demo", user]).stdout == token + "\n")
        #expect(after.stop() == 0, "\(after.output.text)")
    }
}

/// The directories systemd gives vaultd.service (StateDirectory=,
/// LoadCredentialEncrypted=) in a test's temporary directory, and vaultd
/// started in them as the unit starts it.
private final class SystemUnitRun {
    let dir: TemporaryDirectory
    let state: String
    let credentials: String
    let socket: String
    var database: String { "\(state)/sessions.db" }
    var keyPath: String { "\(credentials)/data-key" }

    init() throws {
        dir = try TemporaryDirectory()
        state = dir.path("state")
        credentials = dir.path("credentials")
        socket = dir.path("s")
        // StateDirectoryMode=0700; systemd's credential directories are 0500,
        // kept writable here so a test can change the key between starts.
        try FileManager.default.createDirectory(
            atPath: state, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        try FileManager.default.createDirectory(
            atPath: credentials, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
    }

    static func randomKey() -> [UInt8] { (0..<32).map { _ in UInt8.random(in: 0...255) } }

    /// Writes `key` as the credential `name`, mode 0400 as systemd leaves it.
    func writeKey(_ key: some Collection<UInt8>, name: String = "data-key") throws {
        let path = "\(credentials)/\(name)"
        try? FileManager.default.removeItem(atPath: path)
        guard FileManager.default.createFile(atPath: path, contents: Data(key), attributes: [.posixPermissions: 0o400])
        else { throw HarnessError("cannot write \(path)") }
    }

    /// The unit's way: 32 random bytes encrypted by systemd-creds (with a
    /// host secret of the test's own, not the machine's), then decrypted into
    /// the credential directory, as LoadCredentialEncrypted= does at start.
    func makeEncryptedKey() throws {
        let creds = URL(fileURLWithPath: "/usr/bin/systemd-creds")
        let environment = ["SYSTEMD_CREDENTIAL_SECRET": dir.path("credential.secret")]
        let encrypted = dir.path("data-key.cred")
        let made = try runCommand(
            URL(fileURLWithPath: "/bin/sh"),
            ["-c", "(umask 077; head -c 32 /dev/urandom | systemd-creds encrypt --name=data-key - \(encrypted))"],
            environment: environment)
        guard made.status == 0 else { throw HarnessError("systemd-creds encrypt: \(made.stderr)") }
        let opened = try runCommand(
            creds, ["decrypt", "--name=data-key", encrypted, keyPath], environment: environment)
        guard opened.status == 0 else { throw HarnessError("systemd-creds decrypt: \(opened.stderr)") }
        #expect(FileManager.default.contents(atPath: keyPath)?.count == 32)
    }

    /// vaultd as vaultd.service runs it: VAULTD_STORE=sqlite, STATE_DIRECTORY,
    /// CREDENTIALS_DIRECTORY, and a session bus address that leads nowhere.
    func start(waitForReady: Bool = true) throws -> RunningDaemon {
        try RunningDaemon(
            socketPath: socket, configPath: Binaries.packageRoot.appendingPathComponent("config/vaultd.conf").path,
            environment: [
                "VAULTD_STORE": "sqlite", "STATE_DIRECTORY": state, "CREDENTIALS_DIRECTORY": credentials,
                "DBUS_SESSION_BUS_ADDRESS": "unix:path=\(dir.path("no-bus"))",
                "XDG_STATE_HOME": dir.path("xdg-state"),
            ],
            waitForReady: waitForReady, unsetEnvironment: ["VAULTD_DATABASE"])
    }

    /// Every file in the state directory and its bytes.
    func stateFiles() throws -> [String: Data] {
        var files: [String: Data] = [:]
        for name in try FileManager.default.contentsOfDirectory(atPath: state) {
            files[name] = FileManager.default.contents(atPath: "\(state)/\(name)") ?? Data()
        }
        return files
    }

    /// The database's rows, as Python's sqlite3 dumps them, read from a copy
    /// of the state directory so that the reading changes nothing here.
    func databaseDump() throws -> String {
        let copy = dir.path("copy-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(atPath: copy, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: copy) }
        for (name, bytes) in try stateFiles() {
            guard FileManager.default.createFile(atPath: "\(copy)/\(name)", contents: bytes) else {
                throw HarnessError("cannot copy \(name)")
            }
        }
        let dump = try runCommand(
            URL(fileURLWithPath: "/usr/bin/env"),
            [
                "python3", "-c",
                "import sqlite3, sys; print('\\n'.join(sqlite3.connect(sys.argv[1]).iterdump()))",
                "\(copy)/sessions.db",
            ])
        guard dump.status == 0, dump.stdout.contains("CREATE TABLE") else {
            throw HarnessError("cannot dump the database: \(dump.stderr)")
        }
        return dump.stdout
    }

    /// The data key's id in the ready line ("..., key ID from the credential ...").
    static func keyID(in log: String) -> String? {
        guard let ready = log.split(separator: "\n").first(where: { $0.contains("notice: ready") }),
            let range = ready.range(of: ", key ")
        else { return nil }
        let id = ready[range.upperBound...].prefix { $0 != " " }
        return id.isEmpty ? nil : String(id)
    }
}
