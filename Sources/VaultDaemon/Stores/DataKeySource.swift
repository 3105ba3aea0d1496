import Glibc
import VaultCore
import VaultSystem

/// Where the SQLite engine's data key comes from: a systemd credential, or
/// one item in the Secret Service.
public protocol DataKeySource: Sendable {
    /// Names the source in logs and messages ("credential data-key", ...).
    var description: String { get }
    /// The key a new database is sealed under (created if the source has none
    /// and can make one).
    func keyForNewDatabase() async throws(VaultError) -> DataKey
    /// The key with the id `id`, or nil when the source does not hold it.
    func key(id: String) async throws(VaultError) -> DataKey?
    /// The key the source wants rows sealed under from now on, when that is
    /// not simply the key they are sealed under (a credential whose key was
    /// replaced, with the old one kept as `data-key.previous`); nil otherwise.
    func preferredKey() async throws(VaultError) -> DataKey?
    /// A key to rotate to (`vaultd --rotate-key`), kept by the source before
    /// any row is sealed under it.
    func keyToRotateTo(from current: DataKey) async throws(VaultError) -> DataKey
    /// Forgets every key but `keep` once no row needs them (after a rotation).
    func retireKeys(except keep: DataKey) async throws(VaultError)
    /// What to do when no key of the source opens a database sealed under `id`.
    func missingKeyAdvice(id: String) async -> String
}

/// The data key from systemd's credentials: `$CREDENTIALS_DIRECTORY/data-key`
/// (32 bytes; `LoadCredentialEncrypted=` keeps it sealed with the TPM2 or the
/// host key at rest), and during a rotation the key it replaces,
/// `$CREDENTIALS_DIRECTORY/data-key.previous`.
public struct CredentialDataKeys: DataKeySource {
    /// The name of the credential holding the key.
    public static let name = "data-key"
    /// The name of the credential holding the key being rotated away.
    public static let previousName = "data-key.previous"
    /// `$CREDENTIALS_DIRECTORY`.
    public let directory: String

    /// The credential source in `directory`, when it holds a `data-key`.
    public static func fromEnvironment() -> CredentialDataKeys? {
        guard let directory = Environment.get("CREDENTIALS_DIRECTORY"), !directory.isEmpty,
            Files.exists(directory + "/" + name)
        else { return nil }
        return CredentialDataKeys(directory: directory)
    }

    /// The source reading the credentials in `directory`.
    public init(directory: String) { self.directory = directory }

    public var description: String { "credential \(CredentialDataKeys.name) (\(directory)/\(CredentialDataKeys.name))" }

    private func read(_ name: String) throws(VaultError) -> DataKey? {
        let path = directory + "/" + name
        guard Files.exists(path) else { return nil }
        var bytes: [UInt8]
        do { bytes = try Files.read(path, limit: 4096) } catch {
            throw VaultError(.storeFailed, "cannot read the credential \(name) (\(path)): \(error)")
        }
        defer { bytes.wipe() }
        return try DataKey(copying: bytes, source: "the credential \(name) (\(path))")
    }

    public func keyForNewDatabase() async throws(VaultError) -> DataKey {
        guard let key = try read(CredentialDataKeys.name) else {
            throw VaultError(.storeFailed, "the credential \(CredentialDataKeys.name) is missing from \(directory)")
        }
        return key
    }

    public func key(id: String) async throws(VaultError) -> DataKey? {
        for name in [CredentialDataKeys.name, CredentialDataKeys.previousName] {
            if let key = try read(name), key.id == id { return key }
        }
        return nil
    }

    public func preferredKey() async throws(VaultError) -> DataKey? { try read(CredentialDataKeys.name) }

    public func keyToRotateTo(from current: DataKey) async throws(VaultError) -> DataKey {
        let next = try await keyForNewDatabase()
        guard next.id != current.id else {
            throw VaultError(
                .invalidParameter,
                "the database is already sealed under the credential \(CredentialDataKeys.name) (key \(next.id)); to rotate, give vaultd the new key as the credential \(CredentialDataKeys.name) and the current one as \(CredentialDataKeys.previousName)"
            )
        }
        return next
    }

    /// Credentials are the service manager's: vaultd cannot remove one.
    public func retireKeys(except keep: DataKey) async throws(VaultError) {}

    public func missingKeyAdvice(id: String) async -> String {
        var held: [String] = []
        for name in [CredentialDataKeys.name, CredentialDataKeys.previousName] {
            if let key = try? read(name) { held.append("\(name) holds key \(key.id)") }
        }
        return
            "the credentials in \(directory) do not hold it (\(held.joined(separator: ", "))); give vaultd the key the database was sealed with, as \(CredentialDataKeys.name), or as \(CredentialDataKeys.previousName) beside a new \(CredentialDataKeys.name) to rotate"
    }
}

/// The data key kept as one Secret Service item (schema `io.vaultd.DataKey`,
/// attributes `key_id` and `scope`), created on first use: for a user's
/// instance, whose login keyring is already unlocked with the desktop.
public struct SecretServiceDataKeys: DataKeySource {
    let store: LibsecretStore

    /// The source keeping its keys in `store`'s collection.
    public init(store: LibsecretStore) { self.store = store }

    public var description: String {
        "Secret Service item \(LibsecretStore.dataKeySchemaName) in \(store.location)"
    }

    public func keyForNewDatabase() async throws(VaultError) -> DataKey {
        if let existing = try await store.loadDataKeys().first { return existing }
        let key = DataKey.random()
        try await store.saveDataKey(key)
        return key
    }

    public func key(id: String) async throws(VaultError) -> DataKey? {
        try await store.loadDataKeys(id: id).first
    }

    public func preferredKey() async throws(VaultError) -> DataKey? { nil }

    public func keyToRotateTo(from current: DataKey) async throws(VaultError) -> DataKey {
        let key = DataKey.random()
        try await store.saveDataKey(key)
        return key
    }

    public func retireKeys(except keep: DataKey) async throws(VaultError) {
        for key in try await store.loadDataKeys() where key.id != keep.id {
            try await store.deleteDataKey(id: key.id)
        }
    }

    public func missingKeyAdvice(id: String) async -> String {
        "no item of schema \(LibsecretStore.dataKeySchemaName) with key_id \(id) is in \(store.location); unlock or restore the keyring that holds it, or move the database away to start with no sessions"
    }
}
