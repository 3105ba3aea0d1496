import Glibc
import Varlink
import VaultCore
import VaultSystem

/// `vaultd --migrate-store FROM TO`: moves every session record, queued
/// revocation and client secret of one instance from one store engine to the
/// other, so that a kill at any point leaves either the old store whole or
/// the new one whole, and running the same command again finishes the job.
///
/// Both directions hold the database's `DatabaseLock` from start to end, so
/// a vaultd serving the database (or a second migration or rotation) makes
/// the migration refuse, and a vaultd started during it refuses to start.
///
/// **Secret Service → SQLite.** The whole source is read first (an item that
/// cannot be read stops the migration: it would be lost). The target must be
/// absent or an empty vaultd database. The complete new database is built in
/// `DATABASE.migrating` beside the target (one transaction, sealed under the
/// data key as vaultd would), with the meta rows `migrated_from` and
/// `migration_pending` (the list of the migrated items' names: provider,
/// user, owner, revocation id; no secret); it is taken out of WAL mode so the
/// one file holds everything, fsynced, then renamed over the target and the
/// directory fsynced. The rename is the moment the new store takes over:
/// before it, the Secret Service items are untouched and the `.migrating`
/// file is only ever deleted (a rerun starts it again); after it, the
/// database is whole. Then the items named in `migration_pending` are deleted
/// from the Secret Service, and the row is removed. A rerun that finds a
/// target with `migration_pending` only finishes those deletions: items that
/// appeared in the Secret Service since are left there and reported.
///
/// **SQLite → Secret Service.** The database is opened with its key and read
/// whole; a row that cannot be opened stops the migration. The target scope
/// must hold nothing, or only items equal to the database's (the leftover of
/// an interrupted run of this migration). Every item is written (each write
/// replaces the item with the same attributes, so writing twice is
/// harmless), then the scope is read back and compared with the database:
/// the same names and the same contents, or the migration stops with the
/// database in place. Only then is the database checkpointed into its one
/// file and renamed to `DATABASE.removing` (the moment the Secret Service
/// takes over), the directory fsynced, the data key's Secret Service items
/// deleted (when the key came from there; a credential is the service
/// manager's to remove), and the file unlinked. No `.migrated` copy is kept:
/// it would leave every secret in two places, sealed under a key that would
/// have to be kept for it. Deleting the key first makes whatever blocks of
/// the file the disk still holds unreadable. A rerun that finds
/// `DATABASE.removing` finishes these last two steps.
///
/// Nothing decrypted is written to disk on the way: the database only ever
/// holds sealed rows, and the Secret Service keeps its items as it always does.
///
/// Limit: a vaultd on the Secret Service engine holds no database lock; stop
/// it before migrating away from (or into) the Secret Service. The target's
/// emptiness check refuses a scope that already holds other sessions.
public enum StoreMigration {
    /// Everything one instance stores.
    struct Contents: Sendable {
        var records: [SessionRecord] = []
        var revocations: [PendingRevocation] = []
        var secrets: [String: Secret] = [:]

        /// The names of the items (never their contents), sorted.
        var names: [String] {
            (records.map { StoreMigration.name(of: $0.key) } + revocations.map { StoreMigration.name(of: $0) }
                + secrets.keys.map { StoreMigration.name(ofSecret: $0) }).sorted()
        }

        var isEmpty: Bool { records.isEmpty && revocations.isEmpty && secrets.isEmpty }

        var counts: String {
            "\(records.count) sessions, \(revocations.count) queued revocations, \(secrets.count) client secrets"
        }
    }

    /// Suffix of the database being built by a migration to SQLite.
    static let buildingSuffix = ".migrating"
    /// Suffix of the database being removed by a migration away from SQLite.
    static let removingSuffix = ".removing"
    /// The meta row naming the items a migration to SQLite has still to
    /// delete from the Secret Service.
    static let pendingRow = "migration_pending"
    /// The meta row saying where the database's rows came from.
    static let originRow = "migrated_from"

