import VaultCore

/// The revision of a shared store: one number for the whole store, raised by
/// every write, so that the revision of a record says which of two writes
/// came last. etcd's `mod_revision`; 0 means "no record".
public typealias StoreRevision = UInt64

/// Why a session left a shared store, kept beside the delete (a tombstone),
/// so that every host ends it with the same event: `logoutSuccess`,
/// `kickedOffline`, `tokenExpired` or `tokenInvalid`, and the reason given.
public struct SessionEnding: Sendable, Equatable {
    /// The event every host sends for the end.
    public var kind: EventKind
    /// The reason the kick or the end gave; never a secret.
    public var reason: String?

    /// An ending of `kind`.
    public init(kind: EventKind, reason: String? = nil) {
        self.kind = kind
        self.reason = reason
    }
}

/// A record of a shared store with the revision of its last write.
public struct SharedRecord: Sendable, Equatable {
    /// The session as stored.
    public var record: SessionRecord
    /// The store's revision when it was written.
    public var revision: StoreRevision

    /// A record at `revision`.
    public init(_ record: SessionRecord, revision: StoreRevision) {
        self.record = record
        self.revision = revision
    }
}

/// What a shared store holds, read at one revision (a reload, or one session).
public struct SharedContents: Sendable {
    /// Every session's record.
    public var records: [SharedRecord]
    /// The endings of sessions deleted lately (tombstones the store still keeps).
    public var endings: [SessionKey: SessionEnding]
    /// The revision the contents were read at.
    public var revision: StoreRevision

    /// Makes contents.
    public init(records: [SharedRecord], endings: [SessionKey: SessionEnding], revision: StoreRevision) {
        self.records = records
        self.endings = endings
        self.revision = revision
    }
}

/// The answer to a write (etcd: a transaction, comparing the key's
/// `mod_revision` when the write is conditional).
public enum ConditionalSave: Sendable, Equatable {
    /// Written; the record is now at `revision`.
    case saved(revision: StoreRevision)
    /// Not written: the record is not at the revision compared. `current` is
    /// what the store holds (nil: nothing) at `revision`.
    case conflict(current: SessionRecord?, revision: StoreRevision)
}

/// A held refresh lock: it ends by itself at `expiresAt` (clock seconds)
/// unless released before. etcd: a key put under a lease with a TTL.
public struct RefreshLease: Sendable, Equatable {
    /// Names this holding (etcd: the lease id).
    public var id: UInt64
    /// When the lock ends by itself if its holder dies.
    public var expiresAt: Double

    /// A lease.
    public init(id: UInt64, expiresAt: Double) {
        self.id = id
        self.expiresAt = expiresAt
    }
}

/// The answer to a request for an account's refresh lock.
public enum RefreshLockAnswer: Sendable, Equatable {
    /// This host holds the lock until it releases it or `lease` ends.
    case granted(RefreshLease)
    /// `host` holds it, at the latest until `expiresAt` (clock seconds).
    case heldBy(host: String, expiresAt: Double)
}

/// A change of a shared store as one host's feed delivers it, in revision
/// order (etcd: a watch from the last revision seen).
public enum SharedChange: Sendable, Equatable {
    /// A record was written (by any host, this one too).
    case put(SessionRecord, revision: StoreRevision)
    /// A session's record was deleted; `ending` is its tombstone (nil: none
    /// was written, a plain delete, read as a logout).
    case deleted(SessionKey, ending: SessionEnding?, revision: StoreRevision)
    /// The refresh lock of a session was released, or lapsed with its
    /// holder's lease: a refresh waiting for that holder asks for it again
    /// now rather than at the lease's end it was told. A store whose feed
    /// cannot say so leaves the waiters to that end.
    case unlocked(SessionKey)
    /// Changes were lost (the feed broke and could not resume, etcd's
    /// compaction): reload everything with `loadShared(nil)`.
    case reset
}

/// A session store shared by several vaultd hosts (etcd). Every host serves
/// from memory and follows the store through `changes()`; a refresh is made
/// by the one host holding the account's refresh lock and written with
/// `save(_:ifRevision:)` over the revision read, so that no host hands out
/// tokens the store did not take. A call that cannot reach the store (no
/// quorum) fails with `storeUnavailable`, which makes the host read-only
/// until it is back.
///
/// Shaped so that etcd maps one to one: revision = `mod_revision`,
/// `save(_:ifRevision:)` = a txn comparing it, the lock = a key under a lease,
/// `changes()` = a watch resumed from the last revision (a compacted one
/// gives `reset`).
public protocol SharedSessionStore: SessionStore {
    /// What the store holds, read at one revision: with `key` nil, every
    /// session's record and the endings of sessions deleted lately; with a
    /// key, that session's record alone (none when there is none, no endings).
    func loadShared(_ key: SessionKey?) async throws(VaultError) -> SharedContents
    /// Writes `record` and removes its session's ending: with `ifRevision`
    /// only when the stored record of its key is at that revision (0: there
    /// is none), else whatever the store holds (a login, a logout's mark;
    /// `apply(.save(_:))` is this without the answer).
    func save(_ record: SessionRecord, ifRevision: StoreRevision?) async throws(VaultError) -> ConditionalSave
    /// Deletes the session's record and leaves `ending` for the other hosts;
    /// the revision of the delete.
    @discardableResult
    func delete(_ key: SessionKey, ending: SessionEnding) async throws(VaultError) -> StoreRevision
    /// Takes the refresh lock of `key` for this host, or says who holds it.
    func acquireRefreshLock(_ key: SessionKey) async throws(VaultError) -> RefreshLockAnswer
    /// Releases a lock this host holds (a lease that ended meanwhile is gone already).
    func releaseRefreshLock(_ key: SessionKey, lease: RefreshLease) async throws(VaultError)
    /// Whether this host surely holds `lease` still at `now` (clock
    /// seconds): asked right before the provider is, so that a lock lost
    /// meanwhile sends no refresh. A lease that is not renewed ends at
    /// `expiresAt` (the default).
    func stillHolds(_ lease: RefreshLease, at now: Double) -> Bool
    /// The changes after the last whole load (`loadAll`, `loadShared(nil)`;
    /// from now on when there was none), in revision order, this host's own
    /// writes too.
    func changes() -> AsyncStream<SharedChange>
}

extension SharedSessionStore {
    /// A lease ends at its `expiresAt`, unless a store renews it.
    public func stillHolds(_ lease: RefreshLease, at now: Double) -> Bool { now < lease.expiresAt }
}
