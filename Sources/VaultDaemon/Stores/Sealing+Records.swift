import VaultCore

/// What binds each kind of stored value to its place, the same in every
/// engine that seals (SQLite, etcd): a value copied onto another account,
/// owner or id fails to open.
extension Sealing {
    /// A session record's associated data: the account and its owner, by uid
    /// in a database of one host, by user name in a store a fleet shares.
    package static func sessionData(_ account: Account, owner: String) -> [UInt8] {
        associatedData(["session", account.provider, account.user, owner])
    }

    /// A queued revocation's associated data: its id and account.
    package static func revocationData(_ id: String, _ account: Account) -> [UInt8] {
        associatedData(["revocation", id, account.provider, account.user])
    }

    /// A provider's client secret's associated data.
    package static func providerSecretData(_ provider: String) -> [UInt8] {
        associatedData(["provider-secret", provider])
    }

    /// The plaintext of `sealed`, stored beside the id of the key it was
    /// sealed under, `keyID`: nil for a value sealed under another key than
    /// `key`, or damaged. The caller wipes it.
    package static func open(_ sealed: UnsafeRawBufferPointer, keyID: String, associatedData: [UInt8], key: DataKey)
        -> [UInt8]?
    {
        guard keyID == key.id else { return nil }
        return open(sealed, associatedData: associatedData, key: key)
    }
}