    static func name(of key: SessionKey) -> String {
        JSON.array(["session", .string(key.account.provider), .string(key.account.user), .string(String(key.owner))])
            .text
    }

    static func name(of revocation: PendingRevocation) -> String {
        JSON.array(
            [
                "revocation", .string(revocation.id), .string(revocation.record.account.provider),
                .string(revocation.record.account.user),
            ]
        ).text
    }

    static func name(ofSecret provider: String) -> String { JSON.array(["client-secret", .string(provider)]).text }

    /// Runs the migration `from` → `to` of the instance `selection` names;
    /// returns the lines to print.
    public static func run(from: StoreEngine, to: StoreEngine, selection: StoreSelection, log: Logger)
        throws(VaultError) -> [String]
    {
        guard from != to else {
            throw VaultError(
                .invalidParameter,
                "--migrate-store needs two different engines (secret-service and sqlite), not \(from.rawValue) twice")
        }
        guard from != .etcd, to != .etcd else {
            throw VaultError(
                .invalidParameter,
                "--migrate-store moves sessions between secret-service and sqlite; it does not move them to or from etcd yet"
            )
        }
        let path = try selection.requireDatabasePath()
        return try Daemon.blocking { () async throws(VaultError) -> [String] in
            switch to {
            case .sqlite: return try await toSQLite(path: path, selection: selection, log: log)
            case .secretService: return try await toSecretService(path: path, selection: selection, log: log)
            case .etcd: throw VaultError(.invalidParameter, "--migrate-store does not move sessions to etcd")
            }
        }
    }

    // MARK: Secret Service → SQLite

    static func toSQLite(path: String, selection: StoreSelection, log: Logger) async throws(VaultError) -> [String] {
        try SQLiteStore.makeDirectories(MigrationFiles.directory(of: path))
        let lock = try DatabaseLock.acquire(for: path)
        let keyring = try LibsecretStore.open(timeoutSeconds: selection.timeoutSeconds, scope: selection.scope)
        let source = try await readSecretService(keyring, what: "the source")
        KillPoint.reached("source-read")
        let origin = "secret-service scope \(selection.scope)"

        switch try MigrationTarget.inspect(path, timeoutSeconds: selection.timeoutSeconds) {
        case .absent, .empty:
            break
        case .pending(let names):
            // The database took over in an earlier run: finish the clean-up only.
            let (deleted, left) = try await deleteFromSecretService(
                keyring, source, names: Set(names), path: path, timeoutSeconds: selection.timeoutSeconds)
            return [
                "finished an interrupted migration from the Secret Service (scope \(selection.scope)) to \(path): deleted \(deleted) items left in the Secret Service"
            ] + left
        case .occupied(let counts, let migratedFrom) where migratedFrom == origin && source.isEmpty:
            // A finished migration, run again: nothing is left to do.
            return [
                "nothing to migrate: \(path) holds \(counts), migrated from the Secret Service (scope \(selection.scope)), which holds none of this instance's items"
            ]
        case .occupied(let counts, _):
            throw VaultError(
                .invalidParameter,
                "the target database \(path) already holds \(counts); a migration writes only into an empty store. Move it away first, or migrate it back with --migrate-store sqlite secret-service"
            )
        }

        let building = path + buildingSuffix
        MigrationFiles.removeDatabase(building)  // a crashed run's: never trusted, built again
        let keys = try Daemon.dataKeySource(selection)
        do {
            let store = try await SQLiteStore.open(
                path: building, keys: keys, timeoutSeconds: selection.timeoutSeconds, log: log, lock: lock)
            try await store.importContents(
                records: source.records, revocations: source.revocations, providerSecrets: source.secrets)
            // Closed now, not when its last reference goes (the store's worker may hold it a moment longer).
            try await store.closeConnection()
        }
        KillPoint.reached("target-written")
        try MigrationTarget.seal(
            building, timeoutSeconds: selection.timeoutSeconds,
            rows: [originRow: origin, pendingRow: JSON.array(source.names.map { .string($0) }).text])
        KillPoint.reached("target-synced")
        // An empty database's own WAL must never be applied to the new file.
        for suffix in ["-wal", "-shm", "-journal"] { unlink(path + suffix) }
        guard rename(building, path) == 0 else {
            throw VaultError(
                .storeFailed,
                "cannot rename \(building) to \(path): \(SystemError("rename")); the Secret Service is untouched"
            )
        }
        KillPoint.reached("renamed")
        try MigrationFiles.syncDirectory(of: path)
        KillPoint.reached("directory-synced")
        log.notice(
            "the session database holds the migrated sessions; deleting them from the Secret Service",
            ["database": path, "sessions": String(source.records.count)])
        let (_, left) = try await deleteFromSecretService(
            keyring, source, names: Set(source.names), path: path, timeoutSeconds: selection.timeoutSeconds)
        return [
            "migrated \(source.counts) from the Secret Service (scope \(selection.scope)) to the SQLite database \(path) (data key from the \(keys.description))",
            "deleted them from the Secret Service; set Store=sqlite in [Vault] (or VAULTD_STORE=sqlite) before starting vaultd",
        ] + left
    }

