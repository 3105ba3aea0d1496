import Glibc
import VaultCore
import VaultProtocol
import VaultSystem

/// A one-off job on the store that vaultd runs instead of serving, then exits:
/// `--rotate-key` or `--migrate-store FROM TO`.
public enum StoreJob: Sendable, Equatable {
    /// Seal every row of the SQLite store under a new data key.
    case rotateKey
    /// Move every stored item from one engine to the other.
    case migrateStore(from: StoreEngine, to: StoreEngine)

    /// The engine named `name` on the command line of `option`.
    static func engine(_ name: String, option: String) throws(VaultError) -> StoreEngine {
        guard let engine = StoreEngine(rawValue: name) else {
            throw VaultError(
                .invalidParameter, "\(option): unknown store engine '\(name)' (one of: secret-service, sqlite)")
        }
        return engine
    }
}

extension Daemon {
    /// Runs `job` against the store `config` selects, prints what it did on
    /// stdout and returns the exit status.
    static func runStoreJob(_ job: StoreJob, options: DaemonOptions, config: VaultConfig, log: Logger)
        throws(VaultError) -> Int32
    {
        if options.memoryStore {
            throw VaultError(.invalidParameter, "--memory-store keeps nothing to rotate or migrate; leave it out")
        }
        let selection = try StoreSelection.resolve(config)
        let lines: [String]
        switch job {
        case .rotateKey: lines = try KeyRotation.run(selection: selection, log: log)
        case .migrateStore(let from, let to):
            // A vaultd on the Secret Service engine holds no database lock: look for one on the socket.
            try RunningInstance.refuseIfServed(
                options.socketPath ?? SocketPath.default(environment: Environment.all(), uid: getuid()))
            lines = try StoreMigration.run(from: from, to: to, selection: selection, log: log)
        }
        for line in lines { print(line) }
        return 0
    }
}

/// `vaultd --rotate-key`: seals every row of the configured SQLite store under
/// a new data key.
///
/// With the key in the Secret Service, the new key is stored as an item of
/// its own first, then every row is sealed again under it in one
/// transaction, then the old key's item is deleted (`SQLiteStore.rotate`): a
/// kill between the steps leaves a database sealed under a key the keyring
/// still holds. With the key from the credential `data-key`, the service
/// manager holds the keys: the new key is given as `data-key` and the old one
/// as `data-key.previous`, and opening the store seals every row under the
/// new one, as vaultd does at start; `--rotate-key` does that and says so.
enum KeyRotation {
    static func run(selection: StoreSelection, log: Logger) throws(VaultError) -> [String] {
        guard selection.engine == .sqlite else {
            throw VaultError(
                .invalidParameter,
                "--rotate-key rotates the data key of the SQLite store, and this instance's store is \(selection.engine.rawValue) (Store= in [Vault], or VAULTD_STORE), whose items the keyring itself protects"
            )
        }
        let path = try selection.requireDatabasePath()
        guard Files.exists(path) else {
            throw VaultError(
                .invalidParameter, "there is no session database at \(path): nothing to rotate (set Database= to it)")
        }
        let lock = try DatabaseLock.acquire(for: path)
        let keys = KillPointKeys(base: try Daemon.dataKeySource(selection))
        return try Daemon.blocking { () async throws(VaultError) -> [String] in
            let before = try? MigrationTarget.keyID(path, timeoutSeconds: selection.timeoutSeconds)
            let store = try await SQLiteStore.open(
                path: path, keys: keys, timeoutSeconds: selection.timeoutSeconds, log: log, lock: lock)
            let opened = try MigrationTarget.keyID(path, timeoutSeconds: selection.timeoutSeconds)
            if keys.base is CredentialDataKeys, let before = before ?? nil, before.id != opened?.id {
                return [
                    "sealed \(before.rows) rows of \(path) again, from data key \(before.id) (credential \(CredentialDataKeys.previousName)) to \(opened?.id ?? "?") (credential \(CredentialDataKeys.name)); \(CredentialDataKeys.previousName) is no longer needed: remove it from the unit"
                ]
            }
            if keys.base is CredentialDataKeys, let opened {
                return [
                    "every row of \(path) is sealed under the credential \(CredentialDataKeys.name) (key \(opened.id)): nothing to rotate. To rotate, give vaultd the new key as the credential \(CredentialDataKeys.name) and this one as \(CredentialDataKeys.previousName)"
                ]
            }
            let rotated = try await store.rotate(keys: keys)
            var lines = [
                "rotated the data key of \(path) from \(rotated.from) to \(rotated.to): \(rotated.rows) rows sealed again"
            ]
            if keys.base is SecretServiceDataKeys {
                lines.append(
                    "the new key is in the Secret Service (\(LibsecretStore.dataKeySchemaName)); the old one's item was deleted"
                )
            }
            return lines
        }
    }
}

/// The data key source of a rotation, with the test hook `KillPoint` at
/// its steps: after the new key is kept, after every row is sealed under it.
struct KillPointKeys: DataKeySource {
    let base: any DataKeySource

    var description: String { base.description }
    func keyForNewDatabase() async throws(VaultError) -> DataKey { try await base.keyForNewDatabase() }
    func key(id: String) async throws(VaultError) -> DataKey? { try await base.key(id: id) }
    func preferredKey() async throws(VaultError) -> DataKey? { try await base.preferredKey() }
    func missingKeyAdvice(id: String) async -> String { await base.missingKeyAdvice(id: id) }

    func keyToRotateTo(from current: DataKey) async throws(VaultError) -> DataKey {
        let key = try await base.keyToRotateTo(from: current)
        KillPoint.reached("rotate-key-kept")
        return key
    }

    func retireKeys(except keep: DataKey) async throws(VaultError) {
        KillPoint.reached("rotate-resealed")
        try await base.retireKeys(except: keep)
    }
}

extension MigrationTarget {
    /// The key id the database at `path` names and how many rows are sealed under it.
    static func keyID(_ path: String, timeoutSeconds: Int64) throws(VaultError) -> (id: String, rows: Int)? {
        let database = try SQLiteDatabase(path: path, timeoutSeconds: timeoutSeconds)
        guard
            let id = try database.statement("SELECT value FROM meta WHERE name = 'key_id'", "reading the key id")
                .first({ $0.text(0) })
        else { return nil }
        var rows = 0
        for table in ["sessions", "revocations", "provider_secrets"] {
            rows += Int(
                try database.statement("SELECT count(*) FROM \(table) WHERE key_id = ?", "counting \(table)")
                    .bind(.text(id)).first { $0.int(0) } ?? 0)
        }
        return (id, rows)
    }
}
