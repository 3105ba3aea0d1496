import Foundation
import Glibc
import Testing
import VaultCore

@testable import VaultDaemon

/// A database file in a directory made for one test, removed (with
/// everything in it) at the end, and credentials beside it.
final class ScratchDatabase {
    private let temporary: TemporaryDirectory
    var directory: String { temporary.path }
    /// `directory/sessions.db`.
    var path: String { directory + "/sessions.db" }
    /// `directory/credentials`: where `credential(_:)` writes.
    var credentials: String { directory + "/credentials" }
    private var heldLock: DatabaseLock?

    init() throws { temporary = try TemporaryDirectory("vaultd-sqlite") }

    /// A scratch database with a data key (`keyMaterial(1)`) and its store,
    /// holding every kind of row (`Rows.fill`).
    static func filled() async throws -> (ScratchDatabase, SQLiteStore) {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        let store = try await scratch.open()
        try await Rows.fill(store)
        return (scratch, store)
    }

    /// Writes `bytes` as the credential `name` (`data-key`, `data-key.previous`).
    func credential(_ name: String, _ bytes: [UInt8]) throws {
        try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: credentials + "/" + name, contents: Data(bytes)))
    }

    /// Removes the credential `name`.
    func removeCredential(_ name: String) throws {
        try FileManager.default.removeItem(atPath: credentials + "/" + name)
    }

    /// The credential source reading `credentials`.
    var keys: CredentialDataKeys { CredentialDataKeys(directory: credentials) }

    /// The store on `path`, its key from `keys` (the credentials by default),
    /// under one lock for the scratch database: a test opens it again while
    /// it still holds the store it opened before, as successive processes would not.
    func open(_ keys: (any DataKeySource)? = nil) async throws(VaultError) -> SQLiteStore {
        try await SQLiteStore.open(
            path: path, keys: keys ?? self.keys, timeoutSeconds: 30, log: Logger(level: .debug, target: .discard),
            lock: try lock())
    }

    /// The database's lock, taken on first use and held as long as the scratch database.
    func lock() throws(VaultError) -> DatabaseLock {
        if let heldLock { return heldLock }
        let lock = try DatabaseLock.acquire(for: path)
        heldLock = lock
        return lock
    }

    /// A second connection to the database, as another program would open it.
    func connection() throws(VaultError) -> SQLiteDatabase {
        try SQLiteDatabase(path: path, timeoutSeconds: 30)
    }

    /// The bytes of `name` in the directory (nil when there is no such file).
    func bytes(_ name: String) -> [UInt8]? {
        FileManager.default.contents(atPath: directory + "/" + name).map { [UInt8]($0) }
    }
}

/// 32 bytes of key material: `seed` repeated, so that two calls with one seed give one key.
func keyMaterial(_ seed: UInt8) -> [UInt8] { (0..<32).map { seed &+ UInt8($0) } }

/// True when `needle` occurs in `haystack`.
func occurs(_ needle: [UInt8], in haystack: [UInt8]) -> Bool {
    guard !needle.isEmpty, haystack.count >= needle.count else { return false }
    for start in 0...(haystack.count - needle.count) where haystack[start] == needle[0] {
        if haystack[start..<(start + needle.count)].elementsEqual(needle) { return true }
    }
    return false
}

/// Records, revocations and client secrets with every field set, and tokens
/// easy to find in raw bytes (each holds `marker`).
enum Rows {
    static let marker = "TOKENBYTES"

