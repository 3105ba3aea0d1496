import CSecret
import CShim
import Dispatch
import Glibc
import VaultCore
import VaultSystem

/// Session records in the Secret Service (gnome-keyring, KeePassXC) through
/// libsecret: one item per session, its secret the record's JSON.
///
/// libsecret's `*_sync` calls block on D-Bus and may wait on an unlock prompt,
/// so every call runs on one dedicated serial queue, never on Swift's
/// cooperative pool, and is cancelled (through a GCancellable) after the
/// configured timeout.
public final class LibsecretStore: SessionStore, @unchecked Sendable {
    /// The schema name on every item vaultd writes.
    public static let schemaName = "io.vaultd.Session"

    public let location: String
    private let queue = DispatchQueue(label: "io.vaultd.secret-store")
    private let timeoutSeconds: Int64
    /// Keeps the sessions of several vaultd instances on one keyring apart (StoreScope=).
    private let scope: String
    // Touched only on `queue` after init.
    private let service: OpaquePointer
    private let schema: UnsafeMutablePointer<SecretSchema>
    private let providerSecretSchema: UnsafeMutablePointer<SecretSchema>
    private let pendingRevocationSchema: UnsafeMutablePointer<SecretSchema>
    /// The schema of a revocation queued after a failed attempt.
    public static let pendingRevocationSchemaName = "io.vaultd.PendingRevocation"
    /// The schema of a provider's client secret.
    public static let providerSecretSchemaName = "io.vaultd.ProviderSecret"

    /// Connects to the Secret Service on the session bus and checks that the
    /// default collection exists and is unlocked. Blocks: call it at start-up.
    public static func open(timeoutSeconds: Int64, scope: String = "default") throws(VaultError) -> LibsecretStore {
        let bus =
            Environment.get("DBUS_SESSION_BUS_ADDRESS").map { "session bus \($0)" }
            ?? "session bus (DBUS_SESSION_BUS_ADDRESS not set)"
        let cancellable = Cancellable(timeoutSeconds: timeoutSeconds)
        var error: UnsafeMutablePointer<GError>? = nil
        let flags = SecretServiceFlags(
            rawValue: SECRET_SERVICE_OPEN_SESSION.rawValue | SECRET_SERVICE_LOAD_COLLECTIONS.rawValue)
        guard let service = secret_service_get_sync(flags, cancellable.pointer, &error) else {
            let reason = GLibError.take(&error) ?? "no answer"
            throw VaultError(
                .storeUnavailable,
                "no Secret Service reachable on the \(bus): \(reason); start gnome-keyring or KeePassXC with its Secret Service integration, or run scripts/run, which starts a private keyring"
            )
        }
        let servicePointer = OpaquePointer(service)
        var collectionError: UnsafeMutablePointer<GError>? = nil
        let collection = secret_collection_for_alias_sync(
            service, "default", SECRET_COLLECTION_NONE, cancellable.pointer, &collectionError)
        if let reason = GLibError.take(&collectionError) {
            g_object_unref(UnsafeMutableRawPointer(servicePointer))
            throw VaultError(
                .storeUnavailable,
                "the Secret Service on the \(bus) did not answer: \(reason); check that gnome-keyring (or KeePassXC) is running"
            )
        }
        guard let collection else {
            g_object_unref(UnsafeMutableRawPointer(servicePointer))
            throw VaultError(
                .storeUnavailable,
                "the Secret Service on the \(bus) has no default collection; create one (e.g. with seahorse) or run scripts/run"
            )
        }
        let locked = secret_collection_get_locked(collection) != 0
        let label = secret_collection_get_label(collection).map { String(cString: $0) } ?? "default"
        g_object_unref(UnsafeMutableRawPointer(collection))
        if locked {
            g_object_unref(UnsafeMutableRawPointer(servicePointer))
            throw VaultError(
                .storeLocked,
                "the default collection '\(label)' on the \(bus) is locked, and a locked collection hides every session; unlock it (log in to the desktop, or 'gnome-keyring-daemon --unlock') and start vaultd again"
            )
        }
        return LibsecretStore(
            service: servicePointer, location: "collection '\(label)' on the \(bus)", timeoutSeconds: timeoutSeconds,
            scope: scope)
    }

