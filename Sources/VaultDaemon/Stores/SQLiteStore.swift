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
/// at a time on `WorkerPool`'s store worker, never on the
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
    /// The file and its key, with the Secret Service's remedy (the key's usual home).
    public var profile: StoreProfile { StoreProfile(location: location) }
    /// Set at open and again when the rows are sealed under another key.
    let currentLocation: Mutex<String>
    /// Where the key came from, for `location`.
    let keySource: String
    // Touched on the store's lane only (and in `open`, before any call).
    let database: SQLiteDatabase
    var key: DataKey
    let timeoutSeconds: Int64
    /// The database's exclusive lock (`DatabaseLock`), held as long as the
    /// store lives; nil for a reader (`openForReading`).
    let lock: DatabaseLock?
    /// Calls run on the caller's thread, not on the store's lane: for the
    /// simulation, whose one thread must decide every order.
    let callsInline: Bool

    private init(
        database: SQLiteDatabase, key: DataKey, keySource: String, timeoutSeconds: Int64, lock: DatabaseLock?,
        callsInline: Bool = false
    ) {
        self.callsInline = callsInline
        self.database = database
        self.lock = lock
        self.path = database.path
        self.key = key
        self.timeoutSeconds = timeoutSeconds
        self.keySource = keySource
        self.currentLocation = Mutex(SQLiteStore.describe(database.path, key: key, keySource: keySource))
    }

    static func describe(_ path: String, key: DataKey, keySource: String) -> String {
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
    /// holds it already and passes it as `lock`. With `callsInline`, calls
    /// run on the caller's thread (the simulation's), not the store's lane.
    public static func open(
        path: String, keys: any DataKeySource, timeoutSeconds: Int64, log: Logger, lock: DatabaseLock? = nil,
        callsInline: Bool = false
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
            database: database, key: key, keySource: keys.description, timeoutSeconds: timeoutSeconds, lock: held,
            callsInline: callsInline)
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

    // MARK: Sealing

    /// A session's associated data: its account and owner, by uid (one host's database).
    static func sessionData(_ account: Account, owner: UInt32) -> [UInt8] {
        Sealing.sessionData(account, owner: String(owner))
    }

    /// The plaintext of the row's sealed column (the one after `keyColumn`),
    /// checked against the row's key id first: nil for a row sealed under
    /// another key than `key` (the store's, unless given), or damaged.
    func open(
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
    func perform<T: Sendable>(_ what: String, _ body: @escaping @Sendable () throws(VaultError) -> T)
        async throws(VaultError) -> T
    {
        if callsInline { return try body() }
        let deadline = Monotonic.milliseconds() + UInt64(timeoutSeconds) * 1000
        let result = await WorkerPool.shared.run(.store, lane: "sqlite", cap: 1, deadline: deadline) {
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

    public func apply(_ change: StoreChange) async throws(VaultError) {
        let what = change.summary
        try await perform(what) { () throws(VaultError) in
            switch change {
            case .save(let record): try self.insert(record)
            case .delete(let key):
                try self.database.statement(
                    "DELETE FROM sessions WHERE provider = ? AND user = ? AND owner_uid = ?", what
                ).bind(.text(key.account.provider), .text(key.account.user), .int(Int64(key.owner))).run()
            case .saveProviderSecret(let provider, let secret): try self.insertProviderSecret(provider, secret)
            case .savePendingRevocation(let revocation): try self.insert(revocation)
            case .deletePendingRevocation(let revocation):
                try self.database.statement("DELETE FROM revocations WHERE id = ?", what).bind(.text(revocation.id))
                    .run()
            }
        }
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

    private func insertProviderSecret(_ provider: String, _ secret: Secret) throws(VaultError) {
        var bytes = Array(secret.revealed.utf8)
        defer { bytes.wipe() }
        let sealed = Sealing.seal(bytes, associatedData: Sealing.providerSecretData(provider), key: key)
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
                    self.open($0, keyColumn: 0, associatedData: Sealing.providerSecretData(provider))
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

    private func insert(_ revocation: PendingRevocation) throws(VaultError) {
        let account = revocation.record.account
        var document = revocation.storedJSON().serialized()
        defer { document.wipe() }
        let sealed = Sealing.seal(document, associatedData: Sealing.revocationData(revocation.id, account), key: key)
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
                guard var plaintext = self.open(rows, keyColumn: 3, associatedData: Sealing.revocationData(id, account))
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

    /// Closes the connection, on the store's lane, once the calls before it
    /// ended: a migration opens the file again at once and leaves WAL mode,
    /// which no other connection may hold open. The store takes no call after.
    func closeConnection() async throws(VaultError) {
        try await perform("closing the database") { () throws(VaultError) in self.database.close() }
    }
}
