import CSQLite
import Glibc
import VaultCore

/// One connection to an SQLite database, with the few calls the store
/// needs: statements prepared once and kept, values bound by position,
/// rows stepped through, transactions that roll back on any error.
///
/// Not thread-safe by itself: its owner calls it from one thread at a time
/// (the store's lane). Every error is a `VaultError` naming the database,
/// what vaultd was doing, and SQLite's own message.
final class SQLiteDatabase {
    /// The database file.
    let path: String
    private let handle: OpaquePointer
    private var statements: [String: Statement] = [:]
    /// `close()` closed the connection.
    private var closed = false

    /// Opens (or creates) the database at `path`; `timeoutSeconds` bounds the
    /// wait for a lock another process holds.
    /// (`readOnly`: never writes, never creates the file.)
    init(path: String, timeoutSeconds: Int64, readOnly: Bool = false) throws(VaultError) {
        self.path = path
        var connection: OpaquePointer?
        let access = readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
        let flags = access | SQLITE_OPEN_FULLMUTEX | SQLITE_OPEN_NOFOLLOW
        let result = sqlite3_open_v2(path, &connection, flags, nil)
        guard result == SQLITE_OK, let connection else {
            let message = connection.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            if let connection { sqlite3_close_v2(connection) }
            throw VaultError(.storeFailed, "cannot open the session database \(path): \(message)")
        }
        handle = connection
        sqlite3_extended_result_codes(handle, 1)
        sqlite3_busy_timeout(handle, Int32(clamping: timeoutSeconds * 1000))
    }

    deinit { close() }