    /// Deletes from the Secret Service the items of `source` whose names are
    /// in `names`, then clears the database's pending row; returns how many
    /// were deleted and lines about the items left.
    private static func deleteFromSecretService(
        _ keyring: LibsecretStore, _ source: Contents, names: Set<String>, path: String, timeoutSeconds: Int64
    ) async throws(VaultError) -> (Int, [String]) {
        var deleted = 0
        var left = 0
        func step() {
            deleted += 1
            if deleted == 1 { KillPoint.reached("source-partly-deleted") }
        }
        for record in source.records {
            guard names.contains(name(of: record.key)) else {
                left += 1
                continue
            }
            try await keyring.apply(.delete(record.key))
            step()
        }
        for revocation in source.revocations {
            guard names.contains(name(of: revocation)) else {
                left += 1
                continue
            }
            try await keyring.apply(.deletePendingRevocation(revocation))
            step()
        }
        for provider in source.secrets.keys.sorted() {
            guard names.contains(name(ofSecret: provider)) else {
                left += 1
                continue
            }
            try await keyring.deleteProviderSecret(provider)
            step()
        }
        KillPoint.reached("source-deleted")
        try MigrationTarget.clearPending(path, timeoutSeconds: timeoutSeconds)
        let note =
            left == 0
            ? []
            : [
                "left \(left) items in the Secret Service that were not part of the migration (stored there after it); they are not in \(path)"
            ]
        return (deleted, note)
    }

    // MARK: SQLite → Secret Service

