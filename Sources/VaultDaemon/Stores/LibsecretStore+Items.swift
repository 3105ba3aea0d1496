import CSecret
import VaultCore
import VaultSystem

/// The Secret Service calls every store call is made of (on the store's
/// lane): store, clear and search items by their attributes.
extension LibsecretStore {
    /// An item found by a search: its D-Bus path and a copy of its secret
    /// (none when the item is locked), to be wiped.
    struct FoundItem {
        var path: String
        var secret: [UInt8]?
        /// In a locked collection: its secret cannot be read.
        var locked = false

        mutating func wipe() {
            secret?.wipe()
        }
    }

    /// Creates or replaces the item with `attributes` in the default collection.
    func store(
        _ schema: UnsafeMutablePointer<SecretSchema>, _ attributes: GHashTableBox, _ label: String,
        _ bytes: [UInt8], _ contentType: String, _ cancellable: Cancellable, _ what: String
    ) throws(VaultError) {
        let value = bytes.withUnsafeBytes { raw in
            secret_value_new(raw.baseAddress!.assumingMemoryBound(to: CChar.self), gssize(raw.count), contentType)
        }
        defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
        var error: UnsafeMutablePointer<GError>? = nil
        let ok = secret_service_store_sync(
            try servicePointer(), schema, attributes.table, nil, label, value, cancellable.pointer, &error)
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
        if ok == 0 {
            throw VaultError(
                .storeFailed, "\(what) in the Secret Service failed (\(location)): the service refused the item")
        }
    }

    /// Deletes every item with `attributes`; none is fine.
    func clear(
        _ schema: UnsafeMutablePointer<SecretSchema>, _ attributes: GHashTableBox, _ cancellable: Cancellable,
        _ what: String
    ) throws(VaultError) {
        // Not secret_service_clear_sync: it deletes the unlocked items it finds and
        // says nothing of the locked ones, so a logout in a locked collection
        // would answer "deleted" and the session come back once it is unlocked.
        let items = try search(schema, attributes, cancellable, what, secrets: false)
        if items.isEmpty || items.contains(where: \.locked) { try requireUnlocked(cancellable, what) }
        for item in items { try deleteItem(at: item.path, cancellable, what) }
    }

    /// Deletes the item at `path`.
    func deleteItem(at path: String, _ cancellable: Cancellable, _ what: String) throws(VaultError) {
        var error: UnsafeMutablePointer<GError>? = nil
        _ = secret_service_delete_item_dbus_path_sync(try servicePointer(), path, cancellable.pointer, &error)
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
    }

    /// Runs `body` on every item with `attributes`, with copies of their
    /// secrets, which are wiped once it returns. A search that finds nothing
    /// is trusted only once the collection is known to be unlocked: a locked
    /// collection finds nothing, like an empty one.
    func withItems<T>(
        _ schema: UnsafeMutablePointer<SecretSchema>, _ attributes: GHashTableBox, _ cancellable: Cancellable,
        _ what: String, _ body: ([FoundItem]) throws(VaultError) -> T
    ) throws(VaultError) -> T {
        // Wiped in place, through the array that holds the only copies.
        var items = try search(schema, attributes, cancellable, what)
        defer { for index in items.indices { items[index].wipe() } }
        if items.isEmpty { try requireUnlocked(cancellable, what) }
        return try body(items)
    }

