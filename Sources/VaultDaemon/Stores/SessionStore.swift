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

/// What a store says of itself: where it keeps sessions, what brings it
/// back when it is unavailable, and whether a fresh connection may help.
public struct StoreProfile: Sendable {
    /// A one-line description for logs: which bus, which collection.
    public var location: String
    /// What brings the store back when it is unavailable, for the message
    /// of the calls refused meanwhile.
    public var remedy: String
    /// Whether a call that found the store unavailable is worth one more
    /// try on a fresh connection (`StoreGate.pass`): a D-Bus session may be
    /// stale after the Secret Service restarted. False for a store whose
    /// client already tried every way in.
    public var retriesOnFreshConnection: Bool

    /// A profile; the Secret Service's remedy and a retry unless said otherwise.
    public init(
        location: String, remedy: String = StoreHealth.secretServiceRemedy, retriesOnFreshConnection: Bool = true
    ) {
        self.location = location
        self.remedy = remedy
        self.retriesOnFreshConnection = retriesOnFreshConnection
    }
}

/// One write to a store. Every write is idempotent: a record replaced, a
/// delete of nothing succeeds.
public enum StoreChange: Sendable {
    /// Writes (creates or replaces) the record of `record.key`.
    case save(SessionRecord)
    /// Deletes the record of the session (that owner's only).
    case delete(SessionKey)
    /// Writes (creates or replaces) the OAuth 2.0 client secret of a provider.
    case saveProviderSecret(String, Secret)
    /// Queues the revocation of a logged-out session's tokens.
    case savePendingRevocation(PendingRevocation)
    /// Removes a queued revocation (that one only, by its id).
    case deletePendingRevocation(PendingRevocation)

    /// What the write does, for error messages; never a secret.
    public var summary: String {
        switch self {
        case .save(let record): "writing \(record.account)"
        case .delete(let key): "deleting \(key)"
        case .saveProviderSecret(let provider, _): "writing the client secret of \(provider)"
        case .savePendingRevocation(let revocation): "queueing the revocation of \(revocation.record.account)"
        case .deletePendingRevocation(let revocation):
            "removing the queued revocation of \(revocation.record.account)"
        }
    }
}

/// Where session records are kept. Every call may block on D-Bus, so the
/// implementation runs it away from the caller's executor; callers just await.
public protocol SessionStore: Sendable {
    /// Where the store is, what brings it back, whether to retry.
    var profile: StoreProfile { get }
    /// Every record of vaultd's schema.
    func loadAll() async throws(VaultError) -> StoreContents
    /// Makes one write.
    func apply(_ change: StoreChange) async throws(VaultError)
    /// The client secret of `provider`, if one was stored.
    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret?
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
    /// A store with nothing to reconnect (memory) is always available.
    public func probe() async -> StoreProbe { .available }
    /// Nothing to put away by default.
    public func close() async {}
}