    /// Closes the connection now, its statements first; nothing may use it
    /// after. For an owner that must know the file has no connection left
    /// (another connection then changes its journal mode), not only that
    /// its last reference went, which may be on another thread later.
    func close() {
        guard !closed else { return }
        closed = true
        statements.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Throws once `close()` closed the connection: nothing reaches SQLite
    /// through a closed handle.
    private func checkOpen(_ what: String) throws(VaultError) {
        guard closed else { return }
        throw VaultError(.storeFailed, "\(what) in the session database \(path) failed: its connection is closed")
    }

    /// The error of a failed call: the database, `what`, SQLite's message.
    /// A full disk, a read-only or vanished file and a lock held too long are
    /// `StoreFailed` like any other: the call may be tried again.
    func failure(_ what: String, _ code: Int32) -> VaultError {
        let message = String(cString: sqlite3_errmsg(handle))
        var hint = ""
        switch code & 0xff {
        case SQLITE_FULL: hint = "; the disk is full: free some space"
        case SQLITE_READONLY: hint = "; the database or its directory is read-only"
        case SQLITE_BUSY, SQLITE_LOCKED:
            hint = "; another process holds the database (is a second vaultd or a migration running?)"
        case SQLITE_CORRUPT, SQLITE_NOTADB:
            hint = "; the file is damaged or not a database: restore it from a backup"
        default: break
        }
        return VaultError(.storeFailed, "\(what) in the session database \(path) failed: \(message)\(hint)")
    }

    /// Runs one or more statements that take no values and return no rows.
    func execute(_ sql: String, _ what: String) throws(VaultError) {
        try checkOpen(what)
        let result = sqlite3_exec(handle, sql, nil, nil, nil)
        guard result == SQLITE_OK else { throw failure(what, result) }
    }

    /// The prepared statement for `sql`, prepared once per connection and
    /// reset for each use; its errors name `what`, this use's (a cached
    /// statement must not name the account of the call that prepared it).
    func statement(_ sql: String, _ what: String) throws(VaultError) -> Statement {
        try checkOpen(what)
        if let cached = statements[sql] {
            cached.reset()
            cached.what = what
            return cached
        }
        var prepared: OpaquePointer?
        let result = sqlite3_prepare_v3(handle, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &prepared, nil)
        guard result == SQLITE_OK, let prepared else { throw failure(what, result) }
        let statement = Statement(prepared, database: self, what: what)
        statements[sql] = statement
        return statement
    }

    /// Runs `body` in one write transaction (taken at once, so it never
    /// fails half-way for a lock): committed when it returns, rolled back
    /// when it throws.
    func transaction<T>(_ what: String, _ body: () throws(VaultError) -> T) throws(VaultError) -> T {
        try execute("BEGIN IMMEDIATE", what)
        let value: T
        do {
            value = try body()
            try execute("COMMIT", what)
        } catch {
            sqlite3_exec(handle, "ROLLBACK", nil, nil, nil)
            throw error
        }
        return value
    }

    /// One value of a `PRAGMA` that returns a single row.
    func pragma(_ name: String) throws(VaultError) -> Int64 {
        try statement("PRAGMA \(name)", "reading PRAGMA \(name)").first { $0.int(0) } ?? 0
    }

    /// A prepared statement of `SQLiteDatabase`.
    final class Statement {
        private let pointer: OpaquePointer
        private unowned let database: SQLiteDatabase
        /// What the current use is doing, for its errors.
        fileprivate var what: String

        fileprivate init(_ pointer: OpaquePointer, database: SQLiteDatabase, what: String) {
            self.pointer = pointer
            self.database = database
            self.what = what
        }

        deinit { sqlite3_finalize(pointer) }

        fileprivate func reset() {
            sqlite3_reset(pointer)
            sqlite3_clear_bindings(pointer)
        }

        /// Binds `values` to the statement's parameters, in order from the first.
        @discardableResult
        func bind(_ values: Value...) throws(VaultError) -> Statement {
            for (offset, value) in values.enumerated() { try bind(at: Int32(offset + 1), value) }
            return self
        }

        /// Binds `value` to the parameter at `index` (from 1).
        func bind(at index: Int32, _ value: Value) throws(VaultError) {
            let result: Int32
            switch value {
            case .text(let text): result = sqlite3_bind_text(pointer, index, text, -1, vaultd_sqlite_transient())
            case .int(let number): result = sqlite3_bind_int64(pointer, index, number)
            case .blob(let bytes):
                result = bytes.withUnsafeBytes {
                    sqlite3_bind_blob(pointer, index, $0.baseAddress, Int32($0.count), vaultd_sqlite_transient())
                }
            }
            guard result == SQLITE_OK else { throw database.failure(what, result) }
        }

        /// Steps once: true when a row is ready to be read, false when done.
        func step() throws(VaultError) -> Bool {
            let result = sqlite3_step(pointer)
            switch result {
            case SQLITE_ROW: return true
            case SQLITE_DONE: return false
            default:
                let error = database.failure(what, result)
                sqlite3_reset(pointer)
                throw error
            }
        }

        /// The first row read by `read`, or nil when there is none; the
        /// statement is reset after it, so it holds no read transaction open.
        func first<T>(_ read: (Statement) -> T) throws(VaultError) -> T? {
            defer { sqlite3_reset(pointer) }
            return try step() ? read(self) : nil
        }

        /// Steps to the end of a statement that returns no rows.
        func run() throws(VaultError) {
            while try step() {}
        }

        /// Column `index` of the current row as text ("" for NULL).
        func text(_ index: Int32) -> String {
            guard let bytes = sqlite3_column_text(pointer, index) else { return "" }
            return String(cString: bytes)
        }

        /// Column `index` of the current row as an integer.
        func int(_ index: Int32) -> Int64 { sqlite3_column_int64(pointer, index) }

        /// Column `index` of the current row as bytes, valid until the next step.
        func withBlob<T>(_ index: Int32, _ body: (UnsafeRawBufferPointer) -> T) -> T {
            let base = sqlite3_column_blob(pointer, index)
            let count = Int(sqlite3_column_bytes(pointer, index))
            return body(UnsafeRawBufferPointer(start: base, count: base == nil ? 0 : count))
        }
    }

    /// A value bound to a statement's parameter.
    enum Value {
        case text(String)
        case int(Int64)
        case blob([UInt8])
    }
}
