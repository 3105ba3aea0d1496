import CSecret
import CShim
import Dispatch
import Glibc
import Synchronization
import Varlink
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

    /// Which collection on which bus; set again at each connection.
    public var location: String {
        get { currentLocation.withLock { $0 } }
        set { currentLocation.withLock { $0 = newValue } }
    }
    /// The collection of the current connection, with the Secret Service's remedy.
    public var profile: StoreProfile { StoreProfile(location: location) }
    private let currentLocation = Mutex("")
    private let timeoutSeconds: Int64
    /// Keeps the sessions of several vaultd instances on one keyring apart (StoreScope=).
    let scope: String
    // Touched only on the store's lane after `open`: replaced at each reconnection.
    private var service: OpaquePointer?
    let schema: UnsafeMutablePointer<SecretSchema>
    let providerSecretSchema: UnsafeMutablePointer<SecretSchema>
    let pendingRevocationSchema: UnsafeMutablePointer<SecretSchema>
    /// The schema of the SQLite engine's data key (`LibsecretStore+DataKey.swift`).
    let dataKeySchema: UnsafeMutablePointer<SecretSchema>
    /// The schema of a revocation queued after a failed attempt.
    public static let pendingRevocationSchemaName = "io.vaultd.PendingRevocation"
    /// The schema of a provider's client secret.
    public static let providerSecretSchemaName = "io.vaultd.ProviderSecret"

    /// Connects to the Secret Service on the session bus and checks that the
    /// default collection exists and is unlocked. Blocks: call it at start-up.
    public static func open(timeoutSeconds: Int64, scope: String = "default") throws(VaultError) -> LibsecretStore {
        let store = LibsecretStore(timeoutSeconds: timeoutSeconds, scope: scope)
        let cancellable = Cancellable(timeoutSeconds: timeoutSeconds)
        try store.connect(cancellable)
        let (locked, label) = try store.defaultCollection(cancellable, "opening the store")
        store.location = "collection '\(label)' on the \(LibsecretStore.busDescription)"
        if locked {
            throw VaultError(
                .storeLocked,
                "the default collection '\(label)' on the \(LibsecretStore.busDescription) is locked, and a locked collection hides every session; unlock it (log in to the desktop, or 'gnome-keyring-daemon --unlock') and start vaultd again"
            )
        }
        return store
    }

    /// The session bus, for messages.
    static var busDescription: String {
        Environment.get("DBUS_SESSION_BUS_ADDRESS").map { "session bus \($0)" }
            ?? "session bus (DBUS_SESSION_BUS_ADDRESS not set)"
    }

    private init(timeoutSeconds: Int64, scope: String) {
        self.scope = scope
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
        for name in ["provider", "user", "scope", "revocation"] {
            g_hash_table_insert(pendingTypes.table, g_strdup(name), nil)
        }
        pendingRevocationSchema = secret_schema_newv(
            LibsecretStore.pendingRevocationSchemaName, SECRET_SCHEMA_NONE, pendingTypes.table)
        let keyTypes = GHashTableBox()
        for name in ["key_id", "scope"] { g_hash_table_insert(keyTypes.table, g_strdup(name), nil) }
        dataKeySchema = secret_schema_newv(LibsecretStore.dataKeySchemaName, SECRET_SCHEMA_NONE, keyTypes.table)
        location = "the Secret Service on the \(LibsecretStore.busDescription)"
    }

    deinit {
        secret_schema_unref(schema)
        secret_schema_unref(providerSecretSchema)
        secret_schema_unref(pendingRevocationSchema)
        secret_schema_unref(dataKeySchema)
        disconnect()
    }

    // MARK: The connection (on the store's lane after init)

    /// Opens a Secret Service of vaultd's own (not libsecret's shared
    /// default, which outlives the daemon it talked to) with a new session
    /// (the one that carries secrets). Its D-Bus connection is GLib's shared
    /// session-bus connection, which raises SIGTERM in the process when the bus
    /// goes away (exit-on-close): that is turned off, so a dead bus is an
    /// outage, not a stop. Once every holder of a closed connection let go of
    /// it, GLib opens a new one for the next service.
    private func connect(_ cancellable: Cancellable) throws(VaultError) {
        disconnect()
        // GDBus announces a closed connection (and drops what it held for it)
        // from idle callbacks on the default main context, which nothing else in
        // vaultd runs: run what is pending, so that a connection to a bus that
        // died is released and the next service gets a new one.
        // (Until nothing is pending: a `where` clause here would not stop the
        // loop, and 1,000 polls cost start-up more than its D-Bus calls.)
        for _ in 0..<1000 {
            if g_main_context_iteration(nil, 0) == 0 { break }
        }
        var error: UnsafeMutablePointer<GError>? = nil
        guard
            let newService = secret_service_open_sync(
                secret_service_get_type(), nil, SECRET_SERVICE_OPEN_SESSION, cancellable.pointer, &error)
        else {
            let reason = GLibFailure.take(&error)?.message ?? "no answer"
            throw VaultError(
                .storeUnavailable,
                "no Secret Service reachable on the \(LibsecretStore.busDescription): \(reason); start gnome-keyring or KeePassXC with its Secret Service integration, or run scripts/run, which starts a private keyring"
            )
        }
        service = OpaquePointer(newService)
        let proxy = UnsafeMutableRawPointer(newService).assumingMemoryBound(to: GDBusProxy.self)
        guard let connection = g_dbus_proxy_get_connection(proxy) else { return }
        g_dbus_connection_set_exit_on_close(connection, 0)
        if g_dbus_connection_is_closed(connection) != 0 {
            disconnect()
            throw VaultError(
                .storeUnavailable,
                "the connection to the \(LibsecretStore.busDescription) is closed and GLib hands out no new one yet; vaultd tries again"
            )
        }
    }

    /// Drops the service and its session.
    private func disconnect() {
        if let service { g_object_unref(UnsafeMutableRawPointer(service)) }
        service = nil
    }

    /// Whether the default collection is locked, and its label. A locked
    /// collection answers searches with nothing, exactly like an empty one.
    private func defaultCollection(_ cancellable: Cancellable, _ what: String) throws(VaultError) -> (
        locked: Bool, label: String
    ) {
        var error: UnsafeMutablePointer<GError>? = nil
        let collection = secret_collection_for_alias_sync(
            try servicePointer(), "default", SECRET_COLLECTION_NONE, cancellable.pointer, &error)
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
        guard let collection else {
            throw VaultError(
                .storeFailed,
                "the Secret Service on the \(LibsecretStore.busDescription) has no default collection; create one (e.g. with seahorse) or run scripts/run"
            )
        }
        defer { g_object_unref(UnsafeMutableRawPointer(collection)) }
        let locked = secret_collection_get_locked(collection) != 0
        let label = LibsecretStore.takeString(secret_collection_get_label(collection)) ?? "default"
        return (locked, label)
    }

    /// Throws `StoreLocked` when the default collection is locked: called
    /// before a miss is trusted. Asks two plain D-Bus questions (the alias's
    /// path, then its `Locked` property) rather than building a collection
    /// proxy (eight messages, four of them waited for), so the checks that
    /// start-up makes on an empty store cost little; the collection's label
    /// is read only for the error.
    func requireUnlocked(_ cancellable: Cancellable, _ what: String) throws(VaultError) {
        if try defaultCollectionLocked(cancellable, what) == false { return }
        let (locked, label) = try defaultCollection(cancellable, what)
        if locked {
            throw VaultError(
                .storeLocked,
                "\(what): the collection '\(label)' is locked, and a locked collection hides every session; unlock it (log in to the desktop, or 'gnome-keyring-daemon --unlock')"
            )
        }
    }

    /// Whether the default collection is locked, read as its `Locked`
    /// property; nil when that cannot be read this way (no default alias, an
    /// unexpected answer), and `defaultCollection` then says what is wrong.
    private func defaultCollectionLocked(_ cancellable: Cancellable, _ what: String) throws(VaultError) -> Bool? {
        let service = try servicePointer()
        var error: UnsafeMutablePointer<GError>? = nil
        let path = secret_service_read_alias_dbus_path_sync(service, "default", cancellable.pointer, &error)
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
        guard let path else { return nil }
        defer { g_free(path) }
        let proxy = UnsafeMutableRawPointer(service).assumingMemoryBound(to: GDBusProxy.self)
        guard let connection = g_dbus_proxy_get_connection(proxy), let name = g_dbus_proxy_get_name(proxy) else {
            return nil
        }
        var arguments: [OpaquePointer?] = [
            g_variant_new_string("org.freedesktop.Secret.Collection"), g_variant_new_string("Locked"),
        ]
        let parameters = arguments.withUnsafeMutableBufferPointer { g_variant_new_tuple($0.baseAddress, 2) }
        let reply = g_dbus_connection_call_sync(
            connection, name, path, "org.freedesktop.DBus.Properties", "Get", parameters, nil,
            G_DBUS_CALL_FLAGS_NONE, -1, cancellable.pointer, &error)
        if let failure = GLibFailure.take(&error) { throw self.failure(what, failure) }
        guard let reply else { return nil }
        defer { g_variant_unref(reply) }
        guard String(cString: g_variant_get_type_string(reply)) == "(v)" else { return nil }
        let boxed = g_variant_get_child_value(reply, 0)
        defer { g_variant_unref(boxed) }
        guard let value = g_variant_get_variant(boxed) else { return nil }
        defer { g_variant_unref(value) }
        guard String(cString: g_variant_get_type_string(value)) == "b" else { return nil }
        return g_variant_get_boolean(value) != 0
    }

    public func probe() async -> StoreProbe {
        do throws(VaultError) {
            return try await perform("checking the Secret Service") { cancellable throws(VaultError) -> StoreProbe in
                // From scratch: a service that went away took the session with it.
                try self.connect(cancellable)
                let (locked, label) = try self.defaultCollection(cancellable, "checking the Secret Service")
                self.location = "collection '\(label)' on the \(LibsecretStore.busDescription)"
                return locked ? .locked("the collection '\(label)' is locked") : .available
            }
        } catch {
            if error.code == .storeLocked { return .locked(error.message) }
            return .unavailable(error.message)
        }
    }

    /// The service of the current connection.
    func servicePointer() throws(VaultError) -> UnsafeMutablePointer<SecretService> {
        guard let service else {
            throw VaultError(
                .storeUnavailable,
                "vaultd is not connected to the Secret Service on the \(LibsecretStore.busDescription)")
        }
        return UnsafeMutablePointer<SecretService>(service)
    }

    /// Runs `body` on `WorkerPool`'s store worker (one call at
    /// a time) with a cancellable that fires after the timeout; a call that
    /// waited the whole timeout for its turn never starts.
    func perform<T: Sendable>(
        _ what: String, _ body: @escaping @Sendable (Cancellable) throws(VaultError) -> T
    ) async throws(VaultError) -> T {
        let deadline = Monotonic.milliseconds() + UInt64(timeoutSeconds) * 1000
        let result = await WorkerPool.shared.run(.store, lane: "secret-store", cap: 1, deadline: deadline) {
            () -> Result<T, VaultError> in
            let cancellable = Cancellable(timeoutSeconds: self.timeoutSeconds)
            do throws(VaultError) {
                return .success(try body(cancellable))
            } catch {
                return .failure(error)
            }
        }
        guard let result else {
            throw VaultError(
                .storeUnavailable,
                "\(what) in the Secret Service waited \(timeoutSeconds)s for the calls before it and was abandoned (\(location)); check that the keyring is running and unlocked"
            )
        }
        return try result.get()
    }

    /// The error of a failed call, classified once: the Secret Service or
    /// the bus gone (no owner of its name, no reply, the connection closed,
    /// a session the service no longer knows: it was restarted) is
    /// `StoreUnavailable`, which makes vaultd reconnect; a locked collection is
    /// `StoreLocked`; anything else is this call's `StoreFailed`.
    func failure(_ what: String, _ failure: GLibFailure) -> VaultError {
        let reason = failure.message
        switch LibsecretStore.classify(failure) {
        case .storeUnavailable where failure.cancelled:
            return VaultError(
                .storeUnavailable,
                "\(what) in the Secret Service took longer than \(timeoutSeconds)s and was abandoned (\(location)); check that the keyring is running and unlocked"
            )
        case .storeUnavailable:
            return VaultError(
                .storeUnavailable,
                "\(what) in the Secret Service failed, the service is gone (\(location)): \(reason); start gnome-keyring (or KeePassXC) again, vaultd reconnects on its own"
            )
        case .storeLocked:
            return VaultError(
                .storeLocked,
                "\(what) in the Secret Service failed, the collection is locked (\(location)): \(reason); unlock it (log in to the desktop, or 'gnome-keyring-daemon --unlock')"
            )
        default:
            return VaultError(.storeFailed, "\(what) in the Secret Service failed (\(location)): \(reason)")
        }
    }

    /// The code a GError stands for (see `failure`).
    static func classify(_ failure: GLibFailure) -> VaultError.Code {
        if failure.cancelled { return .storeUnavailable }
        switch failure.remoteName {
        case "org.freedesktop.Secret.Error.IsLocked": return .storeLocked
        // gnome-keyring restarted: the session vaultd opened with the old one is unknown.
        case "org.freedesktop.Secret.Error.NoSession": return .storeUnavailable
        default: break
        }
        if failure.domain == secret_error_get_quark() {
            if failure.code == Int32(SECRET_ERROR_IS_LOCKED.rawValue) { return .storeLocked }
            return .storeFailed
        }
        if failure.domain == g_io_error_quark() {
            switch failure.code {
            case Int32(G_IO_ERROR_CLOSED.rawValue), Int32(G_IO_ERROR_BROKEN_PIPE.rawValue),
                Int32(G_IO_ERROR_NOT_CONNECTED.rawValue),
                Int32(G_IO_ERROR_CONNECTION_REFUSED.rawValue), Int32(G_IO_ERROR_TIMED_OUT.rawValue),
                Int32(G_IO_ERROR_NOT_FOUND.rawValue), Int32(G_IO_ERROR_DBUS_ERROR.rawValue):
                return .storeUnavailable
            default: return .storeFailed
            }
        }
        if failure.domain == g_dbus_error_quark() {
            switch failure.code {
            case Int32(G_DBUS_ERROR_SERVICE_UNKNOWN.rawValue), Int32(G_DBUS_ERROR_NAME_HAS_NO_OWNER.rawValue),
                Int32(G_DBUS_ERROR_NO_REPLY.rawValue), Int32(G_DBUS_ERROR_DISCONNECTED.rawValue),
                Int32(G_DBUS_ERROR_NO_SERVER.rawValue), Int32(G_DBUS_ERROR_TIMEOUT.rawValue),
                Int32(G_DBUS_ERROR_TIMED_OUT.rawValue), Int32(G_DBUS_ERROR_NO_NETWORK.rawValue),
                Int32(G_DBUS_ERROR_UNKNOWN_OBJECT.rawValue), Int32(G_DBUS_ERROR_UNKNOWN_METHOD.rawValue),
                Int32(G_DBUS_ERROR_SPAWN_SERVICE_NOT_FOUND.rawValue), Int32(G_DBUS_ERROR_SPAWN_FAILED.rawValue):
                return .storeUnavailable
            default: break
            }
        }
        if failure.message.contains("session wrapping the secret does not exist") { return .storeUnavailable }
        return .storeFailed
    }
}