    /// A record with every field, or (`full` false) with none of the optional ones.
    static func record(_ provider: String, _ user: String, owner: UInt32 = 1000, full: Bool = true) -> SessionRecord {
        var tokens = TokenSet(accessToken: Secret("at-\(marker)-\(provider)-\(user)-\(owner)"))
        var profile = UserProfile(uid: user)
        var record: SessionRecord
        if full {
            tokens.refreshToken = Secret("rt-\(marker)-\(provider)-\(user)-\(owner)")
            tokens.tokenType = "Bearer"
            tokens.scope = "api refresh_token"
            tokens.instanceURL = "https://example.my.salesforce.com"
            tokens.clientID = "client-\(provider)"
            tokens.issuedAt = UnixTime(seconds: 1_800_000_000)
            profile.name = "Name of \(user) (ünïcödé)"
            profile.avatar = "https://example.com/\(user).png"
            profile.role = "default"
            profile.metadata = .object(["team": "blue", "level": .int(3), "tags": .array(["a", "b"])])
            profile.status = "online"
            profile.statusMessage = "here"
            profile.lastActiveAt = UnixTime(seconds: 1_799_999_000)
            profile.deactivatedAt = UnixTime(seconds: 1_800_100_000)
            record = SessionRecord(
                account: Account(provider: provider, user: user), user: profile, tokens: tokens,
                createdAt: UnixTime(seconds: 1_800_000_001), expiresAt: UnixTime(seconds: 1_800_003_600),
                ownerUID: owner)
        } else {
            record = SessionRecord(
                account: Account(provider: provider, user: user), user: profile, tokens: tokens,
                createdAt: UnixTime(seconds: 1_800_000_001), expiresAt: nil, ownerUID: owner)
        }
        return record
    }

    /// A record marked for logout, with the id of its queued revocation.
    static func loggingOut(_ provider: String, _ user: String, owner: UInt32 = 1000) -> SessionRecord {
        var record = record(provider, user, owner: owner)
        record.phase = .loggingOut
        record.revocationID = "00000000000000aa00000000000000bb"
        return record
    }

    /// Queued revocations, one of a replaced access token. Their records
    /// carry their id as `revocationID`, as a logout's do: the stored form
    /// keeps one `revocationId` member for both (as the Secret Service
    /// engine's items do), so it reads back so whatever was written.
    static let revocations = [
        revocation("0000000000000001000000000000000a", record("oauth", "gone"), replaced: false),
        revocation("0000000000000002000000000000000b", record("oauth", "refreshed", owner: 1001), replaced: true),
    ]

    static func revocation(_ id: String, _ record: SessionRecord, replaced: Bool) -> PendingRevocation {
        var record = record
        record.revocationID = id
        return PendingRevocation(id: id, record: record, replaced: replaced)
    }

    static let secrets = ["oauth": Secret("cs-\(marker)-oauth"), "sf": Secret("cs-\(marker)-sf")]

    /// Every kind of row, written one call at a time.
    static func fill(_ store: SQLiteStore) async throws {
        try await store.apply(.save(record("oauth", "alice")))
        try await store.apply(.save(record("oauth", "alice", owner: 1001)))
        try await store.apply(.save(record("demo", "bob", full: false)))
        try await store.apply(.save(loggingOut("oauth", "carol")))
        for revocation in revocations { try await store.apply(.savePendingRevocation(revocation)) }
        for (provider, secret) in secrets { try await store.apply(.saveProviderSecret(provider, secret)) }
    }

    /// The records `fill` writes, in the store's order (provider, user, owner).
    static var filled: [SessionRecord] {
        [
            record("demo", "bob", full: false), record("oauth", "alice"), record("oauth", "alice", owner: 1001),
            loggingOut("oauth", "carol"),
        ]
    }
}

/// The SQLite engine on real files: what it writes reads back, what is on
/// disk is sealed and bound to its account, and every way a database or its
/// key can be wrong is refused with a message that names it.
@Suite("SQLite session store", .timeLimit(.minutes(5)))
struct SQLiteStoreTests {
    // MARK: Round trips

