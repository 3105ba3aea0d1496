import Varlink
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

/// A revocation that failed and waits to be tried again: the tokens of a
/// session that ended, under an id of its own, so that two sessions of one
/// account that both ended unrevoked are both kept.
public struct PendingRevocation: Sendable, Equatable {
    /// Random, unique per queued revocation; says nothing about the tokens.
    public var id: String
    /// The record whose tokens are to be revoked.
    public var record: SessionRecord
    /// Only the access token of `record` is to go, which a refresh replaced
    /// (`TokenProvider.revokeReplaced`); the session goes on.
    public var replaced = false

    /// A revocation with the given id.
    public init(id: String, record: SessionRecord, replaced: Bool = false) {
        self.id = id
        self.record = record
        self.replaced = replaced
    }

    /// A revocation of the access token of `old`, which a refresh replaced,
    /// under a new random id.
    public init(replacing old: SessionRecord) {
        self.init(queueing: old)
        replaced = true
    }

    /// A revocation of `record` under a new random id.
    public init(queueing record: SessionRecord) {
        var generator = SystemRandomNumberGenerator()
        let high = String(generator.next(), radix: 16)
        let low = String(generator.next(), radix: 16)
        self.init(
            id: String(repeating: "0", count: 16 - high.count) + high + String(repeating: "0", count: 16 - low.count)
                + low, record: record)
    }
}

extension PendingRevocation {
    /// The member of a queued revocation's document that holds its id.
    static let idMember = "revocationId"
    /// Marks a queued revocation of an access token a refresh replaced.
    static let replacedMember = "revocationOfReplaced"

    /// The queued revocation as a JSON document, the same in every store: the
    /// record's, with the id (and a mark when only the replaced access token
    /// is to go).
    public func storedJSON() -> JSON {
        guard case .object(var members) = record.storedJSON() else { return record.storedJSON() }
        members[Self.idMember] = .string(id)
        if replaced { members[Self.replacedMember] = true }
        return .object(members)
    }

    /// The queued revocation of `storedJSON()`, whose record `record` was
    /// read from the same document; nil when the document names no id
    /// (queued before revocations had ids).
    init?(storedJSON json: JSON, record: SessionRecord) {
        guard let id = json[Self.idMember]?.stringValue, !id.isEmpty else { return nil }
        self.init(id: id, record: record, replaced: json[Self.replacedMember]?.boolValue == true)
    }

    /// A queued revocation read from `storedJSON()`.
    public init(storedJSON json: JSON) throws(VaultError) {
        guard let revocation = PendingRevocation(storedJSON: json, record: try SessionRecord(storedJSON: json)) else {
            throw VaultError(.storeFailed, "stored revocation: id missing")
        }
        self = revocation
    }
}

/// Where session records are kept. Every call may block on D-Bus, so the
/// implementation runs it away from the caller's executor; callers just await.
public protocol SessionStore: Sendable {
    /// A one-line description for logs: which bus, which collection.
    var location: String { get }
    /// What brings the store back when it is unavailable, for the message
    /// of the calls refused meanwhile.
    var unavailableRemedy: String { get }
    /// Whether a call that found the store unavailable is worth one more
    /// try on a fresh connection (`StoreGate.pass`): a D-Bus session may be
    /// stale after the Secret Service restarted. False for a store whose
    /// client already tried every way in.
    var retriesOnFreshConnection: Bool { get }
    /// Every record of vaultd's schema.
    func loadAll() async throws(VaultError) -> StoreContents
    /// Writes (creates or replaces) the record of `record.key`.
    func save(_ record: SessionRecord) async throws(VaultError)
    /// Deletes the record of the session `key` (that owner's only); deleting a
    /// missing record succeeds.
    func delete(_ key: SessionKey) async throws(VaultError)
    /// Writes (creates or replaces) the OAuth 2.0 client secret of `provider`.
    func saveProviderSecret(_ provider: String, _ secret: Secret) async throws(VaultError)
    /// The client secret of `provider`, if one was stored.
    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret?
    /// Queues the revocation of a logged-out session's tokens.
    func savePendingRevocation(_ revocation: PendingRevocation) async throws(VaultError)
    /// Removes a queued revocation (that one only, by its id).
    func deletePendingRevocation(_ revocation: PendingRevocation) async throws(VaultError)
    /// Every queued revocation.
    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation]
    /// Checks the store from scratch (a new connection where there is one):
    /// reachable with its collection unlocked, unreachable, or locked. vaultd
    /// probes while the store is not available, to learn when it is back.
    func probe() async -> StoreProbe
    /// Called once at a clean stop, after the last write: puts everything
    /// where a copy of the store taken while vaultd is stopped finds it.
    func close() async
}

extension SessionStore {
    /// The Secret Service's remedy, unless a store names its own.
    public var unavailableRemedy: String { StoreHealth.secretServiceRemedy }
    /// One more try on a fresh connection, unless a store says otherwise.
    public var retriesOnFreshConnection: Bool { true }
    /// A store with nothing to reconnect (memory) is always available.
    public func probe() async -> StoreProbe { .available }
    /// Nothing to put away by default.
    public func close() async {}
}