    static func toSecretService(path: String, selection: StoreSelection, log: Logger) async throws(VaultError)
        -> [String]
    {
        let removing = path + removingSuffix
        guard Files.exists(path) || Files.exists(removing) else {
            // A finished migration, run again: the Secret Service holds the items.
            if let keyring = try? LibsecretStore.open(timeoutSeconds: selection.timeoutSeconds, scope: selection.scope),
                let found = try? await readSecretService(keyring, what: "the target"), !found.isEmpty
            {
                return [
                    "nothing to migrate: there is no database at \(path), and the Secret Service (scope \(selection.scope)) holds \(found.counts)"
                ]
            }
            throw VaultError(
                .invalidParameter,
                "there is no session database at \(path): nothing to migrate (set Database= or VAULTD_DATABASE to the database to migrate)"
            )
        }
        let lock = try DatabaseLock.acquire(for: path)
        let keyring = try LibsecretStore.open(timeoutSeconds: selection.timeoutSeconds, scope: selection.scope)
        let credentialKey = CredentialDataKeys.fromEnvironment() != nil
        guard Files.exists(path) else {
            // The Secret Service took over in an earlier run: finish the removal.
            let keys = try await removeDatabase(removing, keyring: keyring, credentialKey: credentialKey)
            return ["finished an interrupted migration from \(path) to the Secret Service: removed the database"] + keys
        }

        let source: Contents
        var location = ""
        do {
            let keys = try Daemon.dataKeySource(selection)
            let store = try await SQLiteStore.open(
                path: path, keys: keys, timeoutSeconds: selection.timeoutSeconds, log: log, lock: lock)
            location = store.location
            source = try await readSQLite(store, path: path, timeoutSeconds: selection.timeoutSeconds)
            try await store.closeConnection()
        }
        KillPoint.reached("source-read")

        let found = try await readSecretService(keyring, what: "the target")
        guard isLeftover(found, of: source) else {
            throw VaultError(
                .invalidParameter,
                "the Secret Service scope \(selection.scope) already holds \(found.counts), not all of them from \(path); a migration writes only into an empty store. Remove them (vaultctl logout) or choose another StoreScope="
            )
        }

        var written = 0
        func step() {
            written += 1
            if written == 1 { KillPoint.reached("target-partly-written") }
        }
        for record in source.records {
            try await keyring.apply(.save(record))
            step()
        }
        for revocation in source.revocations {
            try await keyring.apply(.savePendingRevocation(revocation))
            step()
        }
        for (provider, secret) in source.secrets.sorted(by: { $0.key < $1.key }) {
            try await keyring.apply(.saveProviderSecret(provider, secret))
            step()
        }
        KillPoint.reached("target-written")
        let readBack = try await readSecretService(keyring, what: "the written items")
        guard isLeftover(readBack, of: source), readBack.names == source.names else {
            throw VaultError(
                .storeFailed,
                "the Secret Service (scope \(selection.scope)) does not read back what was written (\(readBack.counts) read, \(source.counts) written); the database \(path) is untouched: run the migration again"
            )
        }
        KillPoint.reached("target-verified")

        // Every row into the one file, so the rename takes the whole database away.
        try MigrationTarget.seal(path, timeoutSeconds: selection.timeoutSeconds, rows: [:])
        guard rename(path, removing) == 0 else {
            throw VaultError(.storeFailed, "cannot rename \(path) to \(removing): \(SystemError("rename"))")
        }
        KillPoint.reached("renamed")
        try MigrationFiles.syncDirectory(of: path)
        KillPoint.reached("directory-synced")
        let keys = try await removeDatabase(removing, keyring: keyring, credentialKey: credentialKey)
        return [
            "migrated \(source.counts) from the \(location) to the Secret Service (scope \(selection.scope)), and removed the database",
            "set Store=secret-service in [Vault] (or VAULTD_STORE=secret-service) before starting vaultd",
        ] + keys
    }

    /// Deletes the data key's Secret Service items (unless the key is a
    /// credential), then the renamed database; returns lines about the key.
    private static func removeDatabase(_ removing: String, keyring: LibsecretStore, credentialKey: Bool)
        async throws(VaultError) -> [String]
    {
        var lines: [String] = []
        if credentialKey {
            lines.append(
                "the database's key is the credential \(CredentialDataKeys.name): it is no longer needed, remove it from the unit"
            )
        } else {
            let count = try await keyring.deleteDataKeys()
            KillPoint.reached("keys-deleted")
            if count > 0 { lines.append("deleted the database's data key from the Secret Service") }
        }
        MigrationFiles.removeDatabase(removing)
        try MigrationFiles.syncDirectory(of: removing)
        return lines
    }

    /// True when every item of `found` is in `source` with the same contents.
    static func isLeftover(_ found: Contents, of source: Contents) -> Bool {
        let records = Dictionary(source.records.map { ($0.key, $0) }, uniquingKeysWith: { first, _ in first })
        let revocations = Dictionary(source.revocations.map { ($0.id, $0) }, uniquingKeysWith: { first, _ in first })
        return found.records.allSatisfy { records[$0.key] == $0 }
            && found.revocations.allSatisfy { revocations[$0.id] == $0 }
            && found.secrets.allSatisfy { source.secrets[$0.key] == $0.value }
    }

