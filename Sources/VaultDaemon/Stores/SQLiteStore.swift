import Dispatch
import Glibc
import Synchronization
import Varlink
import VaultCore
import VaultSystem

/// Session records in one SQLite database (`[Vault] Store=sqlite`), every
/// record, queued revocation and client secret sealed under a data key
/// (`DataKey`, XChaCha20-Poly1305) bound to its account: for hosts that
/// carry more sessions than a keyring file can take (gnome-keyring rewrites
/// its whole file on every write).
///
/// The database is in WAL mode with `synchronous=FULL`: a write is on disk
/// when its call returns, which is when vaultd acknowledges the change. Only
/// sealed bytes are written; temporary tables stay in memory. Calls run one
/// at a time on the store's lane of `BlockingExecutor.store`, never on the
/// cooperative pool.
public final class SQLiteStore: SessionStore, @unchecked Sendable {
    /// The format of the tables, kept in `PRAGMA user_version`.
    static let formatVersion: Int64 = 1
    /// `PRAGMA application_id`: "vltd", so that `file` and vaultd know the file.
    static let applicationID: Int64 = 0x766c_7464

    /// The database file.
    public let path: String
    /// One line for logs: the file and where its key came from.
    public var location: String { currentLocation.withLock { $0 } }
    /// Set at open and again when the rows are sealed under another key.
    private let currentLocation: Mutex<String>
    /// Where the key came from, for `location`.
    private let keySource: String
    // Touched on the store's lane only (and in `open`, before any call).
    private let database: SQLiteDatabase
    private var key: DataKey
    private let timeoutSeconds: Int64
    /// The database's exclusive lock (`DatabaseLock`), held as long as the
    /// store lives; nil for a reader (`openForReading`).
    private let lock: DatabaseLock?

    private init(
        database: SQLiteDatabase, key: DataKey, keySource: String, timeoutSeconds: Int64, lock: DatabaseLock?
    ) {
        self.database = database
        self.lock = lock
        self.path = database.path
        self.key = key
        self.timeoutSeconds = timeoutSeconds
        self.keySource = keySource
        self.currentLocation = Mutex(SQLiteStore.describe(database.path, key: key, keySource: keySource))
    }

    private static func describe(_ path: String, key: DataKey, keySource: String) -> String {
        "SQLite database \(path), key \(key.id) from the \(keySource)"
    }

    /// The default database: `$STATE_DIRECTORY/sessions.db` under systemd,
    /// `/var/lib/vaultd/sessions.db` for root, else
    /// `$XDG_STATE_HOME/vaultd/sessions.db` (`~/.local/state/vaultd/sessions.db`).
    public static func defaultPath(environment: [String: String], uid: UInt32, home: String?) -> String? {
        if let state = environment["STATE_DIRECTORY"], !state.isEmpty {
            // systemd may pass several, separated by ':'; the first is vaultd's.
            return String(state.split(separator: ":").first ?? Substring(state)) + "/sessions.db"
        }
        if uid == 0 { return "/var/lib/vaultd/sessions.db" }
        if let xdg = environment["XDG_STATE_HOME"], xdg.hasPrefix("/") { return xdg + "/vaultd/sessions.db" }
        guard let home, home.hasPrefix("/") else { return nil }
        return home + "/.local/state/vaultd/sessions.db"
    }

