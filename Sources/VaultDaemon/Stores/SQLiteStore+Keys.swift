import VaultCore
import VaultSystem

/// Sealing the database under another data key: at open, when the key source
/// prefers a new key, and for `vaultd --rotate-key`.
extension SQLiteStore {
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
                    Sealing.revocationData(row.text(0), Account(provider: row.text(1), user: row.text(2))),
                    [.text(row.text(0))]
                )
            }
            count += try resealTable(
                select: "SELECT provider, key_id, sealed FROM provider_secrets", keyColumn: 1,
                update: "UPDATE provider_secrets SET key_id = ?, sealed = ? WHERE provider = ?", what: what,
                old: oldKey, new: newKey
            ) { row in (Sealing.providerSecretData(row.text(0)), [.text(row.text(0))]) }
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
