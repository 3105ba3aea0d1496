import CSecret
import Varlink
import VaultCore
import VaultSystem

/// The calls of `SessionStore`: one item per session record, client secret
/// and queued revocation, each read and written on the store's lane.
extension LibsecretStore {
    public func loadAll() async throws(VaultError) -> StoreContents {
        // An item deleted by someone else between the search and the read of its
        // secret fails the whole search ("No such secret item"): search again.
        for _ in 0..<2 {
            do throws(VaultError) {
                return try await loadAllOnce()
            } catch  where error.message.contains("No such secret item") {
                continue
            }
        }
        return try await loadAllOnce()
    }

    private func loadAllOnce() async throws(VaultError) -> StoreContents {
        try await perform("reading sessions") { cancellable throws(VaultError) in
            try self.withItems(self.schema, self.scopeAttributes(), cancellable, "reading sessions") {
                (items) throws(VaultError) -> StoreContents in
                var contents = StoreContents(records: [], unreadable: [])
                for item in items {
                    guard let secret = item.secret, let json = try? JSON.parse(secret),
                        let record = try? SessionRecord(storedJSON: json)
                    else {
                        contents.unreadable.append(self.label(of: item.path, cancellable))
                        continue
                    }
                    contents.records.append(record)
                }
                return contents
            }
        }
    }

    public func apply(_ change: StoreChange) async throws(VaultError) {
        let what = change.summary
        try await perform(what) { cancellable throws(VaultError) in
            switch change {
            case .save(let record):
                var document = record.storedJSON().serialized()
                defer { document.wipe() }
                try self.store(
                    self.schema, self.attributes(record.account, owner: record.ownerUID), record.storeLabel, document,
                    "application/json", cancellable, what)
            case .delete(let key):
                try self.clear(self.schema, self.attributes(key.account, owner: key.owner), cancellable, what)
            case .saveProviderSecret(let provider, let secret):
                var bytes = Array(secret.revealed.utf8)
                defer { bytes.wipe() }
                try self.store(
                    self.providerSecretSchema, self.scopeAttributes(provider: provider),
                    "vaultd: client secret of \(provider)", bytes, "text/plain", cancellable, what)
            case .savePendingRevocation(let revocation):
                try self.storeRevocation(revocation, cancellable)
            case .deletePendingRevocation(let revocation):
                try self.clear(
                    self.pendingRevocationSchema,
                    self.revocationAttributes(revocation.record.account, id: revocation.id),
                    cancellable, what)
            }
        }
    }

    public func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        let what = "reading the client secret of \(provider)"
        return try await perform(what) { cancellable throws(VaultError) -> Secret? in
            try self.withItems(self.providerSecretSchema, self.scopeAttributes(provider: provider), cancellable, what) {
                (items) throws(VaultError) -> Secret? in
                items.first?.secret.map { Secret(String(decoding: $0, as: UTF8.self)) }
            }
        }
    }

    /// Writes one queued revocation: the record's document with the id added.
    private func storeRevocation(_ revocation: PendingRevocation, _ cancellable: Cancellable) throws(VaultError) {
        let record = revocation.record
        var document = revocation.storedJSON().serialized()
        defer { document.wipe() }
        try store(
            pendingRevocationSchema, revocationAttributes(record.account, id: revocation.id),
            "vaultd: revocation pending for \(record.account)", document, "application/json", cancellable,
            "queueing the revocation of \(record.account)")
    }

    public func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await perform("reading queued revocations") { cancellable throws(VaultError) -> [PendingRevocation] in
            let what = "reading queued revocations"
            return try self.withItems(self.pendingRevocationSchema, self.scopeAttributes(), cancellable, what) {
                (items) throws(VaultError) -> [PendingRevocation] in
                var revocations: [PendingRevocation] = []
                for item in items {
                    guard let secret = item.secret, let json = try? JSON.parse(secret),
                        let record = try? SessionRecord(storedJSON: json)
                    else { continue }
                    if let revocation = PendingRevocation(storedJSON: json, record: record) {
                        revocations.append(revocation)
                        continue
                    }
                    // Queued before revocations had ids: queued again under one, and the
                    // old item removed by its path (its attributes would match them all).
                    let revocation = PendingRevocation(queueing: record)
                    try self.storeRevocation(revocation, cancellable)
                    try self.deleteItem(at: item.path, cancellable, what)
                    revocations.append(revocation)
                }
                return revocations
            }
        }
    }

    /// The attributes of one queued revocation.
    private func revocationAttributes(_ account: Account, id: String) -> GHashTableBox {
        let table = attributes(account, owner: nil)
        g_hash_table_insert(table.table, g_strdup("revocation"), g_strdup(id))
        return table
    }
}