    /// Opens (or creates) the database at `path` and finds its key in
    /// `keys`: a new database is sealed under the source's key (created if
    /// need be); an existing one under the key it names, which must be
    /// there — vaultd never starts empty over a database it cannot read.
    /// When the source prefers another key (a rotated credential), every
    /// row is sealed again under it, in one transaction, before the first call.
    /// The database's `DatabaseLock` is taken first (a second vaultd, or a
    /// rotation or migration under way, makes this refuse), unless the caller
    /// holds it already and passes it as `lock`.
    public static func open(
        path: String, keys: any DataKeySource, timeoutSeconds: Int64, log: Logger, lock: DatabaseLock? = nil
    ) async throws(VaultError) -> SQLiteStore {
        try prepareFile(path)
        let held: DatabaseLock
        if let lock { held = lock } else { held = try DatabaseLock.acquire(for: path) }
        let database = try SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds)
        let storedKeyID = try setUp(database)
        let key: DataKey
        if let storedKeyID {
            key = try await storedKey(storedKeyID, of: path, in: keys)
        } else {
            key = try await keys.keyForNewDatabase()
            try createTables(database, keyID: key.id)
        }
        let store = SQLiteStore(
            database: database, key: key, keySource: keys.description, timeoutSeconds: timeoutSeconds, lock: held)
        if let preferred = try await keys.preferredKey(), preferred.id != key.id {
            let count = try store.reseal(to: preferred)
            log.notice(
                "sealed the session database under the new data key",
                ["database": path, "from": key.id, "to": preferred.id, "rows": String(count)])
        }
        return store
    }

    /// Opens an existing database to read it beside the vaultd that serves
    /// it: read-only, without its lock (a WAL reader never blocks the
    /// writer), never creating, re-sealing or changing anything. For tests
    /// and tools that look at what vaultd stored; its writes fail.
    public static func openForReading(path: String, keys: any DataKeySource, timeoutSeconds: Int64)
        async throws(VaultError) -> SQLiteStore
    {
        guard Files.exists(path) else {
            throw VaultError(.storeFailed, "there is no session database at \(path)")
        }
        let database = try SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds, readOnly: true)
        guard let storedKeyID = try inspect(database) else {
            throw VaultError(.storeFailed, "the session database \(path) holds no tables yet")
        }
        let key = try await storedKey(storedKeyID, of: path, in: keys)
        return SQLiteStore(
            database: database, key: key, keySource: keys.description, timeoutSeconds: timeoutSeconds, lock: nil)
    }

    /// The key `id` an existing database names, from `keys`, or an error
    /// saying what the source holds instead.
    private static func storedKey(_ id: String, of path: String, in keys: any DataKeySource)
        async throws(VaultError) -> DataKey
    {
        guard let key = try await keys.key(id: id) else {
            throw VaultError(
                .storeFailed,
                "the session database \(path) is sealed under data key \(id), and \(await keys.missingKeyAdvice(id: id)); vaultd will not start over sessions it cannot read"
            )
        }
        return key
    }

    /// Creates the database's directory (0700) when missing, and checks an
    /// existing file: a regular file of this user, not a link, mode 0600
    /// (tightened when wider).
    private static func prepareFile(_ path: String) throws(VaultError) {
        let directory = String(path[..<(path.lastIndex(of: "/") ?? path.startIndex)])
        if !directory.isEmpty { try makeDirectories(directory) }
        let fd = Glibc.open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw VaultError(.storeFailed, "cannot open the session database \(path): \(SystemError("open"))")
        }
        defer { Glibc.close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, st.st_mode & S_IFMT == S_IFREG else {
            throw VaultError(.storeFailed, "the session database \(path) is not a regular file")
        }
        guard st.st_uid == geteuid() else {
            throw VaultError(
                .storeFailed,
                "the session database \(path) belongs to uid \(st.st_uid), not to vaultd's uid \(geteuid()); give it to vaultd's user or choose another Database="
            )
        }
        if st.st_mode & 0o077 != 0 { fchmod(fd, 0o600) }
    }

    /// `mkdir -p` with mode 0700 for what it creates.
    static func makeDirectories(_ directory: String) throws(VaultError) {
        var current = ""
        for component in directory.split(separator: "/") {
            current += "/" + component
            if mkdir(current, 0o700) != 0 && errno != EEXIST {
                throw VaultError(
                    .storeFailed,
                    "cannot create the directory \(current) for the session database: \(SystemError("mkdir"))"
                )
            }
        }
    }

    /// Sets the connection up and returns the id of the key an existing
    /// database is sealed under; nil for a new one, whose tables
    /// `createTables` makes once its key is known.
    private static func setUp(_ database: SQLiteDatabase) throws(VaultError) -> String? {
        let keyID = try inspect(database)
        try database.execute(
            """
            PRAGMA journal_mode = WAL;
            PRAGMA synchronous = FULL;
            PRAGMA temp_store = MEMORY;
            PRAGMA secure_delete = ON;
            PRAGMA foreign_keys = OFF;
            """, "setting the database up")
        return keyID
    }

    /// Checks that the file is a database of vaultd's, of this format, and
    /// returns the id of its key; nil when it has no tables yet (new).
    private static func inspect(_ database: SQLiteDatabase) throws(VaultError) -> String? {
        let path = database.path
        // A file that is not a database fails here, before anything is written to it.
        let application = try database.pragma("application_id")
        let version = try database.pragma("user_version")
        let tableCount =
            try database.statement("SELECT count(*) FROM sqlite_schema WHERE type = 'table'", "reading the schema")
            .first { $0.int(0) } ?? 0
        if tableCount > 0 || application != 0 || version != 0 {
            guard application == applicationID else {
                throw VaultError(
                    .storeFailed,
                    "\(path) is an SQLite database of another program, not vaultd's; choose another Database=")
            }
            guard version == formatVersion else {
                throw VaultError(
                    .storeFailed,
                    "the session database \(path) has format \(version), and this vaultd reads format \(formatVersion); run the vaultd that wrote it"
                )
            }
        }
        if tableCount == 0 { return nil }
        guard
            let keyID = try database.statement("SELECT value FROM meta WHERE name = 'key_id'", "reading the key id")
                .first({ $0.text(0) })
        else {
            throw VaultError(.storeFailed, "the session database \(path) names no data key; restore it from a backup")
        }
        return keyID
    }

    /// Creates the tables of a new database and records its key, in one
    /// transaction: a start that fails to get a key leaves an empty file,
    /// which the next start takes as new, never tables without a key.
    private static func createTables(_ database: SQLiteDatabase, keyID: String) throws(VaultError) {
        try database.transaction("creating the tables") { () throws(VaultError) in
            try database.execute(
                """
                CREATE TABLE meta(name TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL);
                CREATE TABLE sessions(
                    provider TEXT NOT NULL, user TEXT NOT NULL, owner_uid INTEGER NOT NULL,
                    key_id TEXT NOT NULL, sealed BLOB NOT NULL,
                    PRIMARY KEY(provider, user, owner_uid));
                CREATE TABLE revocations(
                    id TEXT PRIMARY KEY NOT NULL, provider TEXT NOT NULL, user TEXT NOT NULL,
                    key_id TEXT NOT NULL, sealed BLOB NOT NULL);
                CREATE TABLE provider_secrets(
                    provider TEXT PRIMARY KEY NOT NULL, key_id TEXT NOT NULL, sealed BLOB NOT NULL);
                PRAGMA application_id = \(applicationID);
                PRAGMA user_version = \(formatVersion);
                """, "creating the tables")
            try database.statement(
                "INSERT INTO meta(name, value) VALUES('key_id', ?)", "recording the data key"
            ).bind(.text(keyID)).run()
        }
    }

    // MARK: Sealing

    private static func sessionData(_ account: Account, owner: UInt32) -> [UInt8] {
        Sealing.sessionData(account, owner: String(owner))
    }

    private static func revocationData(_ id: String, _ account: Account) -> [UInt8] {
        Sealing.revocationData(id, account)
    }

    private static func providerSecretData(_ provider: String) -> [UInt8] {
        Sealing.providerSecretData(provider)
    }

    /// The plaintext of the row's sealed column (the one after `keyColumn`),
    /// checked against the row's key id first: nil for a row sealed under
    /// another key than `key` (the store's, unless given), or damaged.
    private func open(
        _ statement: SQLiteDatabase.Statement, keyColumn: Int32, associatedData: [UInt8], key: DataKey? = nil
    ) -> [UInt8]? {
        let key = key ?? self.key
        let keyID = statement.text(keyColumn)
        return statement.withBlob(keyColumn + 1) {
            Sealing.open($0, keyID: keyID, associatedData: associatedData, key: key)
        }
    }

    // MARK: Calls (on the store's lane)

    /// Runs `body` on the store's lane (one call at a time); a call that
    /// waited the whole timeout for its turn never starts.
    private func perform<T: Sendable>(_ what: String, _ body: @escaping @Sendable () throws(VaultError) -> T)
        async throws(VaultError) -> T
    {
        let deadline = Monotonic.milliseconds() + UInt64(timeoutSeconds) * 1000
        let result = await BlockingExecutor.store.run(lane: "sqlite", cap: 1, deadline: deadline) {
            () -> Result<T, VaultError> in
            do throws(VaultError) { return .success(try body()) } catch { return .failure(error) }
        }
        guard let result else {
            throw VaultError(
                .storeUnavailable,
                "\(what) waited \(timeoutSeconds)s for the calls before it and was abandoned (\(location)); check the disk the database is on"
            )
        }
        return try result.get()
    }

    public func loadAll() async throws(VaultError) -> StoreContents {
        try await perform("reading sessions") { () throws(VaultError) -> StoreContents in
            // Opening and decoding the rows is most of a start-up with many
            // sessions: a large store is read in parts, one per CPU, each on
            // a connection of its own (WAL lets readers run side by side).
            var databases = [self.database]
            let largest =
                try self.database.statement("SELECT max(rowid) FROM sessions", "reading sessions")
                .first { $0.int(0) } ?? 0
            // Only while the store holds the lock: no writer runs between the
            // parts' snapshots (a store opened for reading has no lock).
            if self.lock != nil, largest >= Self.rowsPerReader {
                let wanted = min(Int(largest / Self.rowsPerReader), Self.processorCount, 4)
                for _ in 1..<max(wanted, 1) {
                    guard
                        let reader = try? SQLiteDatabase(
                            path: self.path, timeoutSeconds: self.timeoutSeconds, readOnly: true)
                    else { break }
                    databases.append(reader)
                }
            }
            let parts = databases.count
            var results = [Result<StoreContents, VaultError>](
                repeating: .success(StoreContents(records: [], unreadable: [])), count: parts)
            let readers = ConcurrentParts(databases)
            results.withUnsafeMutableBufferPointer { buffer in
                let results = ConcurrentParts(buffer)
                DispatchQueue.concurrentPerform(iterations: parts) { part in
                    results.value[part] = Result { () throws(VaultError) in
                        try self.readSessions(from: readers.value[part], part: part, of: parts)
                    }
                }
            }
            var contents = try results[0].get()
            for result in results.dropFirst() {
                let more = try result.get()
                contents.records = Self.merged(contents.records, more.records)
                contents.unreadable += more.unreadable
            }
            if contents.records.isEmpty, !contents.unreadable.isEmpty {
                throw VaultError(
                    .storeFailed,
                    "none of the \(contents.unreadable.count) sessions in \(self.path) could be opened with data key \(self.key.id) (first: \(contents.unreadable[0])); vaultd will not start over sessions it cannot read: restore the database or its key from a backup"
                )
            }
            return contents
        }
    }

    /// A store is read in parts from this many rows on.
    static let rowsPerReader: Int64 = 4096

    static let processorCount = max(Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))), 1)

    /// The sessions whose rowid is `part` modulo `parts`, in key order.
    private func readSessions(from database: SQLiteDatabase, part: Int, of parts: Int) throws(VaultError)
        -> StoreContents
    {
        var contents = StoreContents(records: [], unreadable: [])
        let rows = try database.statement(
            """
            SELECT provider, user, owner_uid, key_id, sealed FROM sessions WHERE (rowid % ?1 + ?1) % ?1 = ?2
            ORDER BY provider, user, owner_uid
            """, "reading sessions"
        ).bind(.int(Int64(parts)), .int(Int64(part)))
        while try rows.step() {
            let account = Account(provider: rows.text(0), user: rows.text(1))
            let owner = UInt32(truncatingIfNeeded: rows.int(2))
            guard var plaintext = open(rows, keyColumn: 3, associatedData: Self.sessionData(account, owner: owner))
            else {
                contents.unreadable.append(
                    "session \(account) of uid \(owner) in \(path) (damaged, or sealed under another key)")
                continue
            }
            defer { plaintext.wipe() }
            guard
                let record = plaintext.withUnsafeBufferPointer({ try? SessionRecord(storedDocument: $0) }),
                record.account == account, record.ownerUID == owner
            else {
                contents.unreadable.append("session \(account) of uid \(owner) in \(path) (not a session record)")
                continue
            }
            contents.records.append(record)
        }
        return contents
    }

    /// Two lists of records in the order of the sessions' primary key
    /// (SQLite's: bytes of provider, of user, then the uid), as one.
    private static func merged(_ a: [SessionRecord], _ b: [SessionRecord]) -> [SessionRecord] {
        // Bytes, not Swift's `==`, which finds two spellings of "é" equal.
        func precedes(_ x: SessionRecord, _ y: SessionRecord) -> Bool {
            if !x.account.provider.utf8.elementsEqual(y.account.provider.utf8) {
                return x.account.provider.utf8.lexicographicallyPrecedes(y.account.provider.utf8)
            }
            if !x.account.user.utf8.elementsEqual(y.account.user.utf8) {
                return x.account.user.utf8.lexicographicallyPrecedes(y.account.user.utf8)
            }
            return x.ownerUID < y.ownerUID
        }
        var out: [SessionRecord] = []
        out.reserveCapacity(a.count + b.count)
        var i = 0
        var j = 0
        while i < a.count, j < b.count {
            if precedes(b[j], a[i]) {
                out.append(b[j])
                j += 1
            } else {
                out.append(a[i])
                i += 1
            }
        }
        out += a[i...]
        out += b[j...]
        return out
    }

    public func save(_ record: SessionRecord) async throws(VaultError) {
        try await perform("writing \(record.account)") { () throws(VaultError) in try self.insert(record) }
    }

    private func insert(_ record: SessionRecord) throws(VaultError) {
        let what = "writing \(record.account)"
        var document = record.storedJSON().serialized()
        defer { document.wipe() }
        let sealed = Sealing.seal(
            document, associatedData: Self.sessionData(record.account, owner: record.ownerUID), key: key)
        try database.statement(
            """
            INSERT INTO sessions(provider, user, owner_uid, key_id, sealed) VALUES(?, ?, ?, ?, ?)
            ON CONFLICT(provider, user, owner_uid) DO UPDATE SET key_id = excluded.key_id, sealed = excluded.sealed
            """, what
        ).bind(
            .text(record.account.provider), .text(record.account.user), .int(Int64(record.ownerUID)),
            .text(key.id), .blob(sealed)
        ).run()
    }

    public func delete(_ key: SessionKey) async throws(VaultError) {
        let what = "deleting \(key)"
        try await perform(what) { () throws(VaultError) in
            try self.database.statement("DELETE FROM sessions WHERE provider = ? AND user = ? AND owner_uid = ?", what)
                .bind(.text(key.account.provider), .text(key.account.user), .int(Int64(key.owner))).run()
        }
    }

    public func saveProviderSecret(_ provider: String, _ secret: Secret) async throws(VaultError) {
        try await perform("writing the client secret of \(provider)") { () throws(VaultError) in
            try self.insertProviderSecret(provider, secret)
        }
    }

    private func insertProviderSecret(_ provider: String, _ secret: Secret) throws(VaultError) {
        var bytes = Array(secret.revealed.utf8)
        defer { bytes.wipe() }
        let sealed = Sealing.seal(bytes, associatedData: Self.providerSecretData(provider), key: key)
        try database.statement(
            "INSERT OR REPLACE INTO provider_secrets(provider, key_id, sealed) VALUES(?, ?, ?)",
            "writing the client secret of \(provider)"
        ).bind(.text(provider), .text(key.id), .blob(sealed)).run()
    }

    public func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        let what = "reading the client secret of \(provider)"
        return try await perform(what) { () throws(VaultError) -> Secret? in
            let row = try self.database.statement(
                "SELECT key_id, sealed FROM provider_secrets WHERE provider = ?", what
            ).bind(.text(provider))
            guard
                let opened = try row.first({
                    self.open($0, keyColumn: 0, associatedData: Self.providerSecretData(provider))
                })
            else { return nil }
            guard var plaintext = opened else {
                throw VaultError(
                    .storeFailed,
                    "the client secret of \(provider) in \(self.path) cannot be opened (damaged, or sealed under another key); store it again with vaultctl"
                )
            }
            defer { plaintext.wipe() }
            return Secret(String(decoding: plaintext, as: UTF8.self))
        }
    }

    public func savePendingRevocation(_ revocation: PendingRevocation) async throws(VaultError) {
        try await perform("queueing the revocation of \(revocation.record.account)") { () throws(VaultError) in
            try self.insert(revocation)
        }
    }

    private func insert(_ revocation: PendingRevocation) throws(VaultError) {
        let account = revocation.record.account
        var document = revocation.storedJSON().serialized()
        defer { document.wipe() }
        let sealed = Sealing.seal(document, associatedData: Self.revocationData(revocation.id, account), key: key)
        try database.statement(
            "INSERT OR REPLACE INTO revocations(id, provider, user, key_id, sealed) VALUES(?, ?, ?, ?, ?)",
            "queueing the revocation of \(account)"
        ).bind(.text(revocation.id), .text(account.provider), .text(account.user), .text(key.id), .blob(sealed))
            .run()
    }

    /// Writes every record, queued revocation and client secret given in
    /// one transaction: all of them are stored, or (on any error) none.
    /// For migrations and for seeding a benchmark's store.
    public func importContents(
        records: [SessionRecord], revocations: [PendingRevocation], providerSecrets: [String: Secret]
    ) async throws(VaultError) {
        try await perform("importing \(records.count) sessions") { () throws(VaultError) in
            try self.database.transaction("importing \(records.count) sessions") { () throws(VaultError) in
                for record in records { try self.insert(record) }
                for revocation in revocations { try self.insert(revocation) }
                for (provider, secret) in providerSecrets.sorted(by: { $0.key < $1.key }) {
                    try self.insertProviderSecret(provider, secret)
                }
            }
        }
    }

    /// Every stored client secret, by provider (for migrations).
    public func loadProviderSecrets() async throws(VaultError) -> [String: Secret] {
        let providers = try await perform("listing client secrets") { () throws(VaultError) -> [String] in
            let rows = try self.database.statement(
                "SELECT provider FROM provider_secrets ORDER BY provider", "listing client secrets")
            var providers: [String] = []
            while try rows.step() { providers.append(rows.text(0)) }
            return providers
        }
        var secrets: [String: Secret] = [:]
        for provider in providers { secrets[provider] = try await loadProviderSecret(provider) }
        return secrets
    }

    public func deletePendingRevocation(_ revocation: PendingRevocation) async throws(VaultError) {
        let what = "removing the queued revocation of \(revocation.record.account)"
        try await perform(what) { () throws(VaultError) in
            try self.database.statement("DELETE FROM revocations WHERE id = ?", what).bind(.text(revocation.id)).run()
        }
    }

    /// Every queued revocation, in account order; one that cannot be opened
    /// is left in place (it may be restored with its key) and skipped.
    public func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await perform("reading queued revocations") { () throws(VaultError) -> [PendingRevocation] in
            var revocations: [PendingRevocation] = []
            let rows = try self.database.statement(
                "SELECT id, provider, user, key_id, sealed FROM revocations ORDER BY provider, user, id",
                "reading queued revocations")
            while try rows.step() {
                let id = rows.text(0)
                let account = Account(provider: rows.text(1), user: rows.text(2))
                guard var plaintext = self.open(rows, keyColumn: 3, associatedData: Self.revocationData(id, account))
                else { continue }
                defer { plaintext.wipe() }
                guard let json = try? JSON.parse(plaintext),
                    let revocation = try? PendingRevocation(storedJSON: json), revocation.id == id,
                    revocation.record.account == account
                else { continue }
                revocations.append(revocation)
            }
            return revocations
        }
    }

    /// Folds the write-ahead log into the database file and empties it, so
    /// that `sessions.db` alone holds every session while vaultd is stopped
    /// (a backup copies one file). A failure is harmless: the log stays and
    /// SQLite reads it at the next open.
    public func close() async {
        _ = try? await perform("checkpointing the database") { () throws(VaultError) in
            try self.database.execute("PRAGMA wal_checkpoint(TRUNCATE)", "checkpointing the database")
        }
    }

    // MARK: Keys

    /// Seals every row again under `newKey`, in one transaction (a crash
    /// leaves every row under the old key or every row under the new), and
    /// records the new key's id; returns the number of rows. Rows that do
    /// not open under the current key are left as they are.
    @discardableResult
    func reseal(to newKey: DataKey) throws(VaultError) -> Int {
        let what = "sealing the database under data key \(newKey.id)"
        let oldKey = key
        let count = try database.transaction(what) { () throws(VaultError) -> Int in
            var count = 0
            count += try resealTable(
                select: "SELECT provider, user, owner_uid, key_id, sealed FROM sessions",
                keyColumn: 3,
                update: "UPDATE sessions SET key_id = ?, sealed = ? WHERE provider = ? AND user = ? AND owner_uid = ?",
                what: what, old: oldKey, new: newKey
            ) { row in
                let account = Account(provider: row.text(0), user: row.text(1))
                let owner = row.int(2)
                return (
                    Self.sessionData(account, owner: UInt32(truncatingIfNeeded: owner)),
                    [.text(account.provider), .text(account.user), .int(owner)]
                )
            }
            count += try resealTable(
                select: "SELECT id, provider, user, key_id, sealed FROM revocations", keyColumn: 3,
                update: "UPDATE revocations SET key_id = ?, sealed = ? WHERE id = ?", what: what, old: oldKey,
                new: newKey
            ) { row in
                (
                    Self.revocationData(row.text(0), Account(provider: row.text(1), user: row.text(2))),
                    [.text(row.text(0))]
                )
            }
            count += try resealTable(
                select: "SELECT provider, key_id, sealed FROM provider_secrets", keyColumn: 1,
                update: "UPDATE provider_secrets SET key_id = ?, sealed = ? WHERE provider = ?", what: what,
                old: oldKey, new: newKey
            ) { row in (Self.providerSecretData(row.text(0)), [.text(row.text(0))]) }
            try database.statement("INSERT OR REPLACE INTO meta(name, value) VALUES('key_id', ?)", what)
                .bind(.text(newKey.id)).run()
            return count
        }
        key = newKey
        currentLocation.withLock { $0 = SQLiteStore.describe(path, key: newKey, keySource: keySource) }
        return count
    }

    private func resealTable(
        select: String, keyColumn: Int32, update: String, what: String, old: DataKey, new: DataKey,
        identify: (SQLiteDatabase.Statement) -> ([UInt8], [SQLiteDatabase.Value])
    ) throws(VaultError) -> Int {
        // Read first, then write: a statement must not step over rows it changes.
        var resealed: [(sealed: [UInt8], where: [SQLiteDatabase.Value])] = []
        let rows = try database.statement(select, what)
        while try rows.step() {
            let (associatedData, identity) = identify(rows)
            guard var plaintext = open(rows, keyColumn: keyColumn, associatedData: associatedData, key: old)
            else { continue }
            defer { plaintext.wipe() }
            resealed.append((Sealing.seal(plaintext, associatedData: associatedData, key: new), identity))
        }
        for row in resealed {
            let statement = try database.statement(update, what)
            try statement.bind(.text(new.id), .blob(row.sealed))
            for (offset, value) in row.where.enumerated() {
                try statement.bind(at: Int32(offset + 3), value)
            }
            try statement.run()
        }
        return resealed.count
    }

    /// Rotates to a new key from `keys` (`vaultd --rotate-key`): the new key
    /// is kept by the source first, then every row is sealed again under it
    /// in one transaction, then the source forgets the old one. A crash
    /// between the steps leaves a database sealed under a key the source
    /// still holds.
    public func rotate(keys: any DataKeySource) async throws(VaultError) -> (from: String, to: String, rows: Int) {
        let old = key
        let next = try await keys.keyToRotateTo(from: old)
        let rows = try await perform("rotating the data key") { () throws(VaultError) -> Int in
            try self.reseal(to: next)
        }
        try await keys.retireKeys(except: next)
        return (old.id, next.id, rows)
    }
}

/// What the iterations of `DispatchQueue.concurrentPerform` in `loadAll`
/// share: each touches only the element of its own part (its connection, its
/// result), so no two use one element at once.
private struct ConcurrentParts<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
