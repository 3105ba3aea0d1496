import CSecret
import VaultCore

/// What `vaultd --migrate-store` needs of the Secret Service beyond the
/// daemon's calls: every client secret of the scope (the daemon only ever
/// asks for one provider's), and deleting one.
extension LibsecretStore {
    /// Every client secret of this scope, by provider. An item whose
    /// provider attribute cannot be read is an error: a migration must not
    /// leave a secret behind without saying so.
    public func loadProviderSecrets() async throws(VaultError) -> [String: Secret] {
        let what = "listing client secrets"
        return try await perform(what) { cancellable throws(VaultError) -> [String: Secret] in
            try self.withItems(self.providerSecretSchema, self.scopeAttributes(), cancellable, what) {
                (items) throws(VaultError) -> [String: Secret] in
                var secrets: [String: Secret] = [:]
                for item in items {
                    guard let secret = item.secret, let provider = try self.providerAttribute(item.path, cancellable)
                    else {
                        throw VaultError(
                            .storeFailed,
                            "the client secret item \(item.path) in the Secret Service (\(self.location)) cannot be read; remove it, or store the secret again with vaultctl provider-secret"
                        )
                    }
                    secrets[provider] = Secret(String(decoding: secret, as: UTF8.self))
                }
                return secrets
            }
        }
    }

    /// Deletes the client secret of `provider` (none is fine).
    public func deleteProviderSecret(_ provider: String) async throws(VaultError) {
        let what = "deleting the client secret of \(provider)"
        try await perform(what) { cancellable throws(VaultError) in
            try self.clear(self.providerSecretSchema, self.scopeAttributes(provider: provider), cancellable, what)
        }
    }

    /// Deletes every data key item of this scope (`io.vaultd.DataKey`);
    /// returns how many there were.
    public func deleteDataKeys() async throws(VaultError) -> Int {
        let keys = try await loadDataKeys()
        for key in keys { try await deleteDataKey(id: key.id) }
        return keys.count
    }

    /// The `provider` attribute of the item at `path`.
    private func providerAttribute(_ path: String, _ cancellable: Cancellable) throws(VaultError) -> String? {
        var error: UnsafeMutablePointer<GError>? = nil
        let item = secret_item_new_for_dbus_path_sync(
            try servicePointer(), path, SECRET_ITEM_NONE, cancellable.pointer, &error)
        if let message = GLibFailure.take(&error)?.message {
            throw VaultError(.storeFailed, "reading the item \(path) in the Secret Service failed: \(message)")
        }
        guard let item else { return nil }
        defer { g_object_unref(UnsafeMutableRawPointer(item)) }
        guard let attributes = secret_item_get_attributes(item) else { return nil }
        defer { g_hash_table_unref(attributes) }
        guard let value = "provider".withCString({ g_hash_table_lookup(attributes, $0) }) else { return nil }
        return String(cString: value.assumingMemoryBound(to: CChar.self))
    }
}
