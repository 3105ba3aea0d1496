import Glibc
import VaultCore
import VaultSystem

/// Which store a vaultd instance uses and where: the engine, the Secret
/// Service scope, the database file. The environment overrides the
/// configuration (`VAULTD_STORE`, `VAULTD_STORE_SCOPE`, `VAULTD_DATABASE`),
/// as `VAULTD_SOCKET` overrides the socket, for units and tests.
public struct StoreSelection: Sendable, Equatable {
    /// The engine.
    public var engine: StoreEngine
    /// The `scope` attribute of this instance's Secret Service items.
    public var scope: String
    /// The SQLite database file; nil when no default could be found (no home directory).
    public var databasePath: String?
    /// How long one store call may take, in seconds.
    public var timeoutSeconds: Int64
    /// How to reach etcd, for `Store=etcd` (`[Etcd]`).
    public var etcd = EtcdSettings()

    /// The selection `config` and the process environment make.
    public static func resolve(_ config: VaultConfig) throws(VaultError) -> StoreSelection {
        var text = ""
        if let engine = Environment.get("VAULTD_STORE"), !engine.isEmpty { text += "Store=\(engine)\n" }
        if let scope = Environment.get("VAULTD_STORE_SCOPE"), !scope.isEmpty { text += "StoreScope=\(scope)\n" }
        if let database = Environment.get("VAULTD_DATABASE"), !database.isEmpty { text += "Database=\(database)\n" }
        var effective = config
        if !text.isEmpty {
            let overrides = try ConfigParser.parse("[Vault]\n" + text, file: "the environment (VAULTD_STORE*)")
            if text.contains("Store=") { effective.storeEngine = overrides.storeEngine }
            if text.contains("StoreScope=") { effective.storeScope = overrides.storeScope }
            if text.contains("Database=") { effective.databasePath = overrides.databasePath }
        }
        let path =
            effective.databasePath
            ?? SQLiteStore.defaultPath(environment: Environment.all(), uid: geteuid(), home: Files.homeDirectory())
        var selection = StoreSelection(
            engine: effective.storeEngine, scope: effective.storeScope, databasePath: path,
            timeoutSeconds: effective.storeTimeoutSeconds)
        selection.etcd = effective.etcd
        if selection.engine == .etcd { try checkEtcd(effective.etcd) }
        return selection
    }

    /// `Store=etcd` needs an endpoint, and the TLS files it names must be
    /// readable by vaultd (checked at `--check-config` and at start, never
    /// at the first call).
    static func checkEtcd(_ etcd: EtcdSettings) throws(VaultError) {
        guard !etcd.endpoints.isEmpty else {
            throw VaultError(
                .invalidConfig,
                "Store=etcd needs the etcd members' URLs: add an [Etcd] section with Endpoints=, such as Endpoints=http://127.0.0.1:2379"
            )
        }
        for (key, path) in [("CAFile", etcd.caFile), ("CertFile", etcd.certFile), ("KeyFile", etcd.keyFile)] {
            guard let path else { continue }
            guard access(path, R_OK) == 0 else {
                throw VaultError(
                    .invalidConfig,
                    "[Etcd] \(key)=\(path): vaultd cannot read it (\(SystemError("access"))); make it readable by vaultd's user"
                )
            }
        }
    }

    /// The database file, or an error saying how to name one.
    public func requireDatabasePath() throws(VaultError) -> String {
        guard let databasePath else {
            throw VaultError(
                .invalidConfig,
                "Store=sqlite needs a database file, and no default was found (no $STATE_DIRECTORY, $XDG_STATE_HOME or home directory); set Database= in [Vault]"
            )
        }
        return databasePath
    }

    /// The one-line description for `--check-config`.
    public var summary: String {
        switch engine {
        case .secretService: return "store: secret-service (scope \(scope))"
        case .sqlite: return "store: sqlite \(databasePath ?? "(no database path: set Database=)")"
        case .etcd:
            return
                "store: etcd \(etcd.endpoints.joined(separator: " ")) (prefix \(etcd.keyPrefix), timeout \(etcd.timeoutSeconds)s)"
        }
    }
}