    // MARK: Reading a store whole

    /// Every item of the keyring's scope; an item that cannot be read is an error.
    static func readSecretService(_ keyring: LibsecretStore, what: String) async throws(VaultError) -> Contents {
        let sessions = try await keyring.loadAll()
        guard sessions.unreadable.isEmpty else {
            throw VaultError(
                .storeFailed,
                "\(sessions.unreadable.count) items of \(what) in the Secret Service cannot be read as sessions (first: \(sessions.unreadable[0])); they would be lost: remove them (seahorse, secret-tool clear) and run the migration again"
            )
        }
        return Contents(
            records: sessions.records, revocations: try await keyring.loadPendingRevocations(),
            secrets: try await keyring.loadProviderSecrets())
    }

    /// Every row of the database, each one opened: a row that cannot be
    /// opened stops the migration (it would be lost).
    static func readSQLite(_ store: SQLiteStore, path: String, timeoutSeconds: Int64) async throws(VaultError)
        -> Contents
    {
        let sessions = try await store.loadAll()
        let contents = Contents(
            records: sessions.records, revocations: try await store.loadPendingRevocations(),
            secrets: try await store.loadProviderSecrets())
        let rows = try MigrationTarget.rowCounts(path, timeoutSeconds: timeoutSeconds)
        let opened = (contents.records.count, contents.revocations.count, contents.secrets.count)
        guard sessions.unreadable.isEmpty, rows == opened else {
            throw VaultError(
                .storeFailed,
                "the database \(path) holds \(rows.0) sessions, \(rows.1) queued revocations and \(rows.2) client secrets, and only \(contents.counts) could be opened with its key; they would be lost: restore the database or its key first"
            )
        }
        return contents
    }
}

/// A test hook: `VAULTD_TEST_KILL_AT=STEP` makes a migration or rotation
/// kill itself (SIGKILL, as a crash or a power cut would stop it) when it
/// reaches the step of that name, so tests stop it at every step in turn.
enum KillPoint {
    /// The environment variable naming the step.
    static let variable = "VAULTD_TEST_KILL_AT"

    static func reached(_ step: String) {
        guard Environment.get(variable) == step else { return }
        kill(getpid(), SIGKILL)
    }
}

/// The migration's look at a database file, through a connection of its own
/// (the store's rows stay sealed; only counts, names and meta rows are read).
enum MigrationTarget {
    enum State {
        /// No file, or an empty one.
        case absent
        /// A vaultd database with no rows.
        case empty
        /// The database of a migration to SQLite whose clean-up of the
        /// Secret Service is unfinished: the names of the items to delete.
        case pending([String])
        /// A database with rows: how many, in words, and where they were
        /// migrated from (its `migrated_from` row), if they were.
        case occupied(String, migratedFrom: String?)
    }

