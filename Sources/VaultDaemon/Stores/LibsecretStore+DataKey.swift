import CSecret
import VaultCore

/// The SQLite engine's data key as an item of the Secret Service: its
/// secret the key in hex, its attributes the key's id and the instance's scope.
extension LibsecretStore {
    /// The schema of the data key's item.
    public static let dataKeySchemaName = "io.vaultd.DataKey"

    private func dataKeyAttributes(id: String?) -> GHashTableBox {
        let table = scopeAttributes()
        if let id { g_hash_table_insert(table.table, g_strdup("key_id"), g_strdup(id)) }
        return table
    }

    /// The data keys of this scope (the one with `id` only, when given), in
    /// the order of their ids; an item whose secret is not a key is an error.
    func loadDataKeys(id: String? = nil) async throws(VaultError) -> [DataKey] {
        let what = "reading the data key of the session database"
        return try await perform(what) { cancellable throws(VaultError) -> [DataKey] in
            var items = try self.search(self.dataKeySchema, self.dataKeyAttributes(id: id), cancellable, what)
            defer { for index in items.indices { items[index].wipe() } }
            if items.isEmpty { try self.requireUnlocked(cancellable, what) }
            var keys: [DataKey] = []
            for item in items {
                guard let secret = item.secret else { continue }
                keys.append(try DataKey.fromHex(secret, source: "the Secret Service item \(item.path)"))
            }
            return keys.sorted { $0.id < $1.id }
        }
    }

    /// Stores `key` as a new item (its id makes it distinct from every other key).
    func saveDataKey(_ key: DataKey) async throws(VaultError) {
        let what = "storing the data key of the session database"
        try await perform(what) { cancellable throws(VaultError) in
            var digits = key.hexDigits()
            defer { digits.wipe() }
            try self.store(
                self.dataKeySchema, self.dataKeyAttributes(id: key.id),
                "vaultd: data key \(key.id) of the session database", digits, "text/plain", cancellable, what)
        }
    }

    /// Deletes the item of the key `id`.
    func deleteDataKey(id: String) async throws(VaultError) {
        let what = "deleting the retired data key \(id)"
        try await perform(what) { cancellable throws(VaultError) in
            try self.clear(self.dataKeySchema, self.dataKeyAttributes(id: id), cancellable, what)
        }
    }
}