/// Opens the fleet's shared store of `settings` with the fleet's data key
/// (nil when systemd passed none), renewing a refresh lock for at most
/// `refreshHoldSeconds`. The executable passes VaultFleet's etcd store.
public typealias SharedStoreOpener =
    @Sendable (_ settings: EtcdSettings, _ keys: CredentialDataKeys?, _ log: Logger, _ refreshHoldSeconds: Double)
    async throws(VaultError) -> any SharedSessionStore

extension Daemon {
    /// The store `options` and `config` ask for: memory (with a warning, and
    /// no D-Bus at all), the Secret Service in the configured scope, the
    /// SQLite database with its data key, or the fleet's (`openShared`).
    static func openStore(
        _ options: DaemonOptions, config: VaultConfig, log: Logger, openShared: @escaping SharedStoreOpener
    ) throws(VaultError) -> any SessionStore {
        if options.memoryStore {
            log.warning(
                "--memory-store: sessions are kept in memory only and will not survive a restart; this mode is meant for benchmarks and tests",
                ["store": "memory"])
            return MemoryStore()
        }
        let selection = try StoreSelection.resolve(config)
        switch selection.engine {
        case .secretService:
            return try LibsecretStore.open(timeoutSeconds: selection.timeoutSeconds, scope: selection.scope)
        case .sqlite:
            return try openSQLite(selection, log: log)
        case .etcd:
            return try openEtcd(selection, config: config, log: log, openShared: openShared)
        }
    }

    /// The etcd store of `selection`, its key from the credential `data-key` only.
    /// A refresh lock is renewed for as long as a refresh under it may take:
    /// the slowest provider's call (30 s at least) and the store calls around
    /// it (a read before, up to four conditional writes after), a second each spare.
    static func openEtcd(
        _ selection: StoreSelection, config: VaultConfig, log: Logger, openShared: @escaping SharedStoreOpener
    ) throws(VaultError) -> any SharedSessionStore {
        let keys = CredentialDataKeys.fromEnvironment()
        let slowest = config.providers.values.map { $0.oauth2?.timeoutSeconds ?? $0.exec?.timeoutSeconds ?? 0 }.max()
        let hold = Double(max(slowest ?? 0, 30) + 5 * (selection.etcd.timeoutSeconds + 1))
        return try blocking { () async throws(VaultError) in
            try await openShared(selection.etcd, keys, log, hold)
        }
    }

    /// The SQLite store of `selection`, its key from the credential `data-key`
    /// when systemd passed one, else from the Secret Service.
    static func openSQLite(_ selection: StoreSelection, log: Logger) throws(VaultError) -> SQLiteStore {
        let path = try selection.requireDatabasePath()
        let keys = try dataKeySource(selection)
        return try blocking { () async throws(VaultError) in
            try await SQLiteStore.open(path: path, keys: keys, timeoutSeconds: selection.timeoutSeconds, log: log)
        }
    }

    /// Where the data key comes from: the credential `data-key` when it
    /// exists, else the Secret Service (which must then be reachable).
    static func dataKeySource(_ selection: StoreSelection) throws(VaultError) -> any DataKeySource {
        if let credential = CredentialDataKeys.fromEnvironment() { return credential }
        do {
            let keyring = try LibsecretStore.open(timeoutSeconds: selection.timeoutSeconds, scope: selection.scope)
            return SecretServiceDataKeys(store: keyring)
        } catch {
            throw VaultError(
                error.code,
                "the session database's data key comes from the credential \(CredentialDataKeys.name) ($CREDENTIALS_DIRECTORY/\(CredentialDataKeys.name)), which is not there, or from the Secret Service, which failed: \(error.message)"
            )
        }
    }
}