    static func inspect(_ path: String, timeoutSeconds: Int64) throws(VaultError) -> State {
        var st = stat()
        guard lstat(path, &st) == 0, st.st_size > 0 || Files.exists(path + "-wal") else { return .absent }
        let database = try SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds)
        guard try database.pragma("application_id") == SQLiteStore.applicationID else {
            throw VaultError(
                .invalidParameter, "\(path) is not a vaultd session database; choose another Database=")
        }
        if let pending = try database.statement(
            "SELECT value FROM meta WHERE name = '\(StoreMigration.pendingRow)'", "reading the migration state"
        ).first({ $0.text(0) }) {
            guard case .array(let items)? = try? JSON.parse(pending) else {
                throw VaultError(.storeFailed, "the migration state in \(path) is damaged")
            }
            return .pending(items.compactMap(\.stringValue))
        }
        let rows = try rowCounts(database)
        if rows == (0, 0, 0) { return .empty }
        let origin = try database.statement(
            "SELECT value FROM meta WHERE name = '\(StoreMigration.originRow)'", "reading the migration state"
        ).first { $0.text(0) }
        return .occupied(
            "\(rows.0) sessions, \(rows.1) queued revocations and \(rows.2) client secrets", migratedFrom: origin)
    }

    static func rowCounts(_ path: String, timeoutSeconds: Int64) throws(VaultError) -> (Int, Int, Int) {
        try rowCounts(SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds))
    }

    private static func rowCounts(_ database: SQLiteDatabase) throws(VaultError) -> (Int, Int, Int) {
        func count(_ table: String) throws(VaultError) -> Int {
            Int(
                try database.statement("SELECT count(*) FROM \(table)", "counting \(table)").first { $0.int(0) } ?? 0)
        }
        return (try count("sessions"), try count("revocations"), try count("provider_secrets"))
    }

    /// Writes `rows` into the meta table, then moves every page into the
    /// main file and leaves WAL mode (no `-wal` file left beside it), and
    /// fsyncs the file: after this the one file is the whole database, to be
    /// renamed. No other connection may be open.
    static func seal(_ path: String, timeoutSeconds: Int64, rows: [String: String]) throws(VaultError) {
        do {
            let database = try SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds)
            if !rows.isEmpty {
                try database.transaction("recording the migration") { () throws(VaultError) in
                    for (name, value) in rows.sorted(by: { $0.key < $1.key }) {
                        try database.statement(
                            "INSERT OR REPLACE INTO meta(name, value) VALUES(?, ?)", "recording the migration"
                        ).bind(.text(name), .text(value)).run()
                    }
                }
            }
            try database.execute(
                "PRAGMA wal_checkpoint(TRUNCATE); PRAGMA journal_mode = DELETE;", "writing the database into one file")
            guard
                try database.statement("PRAGMA journal_mode", "reading the journal mode").first({ $0.text(0) })
                    == "delete"
            else {
                throw VaultError(
                    .storeFailed, "the database \(path) is still in WAL mode (is another process using it?)")
            }
        }
        guard !Files.exists(path + "-wal") else {
            throw VaultError(.storeFailed, "the database \(path) still has a WAL file after it was closed")
        }
        try MigrationFiles.sync(path)
    }

    /// Removes the pending row once the Secret Service holds nothing of the migration.
    static func clearPending(_ path: String, timeoutSeconds: Int64) throws(VaultError) {
        let database = try SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds)
        try database.transaction("recording the end of the migration") { () throws(VaultError) in
            try database.statement("DELETE FROM meta WHERE name = ?", "recording the end of the migration")
                .bind(.text(StoreMigration.pendingRow)).run()
        }
    }
}

/// The few file operations a migration needs, each failure an error naming the file.
enum MigrationFiles {
    static func directory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        return slash == path.startIndex ? "/" : String(path[..<slash])
    }

    /// Removes a database file and the files SQLite keeps beside it; missing ones are fine.
    static func removeDatabase(_ path: String) {
        for suffix in ["", "-wal", "-shm", "-journal"] { unlink(path + suffix) }
    }

    /// fsync of a file.
    static func sync(_ path: String) throws(VaultError) {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        guard fd >= 0 else { throw VaultError(.storeFailed, "cannot open \(path): \(SystemError("open"))") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw VaultError(.storeFailed, "cannot sync \(path): \(SystemError("fsync"))") }
    }

    /// fsync of the directory holding `path`, so a rename or unlink in it is on disk.
    static func syncDirectory(of path: String) throws(VaultError) {
        let directory = directory(of: path)
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw VaultError(.storeFailed, "cannot open \(directory): \(SystemError("open"))") }
        defer { close(fd) }
        guard fsync(fd) == 0 else {
            throw VaultError(.storeFailed, "cannot sync the directory \(directory): \(SystemError("fsync"))")
        }
    }
}