    @Test("Should read back every kind of row it wrote, after a reopen too, with updates and deletes applied")
    func roundTrip() async throws {
        let (scratch, store) = try await ScratchDatabase.filled()
        #expect(try await store.loadAll().records == Rows.filled)
        #expect(try await store.loadPendingRevocations() == Rows.revocations)
        #expect(try await store.loadProviderSecrets() == Rows.secrets)
        #expect(try await store.loadProviderSecret("oauth") == Rows.secrets["oauth"])
        #expect(try await store.loadProviderSecret("none") == nil)

        // Replace one record, delete another (one owner's only), one revocation, one secret replaced.
        var changed = Rows.record("oauth", "alice")
        changed.tokens.accessToken = Secret("at-\(Rows.marker)-changed")
        changed.expiresAt = nil
        try await store.apply(.save(changed))
        try await store.apply(.delete(SessionKey(owner: 1001, account: Account(provider: "oauth", user: "alice"))))
        try await store.apply(.delete(SessionKey(owner: 1001, account: Account(provider: "oauth", user: "nobody"))))
        try await store.apply(.deletePendingRevocation(Rows.revocations[0]))
        try await store.apply(.saveProviderSecret("sf", Secret("cs-\(Rows.marker)-sf-2")))

        let reopened = try await scratch.open()
        let contents = try await reopened.loadAll()
        #expect(contents.unreadable.isEmpty)
        #expect(
            contents.records == [Rows.record("demo", "bob", full: false), changed, Rows.loggingOut("oauth", "carol")])
        #expect(try await reopened.loadPendingRevocations() == [Rows.revocations[1]])
        #expect(try await reopened.loadPendingRevocations().first?.replaced == true)
        #expect(try await reopened.loadProviderSecret("sf")?.revealed == "cs-\(Rows.marker)-sf-2")
    }

    @Test("Should hold no connection after closeConnection, while still referenced: the file can leave WAL mode")
    func closedConnectionLetsTheFileLeaveWAL() async throws {
        let (scratch, store) = try await ScratchDatabase.filled()
        // A migration seals the file it just wrote; its store may outlive that a moment on the store's worker.
        try await store.closeConnection()
        try MigrationTarget.seal(scratch.path, timeoutSeconds: 1, rows: [:])
        #expect(scratch.bytes("sessions.db-wal") == nil)
        // Closed for good: a later call fails, naming it, and touches no freed connection.
        await #expect(throws: VaultError(.storeFailed, "")) { try await store.loadAll() }
        withExtendedLifetime(store) {}
        let reopened = try await scratch.open()
        #expect(try await reopened.loadAll().records == Rows.filled)
    }

    @Test("Should read a large store in parts, in key order, naming each damaged row whichever part read it")
    func largeStoreReadInParts() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        let store = try await scratch.open()
        // Inserted out of key order, in providers whose bytes sort otherwise than
        // their Swift strings would not: the parts must be merged by the key's bytes.
        let count = Int(SQLiteStore.rowsPerReader) * 2 + 123
        var records: [SessionRecord] = []
        for i in (0..<count).reversed() {
            let provider = ["zeta", "Alpha", "émile"][i % 3]
            records.append(Rows.record(provider, "u\(i)", owner: UInt32(1000 + i % 3), full: i % 7 == 0))
        }
        try await store.importContents(records: records, revocations: [], providerSecrets: [:])
        // One damaged row in each of two parts (rowids of either parity), and
        // rows with negative rowids (another tool's inserts), which belong to a part too.
        let damaged = try scratch.connection()
        try damaged.execute(
            "UPDATE sessions SET sealed = zeroblob(length(sealed)) WHERE rowid IN (10, 4001)", "damaging rows")
        try damaged.execute("UPDATE sessions SET rowid = -rowid WHERE rowid IN (20, 21)", "moving rows")
        let reopened = try await scratch.open()
        let contents = try await reopened.loadAll()
        let expected = records.filter { record in
            !contents.unreadable.contains { $0.hasPrefix("session \(record.account) of uid \(record.ownerUID) ") }
        }.sorted { x, y in
            if x.account.provider != y.account.provider {
                return x.account.provider.utf8.lexicographicallyPrecedes(y.account.provider.utf8)
            }
            if x.account.user != y.account.user {
                return x.account.user.utf8.lexicographicallyPrecedes(y.account.user.utf8)
            }
            return x.ownerUID < y.ownerUID
        }
        #expect(contents.unreadable.count == 2, "\(contents.unreadable)")
        #expect(contents.records.count == count - 2)
        let firstDifference = contents.records.indices.first {
            $0 >= expected.count || contents.records[$0] != expected[$0]
        }
        #expect(firstDifference == nil, "records differ from the expected order at \(firstDifference ?? -1)")
    }

    @Test("Should store every row of an import, and nothing of one that fails midway")
    func importIsAllOrNothing() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        let store = try await scratch.open()
        let kept = Rows.record("kept", "k")
        try await store.apply(.save(kept))
        // SQLite itself refuses the second revocation, after every record and the first revocation went in.
        try scratch.connection().execute(
            """
            CREATE TRIGGER poison BEFORE INSERT ON revocations WHEN NEW.user = 'refreshed'
            BEGIN SELECT RAISE(ABORT, 'injected failure'); END;
            """, "adding a trigger")
        let records = (0..<50).map { Rows.record("oauth", "u\($0)") }
        let error = await #expect(throws: VaultError.self) {
            try await store.importContents(
                records: records, revocations: Rows.revocations, providerSecrets: Rows.secrets)
        }
        #expect(error?.code == .storeFailed)
        #expect(error?.message.contains("injected failure") == true)
        #expect(try await store.loadAll().records == [kept], "no record of the failed import")
        #expect(try await store.loadPendingRevocations().isEmpty)
        #expect(try await store.loadProviderSecrets().isEmpty)

        try scratch.connection().execute("DROP TRIGGER poison", "dropping the trigger")
        try await store.importContents(records: records, revocations: Rows.revocations, providerSecrets: Rows.secrets)
        let reopened = try await scratch.open()
        #expect(try await reopened.loadAll().records.count == 51)
        #expect(try await reopened.loadPendingRevocations() == Rows.revocations)
        #expect(try await reopened.loadProviderSecrets() == Rows.secrets)
    }

    // MARK: What is on disk

    @Test("Should write no token byte to the database, its WAL or its shared memory file")
    func rowsAreSealed() async throws {
        let (scratch, store) = try await ScratchDatabase.filled()
        let marker = Array(Rows.marker.utf8)
        let names = ["sessions.db", "sessions.db-wal", "sessions.db-shm"]
        // While the store is open the rows are in the WAL; the account names are there in clear.
        #expect(scratch.bytes("sessions.db-wal") != nil)
        let inWAL = scratch.bytes("sessions.db-wal") ?? []
        #expect(occurs(Array("carol".utf8), in: inWAL), "the search finds what is there")
        for name in names {
            #expect(!occurs(marker, in: scratch.bytes(name) ?? []), "no token in \(name)")
        }
        // After a checkpoint into the main file, and after the connection closed.
        try scratch.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)", "checkpointing")
        #expect(occurs(Array("carol".utf8), in: scratch.bytes("sessions.db") ?? []))
        let files = try FileManager.default.contentsOfDirectory(atPath: scratch.directory)
        for name in files where name.hasPrefix("sessions.db") {
            #expect(!occurs(marker, in: scratch.bytes(name) ?? []), "no token in \(name)")
        }
        // The lock file (DatabaseLock) is empty: only its flock matters.
        #expect(scratch.bytes("sessions.db.lock") == [])
        #expect(Set(files).subtracting(names + ["sessions.db.lock", "credentials"]).isEmpty, "no other file: \(files)")
        withExtendedLifetime(store) {}
    }

    @Test("Should create the file 0600 in directories 0700, and tighten a file that is wider")
    func modes() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        let path = scratch.directory + "/state/vaultd/sessions.db"
        var store: SQLiteStore? = try await SQLiteStore.open(
            path: path, keys: scratch.keys, timeoutSeconds: 30, log: Logger(level: .debug, target: .discard))
        try await store?.apply(.save(Rows.record("oauth", "alice")))
        func mode(_ path: String) -> mode_t {
            var st = stat()
            return stat(path, &st) == 0 ? st.st_mode & 0o7777 : 0
        }
        #expect(mode(scratch.directory + "/state") == 0o700)
        #expect(mode(scratch.directory + "/state/vaultd") == 0o700)
        #expect(mode(path) == 0o600)
        #expect(mode(path + "-wal") == 0o600)
        #expect(mode(path + "-shm") == 0o600)

        chmod(path, 0o644)
        store = nil  // the next process: the first one's lock is gone with it
        // The last reference may still sit in the store thread's finished job
        // for a moment: the lock goes when it does (bounded wait).
        let deadline = ContinuousClock.now + .seconds(10)
        var reopened = false
        while !reopened {
            do {
                _ = try await SQLiteStore.open(
                    path: path, keys: scratch.keys, timeoutSeconds: 30, log: Logger(level: .debug, target: .discard))
                reopened = true
            } catch {
                guard error.message.contains("is in use"), ContinuousClock.now < deadline else { throw error }
                try await Task.sleep(for: .milliseconds(20))
            }
        }
        #expect(mode(path) == 0o600)
    }

    @Test("Should refuse a database that belongs to another uid", .enabled(if: geteuid() == 0, "needs root to chown"))
    func otherOwner() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        _ = try await scratch.open()
        #expect(chown(scratch.path, 4242, 4242) == 0)
        let error = await #expect(throws: VaultError.self) { _ = try await scratch.open() }
        #expect(error?.code == .storeFailed)
        #expect(error?.message.contains("belongs to uid 4242") == true, "\(error?.message ?? "")")
    }

    // MARK: Sealing binds a row to its place

    @Test("Should frame the associated data exactly as databases already sealed expect it")
    func associatedDataLayout() {
        let expected =
            Array("io.vaultd.sealed/1".utf8) + [0, 0, 0, 2, 0x61, 0x62] + [0, 0, 0, 0] + [0, 0, 1, 0x2C]
            + Array(repeating: 0x7A, count: 300)
        #expect(Sealing.associatedData(["ab", "", String(repeating: "z", count: 300)]) == expected)
    }

    @Test("Should not open a row whose sealed bytes were copied from another account's row, and open the others")
    func associatedDataBindsRows() async throws {
        let (scratch, _) = try await ScratchDatabase.filled()
        let other = try scratch.connection()
        // alice's row (uid 1000) onto bob's (another account), and onto alice of uid 1001 (another owner).
        try other.execute(
            """
            UPDATE sessions SET sealed = (SELECT sealed FROM sessions WHERE user = 'alice' AND owner_uid = 1000)
            WHERE user = 'bob' OR (user = 'alice' AND owner_uid = 1001);
            UPDATE provider_secrets SET sealed = (SELECT sealed FROM provider_secrets WHERE provider = 'oauth')
            WHERE provider = 'sf';
            UPDATE revocations SET sealed = (SELECT sealed FROM revocations WHERE user = 'gone')
            WHERE user = 'refreshed';
            """, "moving sealed bytes")
        let reopened = try await scratch.open()
        let contents = try await reopened.loadAll()
        #expect(contents.records == [Rows.record("oauth", "alice"), Rows.loggingOut("oauth", "carol")])
        #expect(contents.unreadable.count == 2)
        // Refused by the seal itself (the associated data), not only by the
        // check that the record read names the row's account and owner.
        #expect(contents.unreadable.contains { $0.contains("bob") && $0.contains("sealed under another key") })
        #expect(contents.unreadable.contains { $0.contains("uid 1001") && $0.contains("sealed under another key") })
        #expect(try await reopened.loadPendingRevocations() == [Rows.revocations[0]])
        #expect(try await reopened.loadProviderSecret("oauth") == Rows.secrets["oauth"])
        let error = await #expect(throws: VaultError.self) { _ = try await reopened.loadProviderSecret("sf") }
        #expect(error?.message.contains("client secret of sf") == true)
    }

    @Test("Should report a damaged row as unreadable and leave it in place, byte for byte")
    func damagedRow() async throws {
        let (scratch, _) = try await ScratchDatabase.filled()
        let other = try scratch.connection()
        let select = "SELECT sealed FROM sessions WHERE user = 'carol'"
        var damaged = try #require(
            try other.statement(select, "reading").first { row in row.withBlob(0) { Array($0) } })
        damaged[damaged.count / 2] ^= 0x01
        try other.statement("UPDATE sessions SET sealed = ? WHERE user = 'carol'", "damaging").bind(.blob(damaged))
            .run()

        let reopened = try await scratch.open()
        let contents = try await reopened.loadAll()
        #expect(contents.records == Array(Rows.filled.prefix(3)))
        #expect(contents.unreadable.count == 1)
        #expect(contents.unreadable.first?.contains("carol") == true)
        #expect(contents.unreadable.first?.contains("damaged") == true)
        let after = try other.statement(select, "reading").first { row in row.withBlob(0) { Array($0) } }
        #expect(after == damaged, "left as it was")
    }

    @Test("Should refuse to load when no session row opens, rather than start empty")
    func allRowsUnreadable() async throws {
        let (scratch, store) = try await ScratchDatabase.filled()
        try scratch.connection().execute(
            "UPDATE sessions SET sealed = zeroblob(length(sealed))", "damaging every row")
        let error = await #expect(throws: VaultError.self) { _ = try await store.loadAll() }
        #expect(error?.code == .storeFailed)
        #expect(error?.message.contains("none of the 4 sessions") == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("will not start") == true)
    }

    // MARK: Keys

    @Test("Should refuse a database sealed under another key, naming both key ids, and leave it untouched")
    func wrongKey() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        let first = try await scratch.open()
        try await Rows.fill(first)
        try scratch.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)", "checkpointing")
        let before = scratch.bytes("sessions.db")
        try scratch.credential("data-key", keyMaterial(2))
        let sealedUnder = try DataKey(copying: keyMaterial(1), source: "test").id
        let given = try DataKey(copying: keyMaterial(2), source: "test").id
        let error = await #expect(throws: VaultError.self) { _ = try await scratch.open() }
        #expect(error?.code == .storeFailed)
        let message = error?.message ?? ""
        #expect(message.contains(sealedUnder) && message.contains(given), "\(message)")
        #expect(message.contains("will not start"))
        #expect(scratch.bytes("sessions.db") == before)
    }

    @Test("Should say clearly when the credential is missing or is not 32 bytes")
    func badCredential() async throws {
        let missing = try ScratchDatabase()
        try FileManager.default.createDirectory(atPath: missing.credentials, withIntermediateDirectories: true)
        let noKey = await #expect(throws: VaultError.self) { _ = try await missing.open() }
        #expect(noKey?.code == .storeFailed)
        #expect(noKey?.message.contains("data-key is missing from \(missing.credentials)") == true)

        let short = try ScratchDatabase()
        try short.credential("data-key", Array(keyMaterial(1).prefix(31)))
        let shortKey = await #expect(throws: VaultError.self) { _ = try await short.open() }
        #expect(shortKey?.code == .storeFailed)
        #expect(shortKey?.message.contains("holds 31 bytes") == true, "\(shortKey?.message ?? "")")
        #expect(shortKey?.message.contains("exactly 32 random bytes") == true)

        // A database that exists, its key gone: the id it needs and what to do.
        let gone = try ScratchDatabase()
        try gone.credential("data-key", keyMaterial(1))
        _ = try await gone.open()
        try gone.removeCredential("data-key")
        try gone.credential("data-key.previous", keyMaterial(9))
        let goneKey = await #expect(throws: VaultError.self) { _ = try await gone.open() }
        let id = try DataKey(copying: keyMaterial(1), source: "test").id
        let held = try DataKey(copying: keyMaterial(9), source: "test").id
        #expect(goneKey?.message.contains("sealed under data key \(id)") == true, "\(goneKey?.message ?? "")")
        #expect(goneKey?.message.contains("data-key.previous holds key \(held)") == true)
    }

    @Test("Should start normally once the credential is given, after a start that found none")
    func credentialGivenLater() async throws {
        let scratch = try ScratchDatabase()
        try FileManager.default.createDirectory(atPath: scratch.credentials, withIntermediateDirectories: true)
        _ = try? await scratch.open()
        try scratch.credential("data-key", keyMaterial(1))
        let store = try await scratch.open()
        try await store.apply(.save(Rows.record("oauth", "alice")))
        #expect(try await store.loadAll().records == [Rows.record("oauth", "alice")])
    }

    @Test("Should re-seal every row under a rotated credential at open, then need only the new key")
    func resealAtOpen() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        try await Rows.fill(try await scratch.open())
        let old = try DataKey(copying: keyMaterial(1), source: "test").id
        let new = try DataKey(copying: keyMaterial(2), source: "test").id

        try scratch.credential("data-key.previous", keyMaterial(1))
        try scratch.credential("data-key", keyMaterial(2))
        let rotated = try await scratch.open()
        #expect(try await rotated.loadAll().records == Rows.filled)
        let other = try scratch.connection()
        for table in ["sessions", "revocations", "provider_secrets"] {
            let ids = try other.statement(
                "SELECT DISTINCT key_id FROM \(table)", "reading key ids")
            var found: [String] = []
            while try ids.step() { found.append(ids.text(0)) }
            #expect(found == [new], "every row of \(table) under the new key")
        }
        #expect(try other.statement("SELECT value FROM meta WHERE name = 'key_id'", "").first { $0.text(0) } == new)

        try scratch.removeCredential("data-key.previous")
        let later = try await scratch.open()
        #expect(try await later.loadAll().records == Rows.filled)
        #expect(try await later.loadPendingRevocations() == Rows.revocations)
        #expect(try await later.loadProviderSecrets() == Rows.secrets)

        try scratch.credential("data-key", keyMaterial(1))
        let error = await #expect(throws: VaultError.self) { _ = try await scratch.open() }
        #expect(error?.message.contains(new) == true && error?.message.contains(old) == true)
    }

    // MARK: Files that are not vaultd's database

    @Test("Should refuse a file that is not a database, and leave it as it was")
    func notADatabase() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        let text = Array(String(repeating: "not a database, a file of notes\n", count: 200).utf8)
        #expect(
            FileManager.default.createFile(
                atPath: scratch.path, contents: Data(text), attributes: [.posixPermissions: 0o600]))
        let error = await #expect(throws: VaultError.self) { _ = try await scratch.open() }
        #expect(error?.code == .storeFailed)
        #expect(error?.message.contains(scratch.path) == true)
        #expect(error?.message.contains("not a database") == true, "\(error?.message ?? "")")
        #expect(scratch.bytes("sessions.db") == text)
        #expect(scratch.bytes("sessions.db-wal") == nil)
    }

    @Test("Should refuse another program's SQLite database, and leave it as it was")
    func otherProgramsDatabase() async throws {
        let scratch = try ScratchDatabase()
        try scratch.credential("data-key", keyMaterial(1))
        do {
            let other = try scratch.connection()
            try other.execute(
                "CREATE TABLE cookies(host TEXT, value TEXT); INSERT INTO cookies VALUES('example.com', 'x');",
                "making another program's database")
        }
        chmod(scratch.path, 0o600)
        let before = scratch.bytes("sessions.db")
        let error = await #expect(throws: VaultError.self) { _ = try await scratch.open() }
        #expect(error?.code == .storeFailed)
        #expect(error?.message.contains("another program") == true, "\(error?.message ?? "")")
        #expect(scratch.bytes("sessions.db") == before)
        let mode = try scratch.connection().statement("PRAGMA journal_mode", "").first { $0.text(0) }
        #expect(mode == "delete", "its journal mode not changed to WAL")
    }

    // MARK: DataKey and Sealing

    @Test("Should derive a key's id from its bytes alone, and read back its hex form")
    func dataKeyIdentity() throws {
        let one = try DataKey(copying: keyMaterial(7), source: "test")
        let again = try DataKey(copying: keyMaterial(7), source: "elsewhere")
        let other = try DataKey(copying: keyMaterial(8), source: "test")
        #expect(one.id == again.id)
        #expect(one.id != other.id)
        #expect(one.id.count == 16 && one.id.allSatisfy(\.isHexDigit))
        var hex = one.hexDigits()
        defer { hex.wipe() }
        #expect(String(decoding: hex, as: UTF8.self) == keyMaterial(7).map { String(format: "%02x", $0) }.joined())
        #expect(!String(decoding: hex, as: UTF8.self).contains(one.id), "the id is not part of the key")
        #expect(try DataKey.fromHex(hex, source: "test").id == one.id)
        #expect(DataKey.random().id != DataKey.random().id)

        let short = #expect(throws: VaultError.self) {
            _ = try DataKey.fromHex(Array(hex.dropLast()), source: "the item")
        }
        #expect(short?.message.contains("not 64 hex digits") == true)
        var upper = hex
        upper[0] = UInt8(ascii: "G")
        #expect(throws: VaultError.self) { _ = try DataKey.fromHex(upper, source: "the item") }
    }

    @Test("Should open what it sealed, and nothing that was changed, moved or sealed under another key")
    func sealingVectors() throws {
        let key = try DataKey(copying: keyMaterial(3), source: "test")
        let data = Sealing.associatedData(["session", "oauth", "alice", "1000"])
        for size in [0, 1, 17, 4096] {
            let plaintext = (0..<size).map { UInt8(truncatingIfNeeded: $0 &* 31) }
            let sealed = Sealing.seal(plaintext, associatedData: data, key: key)
            #expect(sealed.count == plaintext.count + Sealing.overhead)
            #expect(sealed.withUnsafeBytes { Sealing.open($0, associatedData: data, key: key) } == plaintext)
            #expect(Sealing.seal(plaintext, associatedData: data, key: key) != sealed, "a fresh nonce every time")
        }
        let plaintext = Array("a session record".utf8)
        let sealed = Sealing.seal(plaintext, associatedData: data, key: key)
        func opens(_ bytes: [UInt8], _ ad: [UInt8] = data, _ key: DataKey = key) -> Bool {
            bytes.withUnsafeBytes { Sealing.open($0, associatedData: ad, key: key) } != nil
        }
        for (name, index) in [
            ("nonce", 0), ("nonce end", Sealing.nonceBytes - 1), ("ciphertext", Sealing.nonceBytes + 3),
            ("tag", sealed.count - 1),
        ] {
            var tampered = sealed
            tampered[index] ^= 0x80
            #expect(!opens(tampered), "a changed \(name) byte")
        }
        #expect(!opens(Array(sealed.dropLast())), "truncated")
        #expect(!opens(Array(sealed.prefix(Sealing.overhead - 1))), "shorter than nonce and tag")
        #expect(!opens(sealed, Sealing.associatedData(["session", "oauth", "alice", "1001"])), "another owner")
        #expect(!opens(sealed, Sealing.associatedData(["session", "oauth", "bob", "1000"])), "another account")
        #expect(!opens(sealed, [], key), "no associated data")
        #expect(!opens(sealed, data, try DataKey(copying: keyMaterial(4), source: "test")), "another key")
        #expect(opens(sealed))
        #expect(Sealing.associatedData(["ab", "c"]) != Sealing.associatedData(["a", "bc"]))
        #expect(Sealing.associatedData(["a", ""]) != Sealing.associatedData(["a"]))
    }
}