    /// Every item with `attributes`, with a copy of its secret. Reads paths
    /// and secrets in two D-Bus calls and makes no proxy object per item: a
    /// search of a thousand items used to leave megabytes of freed but
    /// scattered heap behind.
    func search(
        _ schema: UnsafeMutablePointer<SecretSchema>, _ attributes: GHashTableBox, _ cancellable: Cancellable,
        _ what: String, secrets readSecrets: Bool = true
    ) throws(VaultError) -> [FoundItem] {
        var error: UnsafeMutablePointer<GError>? = nil
        var unlocked: UnsafeMutablePointer<UnsafeMutablePointer<gchar>?>? = nil
        var locked: UnsafeMutablePointer<UnsafeMutablePointer<gchar>?>? = nil
        let service = try servicePointer()
        _ = secret_service_search_for_dbus_paths_sync(
            service, schema, attributes.table, cancellable.pointer, &unlocked, &locked, &error)
        defer {
            g_strfreev(unlocked)
            g_strfreev(locked)
        }
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
        // A locked item's secret cannot be read: it is found, without one.
        var items = LibsecretStore.strings(locked).map { FoundItem(path: $0, secret: nil, locked: true) }
        if readSecrets, !items.isEmpty {
            // Never read a locked item as missing or unreadable.
            try requireUnlocked(cancellable, what)
        }
        let paths = LibsecretStore.strings(unlocked)
        guard readSecrets else { return items + paths.map { FoundItem(path: $0, secret: nil) } }
        guard let unlocked, !paths.isEmpty else { return items }
        let secrets = unlocked.withMemoryRebound(to: UnsafePointer<gchar>?.self, capacity: paths.count + 1) {
            secret_service_get_secrets_for_dbus_paths_sync(service, $0, cancellable.pointer, &error)
        }
        defer { if let secrets { g_hash_table_unref(secrets) } }
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
        for path in paths {
            var found = FoundItem(path: path, secret: nil)
            let value = path.withCString { key in secrets.flatMap { g_hash_table_lookup($0, key) } }
            if let value {
                var length: gsize = 0
                if let bytes = secret_value_get(OpaquePointer(value), &length) {
                    found.secret = [UInt8](UnsafeRawBufferPointer(start: UnsafeRawPointer(bytes), count: Int(length)))
                }
            }
            items.append(found)
        }
        return items
    }

    /// The label of the item at `path`, for messages; the path when it cannot be read.
    func label(of path: String, _ cancellable: Cancellable) -> String {
        var error: UnsafeMutablePointer<GError>? = nil
        guard let service = try? servicePointer(),
            let item = secret_item_new_for_dbus_path_sync(
                service, path, SECRET_ITEM_NONE, cancellable.pointer, &error)
        else {
            _ = GLibFailure.take(&error)
            return path
        }
        defer { g_object_unref(UnsafeMutableRawPointer(item)) }
        return LibsecretStore.takeString(secret_item_get_label(item)) ?? path
    }

    /// The strings of a NULL-terminated `gchar **`.
    private static func strings(_ vector: UnsafeMutablePointer<UnsafeMutablePointer<gchar>?>?) -> [String] {
        var out: [String] = []
        var cursor = vector
        while let entry = cursor?.pointee {
            out.append(String(cString: entry))
            cursor = cursor! + 1
        }
        return out
    }

    /// The attributes every search of this instance narrows by: its scope (and a provider).
    func scopeAttributes(provider: String? = nil) -> GHashTableBox {
        let table = GHashTableBox()
        g_hash_table_insert(table.table, g_strdup("scope"), g_strdup(scope))
        if let provider { g_hash_table_insert(table.table, g_strdup("provider"), g_strdup(provider)) }
        return table
    }

    func attributes(_ account: Account, owner: UInt32?) -> GHashTableBox {
        let table = GHashTableBox()
        g_hash_table_insert(table.table, g_strdup("provider"), g_strdup(account.provider))
        g_hash_table_insert(table.table, g_strdup("user"), g_strdup(account.user))
        if let owner { g_hash_table_insert(table.table, g_strdup("owner_uid"), g_strdup(String(owner))) }
        g_hash_table_insert(table.table, g_strdup("scope"), g_strdup(scope))
        return table
    }

    static func takeString(_ pointer: UnsafeMutablePointer<gchar>?) -> String? {
        guard let pointer else { return nil }
        defer { g_free(pointer) }
        return String(cString: pointer)
    }
}
