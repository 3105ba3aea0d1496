import Dispatch
import Glibc
import VaultCore
import VaultSystem

/// Reading every session at start-up: a large store in parts, side by side.
extension SQLiteStore {
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
}

/// What the iterations of `DispatchQueue.concurrentPerform` in `loadAll`
/// share: each touches only the element of its own part (its connection, its
/// result), so no two use one element at once.
private struct ConcurrentParts<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}
