import Glibc
import VaultCore
import VaultSystem

/// The database file and its tables: created with the right mode and owner,
/// recognised as vaultd's and of this format before anything is written.
extension SQLiteStore {
    /// Creates the database's directory (0700) when missing, and checks an
    /// existing file: a regular file of this user, not a link, mode 0600
    /// (tightened when wider).
    static func prepareFile(_ path: String) throws(VaultError) {
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
    static func setUp(_ database: SQLiteDatabase) throws(VaultError) -> String? {
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
    static func inspect(_ database: SQLiteDatabase) throws(VaultError) -> String? {
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
    static func createTables(_ database: SQLiteDatabase, keyID: String) throws(VaultError) {
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
}
