import VaultCore

/// What start-up finds in the store.
public struct StoreContents: Sendable {
    /// Records that decoded.
    public var records: [SessionRecord]
    /// Labels of items of vaultd's schema whose secret could not be read as a record.
    public var unreadable: [String]

    /// Makes a result.
    public init(records: [SessionRecord], unreadable: [String]) {
        self.records = records
        self.unreadable = unreadable
    }
}

/// Where session records are kept. Every call may block on D-Bus, so the
/// implementation runs it away from the caller's executor; callers just await.
public protocol SessionStore: Sendable {
    /// A one-line description for logs: which bus, which collection.
    var location: String { get }
    /// Every record of vaultd's schema.
    func loadAll() async throws(VaultError) -> StoreContents
    /// Writes (creates or replaces) the record of `record.account`.
    func save(_ record: SessionRecord) async throws(VaultError)
    /// Deletes the record of `account`; deleting a missing record succeeds.
    func delete(_ account: Account) async throws(VaultError)
    /// Writes (creates or replaces) the OAuth 2.0 client secret of `provider`.
    func saveProviderSecret(_ provider: String, _ secret: Secret) async throws(VaultError)
    /// The client secret of `provider`, if one was stored.
    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret?
    /// Queues the revocation of a logged-out session's tokens.
    func savePendingRevocation(_ record: SessionRecord) async throws(VaultError)
    /// Removes a queued revocation.
    func deletePendingRevocation(_ account: Account) async throws(VaultError)
    /// Every queued revocation.
    func loadPendingRevocations() async throws(VaultError) -> [SessionRecord]
}
