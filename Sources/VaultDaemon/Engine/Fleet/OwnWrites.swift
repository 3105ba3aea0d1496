import Synchronization
import VaultCore

/// The shared store as a fleet host's gate sees it: every call goes to the
/// store, and the revision of each of this host's own plain writes and
/// deletes is kept (`last`), so that an older change the feed brings before
/// the write itself (another host's earlier login or logout) does not undo
/// it (`FleetHost.knownRevision`). A plain save asks the store for its
/// revision (`save(_:ifRevision: nil)`).
final class OwnWrites: SessionStore {
    /// The store the fleet shares.
    let shared: any SharedSessionStore
    /// Per session, the revision of this host's latest own write.
    private let revisions = Mutex<[SessionKey: StoreRevision]>([:])

    init(_ shared: any SharedSessionStore) { self.shared = shared }

    /// The revision of this host's latest write of `key` (0: none).
    func last(_ key: SessionKey) -> StoreRevision { revisions.withLock { $0[key] ?? 0 } }

    /// Notes a write of this host's at `revision`.
    func note(_ key: SessionKey, _ revision: StoreRevision) {
        revisions.withLock { $0[key] = max($0[key] ?? 0, revision) }
    }

    var profile: StoreProfile { shared.profile }

    func loadAll() async throws(VaultError) -> StoreContents { try await shared.loadAll() }

    func apply(_ change: StoreChange) async throws(VaultError) {
        guard case .save(let record) = change else { return try await shared.apply(change) }
        if case .saved(let revision) = try await shared.save(record, ifRevision: nil) { note(record.key, revision) }
    }

    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try await shared.loadProviderSecret(provider)
    }

    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await shared.loadPendingRevocations()
    }

    func probe() async -> StoreProbe { await shared.probe() }

    func close() async { await shared.close() }
}

/// A fleet host's calls to the shared store, each through the manager's gate.
struct FleetStore: Sendable {
    /// The manager's gate, whose inner store is `writes`.
    let gate: StoreGate
    /// The shared store, and this host's own writes to it.
    let writes: OwnWrites
    var shared: any SharedSessionStore { writes.shared }

    func loadShared() async throws(VaultError) -> SharedContents {
        try await gate.pass { () async throws(VaultError) in try await shared.loadShared(nil) }
    }

    func loadShared(_ key: SessionKey) async throws(VaultError) -> SharedRecord? {
        try await gate.pass { () async throws(VaultError) in try await shared.loadShared(key).records.first }
    }

    func saveShared(_ record: SessionRecord, ifRevision: StoreRevision) async throws(VaultError) -> ConditionalSave {
        try await gate.pass { () async throws(VaultError) in try await shared.save(record, ifRevision: ifRevision) }
    }

    func deleteShared(_ key: SessionKey, ending: SessionEnding) async throws(VaultError) {
        let revision = try await gate.pass { () async throws(VaultError) in
            try await shared.delete(key, ending: ending)
        }
        writes.note(key, revision)
    }

    func acquireRefreshLock(_ key: SessionKey) async throws(VaultError) -> RefreshLockAnswer {
        try await gate.pass { () async throws(VaultError) in try await shared.acquireRefreshLock(key) }
    }

    func releaseRefreshLock(_ key: SessionKey, lease: RefreshLease) async throws(VaultError) {
        try await gate.pass { () async throws(VaultError) in try await shared.releaseRefreshLock(key, lease: lease) }
    }
}