    private init(service: OpaquePointer, location: String, timeoutSeconds: Int64, scope: String) {
        self.scope = scope
        self.service = service
        self.location = location
        self.timeoutSeconds = timeoutSeconds
        let types = GHashTableBox()
        for name in ["provider", "user", "owner_uid", "scope"] {
            g_hash_table_insert(types.table, g_strdup(name), nil)  // nil = SECRET_SCHEMA_ATTRIBUTE_STRING
        }
        schema = secret_schema_newv(LibsecretStore.schemaName, SECRET_SCHEMA_NONE, types.table)
        let secretTypes = GHashTableBox()
        for name in ["provider", "scope"] { g_hash_table_insert(secretTypes.table, g_strdup(name), nil) }
        providerSecretSchema = secret_schema_newv(
            LibsecretStore.providerSecretSchemaName, SECRET_SCHEMA_NONE, secretTypes.table)
        let pendingTypes = GHashTableBox()
        for name in ["provider", "user", "scope"] { g_hash_table_insert(pendingTypes.table, g_strdup(name), nil) }
        pendingRevocationSchema = secret_schema_newv(
            LibsecretStore.pendingRevocationSchemaName, SECRET_SCHEMA_NONE, pendingTypes.table)
    }

    deinit {
        secret_schema_unref(schema)
        secret_schema_unref(providerSecretSchema)
        secret_schema_unref(pendingRevocationSchema)
        g_object_unref(UnsafeMutableRawPointer(service))
    }

    private var servicePointer: UnsafeMutablePointer<SecretService> {
        UnsafeMutablePointer<SecretService>(service)
    }

    /// Runs `body` on the store's queue with a cancellable that fires after the timeout.
    private func perform<T: Sendable>(
        _ what: String, _ body: @escaping @Sendable (Cancellable) throws(VaultError) -> T
    ) async throws(VaultError) -> T {
        let result: Result<T, VaultError> = await withCheckedContinuation { continuation in
            queue.async {
                let cancellable = Cancellable(timeoutSeconds: self.timeoutSeconds)
                do throws(VaultError) {
                    continuation.resume(returning: .success(try body(cancellable)))
                } catch {
                    continuation.resume(returning: .failure(error))
                }
            }
        }
        return try result.get()
    }

    private func failure(_ what: String, _ reason: String) -> VaultError {
        if reason.contains("cancel") || reason.contains("Cancel") {
            return VaultError(
                .storeUnavailable,
                "\(what) in the Secret Service took longer than \(timeoutSeconds)s and was abandoned (\(location)); check that the keyring is running and unlocked"
            )
        }
        return VaultError(.storeFailed, "\(what) in the Secret Service failed (\(location)): \(reason)")
    }

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
            let attributes = GHashTableBox()
            g_hash_table_insert(attributes.table, g_strdup("scope"), g_strdup(self.scope))
            var error: UnsafeMutablePointer<GError>? = nil
            let flags = SecretSearchFlags(rawValue: SECRET_SEARCH_ALL.rawValue | SECRET_SEARCH_LOAD_SECRETS.rawValue)
            let list = secret_service_search_sync(
                self.servicePointer, self.schema, attributes.table, flags, cancellable.pointer, &error)
            if let reason = GLibError.take(&error) { throw self.failure("reading sessions", reason) }
            defer { g_list_free_full(list, { g_object_unref($0) }) }
            var contents = StoreContents(records: [], unreadable: [])
            var node = list
            while let current = node {
                node = current.pointee.next
                guard let raw = current.pointee.data else { continue }
                let item = raw.assumingMemoryBound(to: SecretItem.self)
                let label = LibsecretStore.takeString(secret_item_get_label(item)) ?? "(no label)"
                guard let value = secret_item_get_secret(item) else {
                    contents.unreadable.append(label)
                    continue
                }
                defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
                var length: gsize = 0
                guard let bytes = secret_value_get(value, &length) else {
                    contents.unreadable.append(label)
                    continue
                }
                var copy = [UInt8](
                    UnsafeRawBufferPointer(start: UnsafeRawPointer(bytes), count: Int(length)))
                defer { copy.withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) } }
                do {
                    let json = try JSON.parse(copy)
                    contents.records.append(try SessionRecord(storedJSON: json))
                } catch {
                    contents.unreadable.append(label)
                }
            }
            return contents
        }
    }

    public func save(_ record: SessionRecord) async throws(VaultError) {
        try await perform("writing \(record.account)") { cancellable throws(VaultError) in
            let attributes = self.attributes(record.account, owner: record.ownerUID)
            var document = record.storedJSON().serialized()
            defer { document.withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) } }
            let value = document.withUnsafeBytes { bytes in
                secret_value_new(
                    bytes.baseAddress!.assumingMemoryBound(to: CChar.self), gssize(bytes.count), "application/json")
            }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            var error: UnsafeMutablePointer<GError>? = nil
            let ok = secret_service_store_sync(
                self.servicePointer, self.schema, attributes.table, nil, record.storeLabel, value,
                cancellable.pointer, &error)
            if let reason = GLibError.take(&error) { throw self.failure("writing \(record.account)", reason) }
            if ok == 0 { throw self.failure("writing \(record.account)", "the service refused the item") }
        }
    }

    public func delete(_ account: Account) async throws(VaultError) {
        try await perform("deleting \(account)") { cancellable throws(VaultError) in
            let attributes = self.attributes(account, owner: nil)
            var error: UnsafeMutablePointer<GError>? = nil
            _ = secret_service_clear_sync(
                self.servicePointer, self.schema, attributes.table, cancellable.pointer, &error)
            if let reason = GLibError.take(&error) { throw self.failure("deleting \(account)", reason) }
        }
    }

    public func saveProviderSecret(_ provider: String, _ secret: Secret) async throws(VaultError) {
        try await perform("writing the client secret of \(provider)") { cancellable throws(VaultError) in
            let attributes = GHashTableBox()
            g_hash_table_insert(attributes.table, g_strdup("provider"), g_strdup(provider))
            g_hash_table_insert(attributes.table, g_strdup("scope"), g_strdup(self.scope))
            var bytes = Array(secret.revealed.utf8)
            defer { bytes.withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) } }
            let value = bytes.withUnsafeBytes { raw in
                secret_value_new(raw.baseAddress!.assumingMemoryBound(to: CChar.self), gssize(raw.count), "text/plain")
            }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            var error: UnsafeMutablePointer<GError>? = nil
            _ = secret_service_store_sync(
                self.servicePointer, self.providerSecretSchema, attributes.table, nil,
                "vaultd: client secret of \(provider)", value, cancellable.pointer, &error)
            if let reason = GLibError.take(&error) {
                throw self.failure("writing the client secret of \(provider)", reason)
            }
        }
    }

    public func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try await perform("reading the client secret of \(provider)") { cancellable throws(VaultError) -> Secret? in
            let attributes = GHashTableBox()
            g_hash_table_insert(attributes.table, g_strdup("provider"), g_strdup(provider))
            g_hash_table_insert(attributes.table, g_strdup("scope"), g_strdup(self.scope))
            var error: UnsafeMutablePointer<GError>? = nil
            let flags = SecretSearchFlags(rawValue: SECRET_SEARCH_LOAD_SECRETS.rawValue)
            let list = secret_service_search_sync(
                self.servicePointer, self.providerSecretSchema, attributes.table, flags, cancellable.pointer, &error)
            if let reason = GLibError.take(&error) {
                throw self.failure("reading the client secret of \(provider)", reason)
            }
            defer { g_list_free_full(list, { g_object_unref($0) }) }
            guard let raw = list?.pointee.data else { return nil }
            let item = raw.assumingMemoryBound(to: SecretItem.self)
            guard let value = secret_item_get_secret(item) else { return nil }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            var length: gsize = 0
            guard let bytes = secret_value_get(value, &length) else { return nil }
            let buffer = UnsafeRawBufferPointer(start: UnsafeRawPointer(bytes), count: Int(length))
            return Secret(String(decoding: buffer, as: UTF8.self))
        }
    }

    public func savePendingRevocation(_ record: SessionRecord) async throws(VaultError) {
        try await perform("queueing the revocation of \(record.account)") { cancellable throws(VaultError) in
            let attributes = self.attributes(record.account, owner: nil)
            var document = record.storedJSON().serialized()
            defer { document.withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) } }
            let value = document.withUnsafeBytes { bytes in
                secret_value_new(
                    bytes.baseAddress!.assumingMemoryBound(to: CChar.self), gssize(bytes.count), "application/json")
            }
            defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
            var error: UnsafeMutablePointer<GError>? = nil
            _ = secret_service_store_sync(
                self.servicePointer, self.pendingRevocationSchema, attributes.table, nil,
                "vaultd: revocation pending for \(record.account)", value, cancellable.pointer, &error)
            if let reason = GLibError.take(&error) {
                throw self.failure("queueing the revocation of \(record.account)", reason)
            }
        }
    }

    public func deletePendingRevocation(_ account: Account) async throws(VaultError) {
        try await perform("removing the queued revocation of \(account)") { cancellable throws(VaultError) in
            let attributes = self.attributes(account, owner: nil)
            var error: UnsafeMutablePointer<GError>? = nil
            _ = secret_service_clear_sync(
                self.servicePointer, self.pendingRevocationSchema, attributes.table, cancellable.pointer, &error)
            if let reason = GLibError.take(&error) {
                throw self.failure("removing the queued revocation of \(account)", reason)
            }
        }
    }

    public func loadPendingRevocations() async throws(VaultError) -> [SessionRecord] {
        try await perform("reading queued revocations") { cancellable throws(VaultError) -> [SessionRecord] in
            let attributes = GHashTableBox()
            g_hash_table_insert(attributes.table, g_strdup("scope"), g_strdup(self.scope))
            var error: UnsafeMutablePointer<GError>? = nil
            let flags = SecretSearchFlags(rawValue: SECRET_SEARCH_ALL.rawValue | SECRET_SEARCH_LOAD_SECRETS.rawValue)
            let list = secret_service_search_sync(
                self.servicePointer, self.pendingRevocationSchema, attributes.table, flags, cancellable.pointer,
                &error)
            if let reason = GLibError.take(&error) { throw self.failure("reading queued revocations", reason) }
            defer { g_list_free_full(list, { g_object_unref($0) }) }
            var records: [SessionRecord] = []
            var node = list
            while let current = node {
                node = current.pointee.next
                guard let raw = current.pointee.data else { continue }
                let item = raw.assumingMemoryBound(to: SecretItem.self)
                guard let value = secret_item_get_secret(item) else { continue }
                defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
                var length: gsize = 0
                guard let bytes = secret_value_get(value, &length) else { continue }
                var copy = [UInt8](UnsafeRawBufferPointer(start: UnsafeRawPointer(bytes), count: Int(length)))
                defer { copy.withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) } }
                if let json = try? JSON.parse(copy), let record = try? SessionRecord(storedJSON: json) {
                    records.append(record)
                }
            }
            return records
        }
    }

    private func attributes(_ account: Account, owner: UInt32?) -> GHashTableBox {
        let table = GHashTableBox()
        g_hash_table_insert(table.table, g_strdup("provider"), g_strdup(account.provider))
        g_hash_table_insert(table.table, g_strdup("user"), g_strdup(account.user))
        if let owner { g_hash_table_insert(table.table, g_strdup("owner_uid"), g_strdup(String(owner))) }
        g_hash_table_insert(table.table, g_strdup("scope"), g_strdup(scope))
        return table
    }

    private static func takeString(_ pointer: UnsafeMutablePointer<gchar>?) -> String? {
        guard let pointer else { return nil }
        defer { g_free(pointer) }
        return String(cString: pointer)
    }
}

/// A GHashTable of owned strings, freed with its keys and values in deinit.
final class GHashTableBox {
    let table: OpaquePointer

    init() {
        table = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free)
    }

    deinit { g_hash_table_unref(table) }
}

/// A GCancellable that cancels itself after a timeout, so no store call can
/// block the store's queue for ever.
final class Cancellable: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<GCancellable>

    init(timeoutSeconds: Int64) {
        pointer = g_cancellable_new()
        let box = Unmanaged.passRetained(self)
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(Int(timeoutSeconds))) {
            let cancellable = box.takeRetainedValue()
            withExtendedLifetime(cancellable) { g_cancellable_cancel(cancellable.pointer) }
        }
    }

    deinit { g_object_unref(UnsafeMutableRawPointer(pointer)) }
}

/// Turns a GError into a message, once, at the boundary.
enum GLibError {
    /// The error's message, freeing the error; nil when there is none.
    static func take(_ error: inout UnsafeMutablePointer<GError>?) -> String? {
        guard let e = error else { return nil }
        defer {
            g_error_free(e)
            error = nil
        }
        return e.pointee.message.map { String(cString: $0) } ?? "unknown error"
    }
}
