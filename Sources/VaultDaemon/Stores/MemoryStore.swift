import Synchronization
import VaultCore

/// A session store that keeps everything in this process's memory: session
/// records, client secrets and queued revocations are lost when vaultd stops.
///
/// For benchmarks and tests (`vaultd --memory-store`): it needs no D-Bus and
/// no keyring, and a write costs a dictionary update, so figures measured on
/// it show vaultd's own cost (for example 100,000 scheduled sessions, which
/// gnome-keyring would take hours to hold). Never a place for real sessions.
public final class MemoryStore: SessionStore {
    /// What the store holds; one lock guards all of it.
    private struct Contents {
        var records: [SessionKey: SessionRecord] = [:]
        var providerSecrets: [String: Secret] = [:]
        var pendingRevocations: [String: PendingRevocation] = [:]
    }

    private let contents = Mutex(Contents())

    /// Says where sessions are kept, and that they do not outlive the process.
    public let profile = StoreProfile(location: "memory (sessions are lost when vaultd stops)")

    /// An empty store.
    public init() {}

    /// Every record, in key order (the keyring gives no order either; a
    /// fixed one keeps start-up deterministic).
    public func loadAll() async throws(VaultError) -> StoreContents {
        let records = contents.withLock { $0.records.values.sorted { $0.key < $1.key } }
        return StoreContents(records: records, unreadable: [])
    }

    /// Makes the write in memory.
    public func apply(_ change: StoreChange) async throws(VaultError) {
        contents.withLock { contents in
            switch change {
            case .save(let record): contents.records[record.key] = record
            case .delete(let key): contents.records[key] = nil
            case .saveProviderSecret(let provider, let secret): contents.providerSecrets[provider] = secret
            case .savePendingRevocation(let revocation): contents.pendingRevocations[revocation.id] = revocation
            case .deletePendingRevocation(let revocation): contents.pendingRevocations[revocation.id] = nil
            }
        }
    }

    /// The client secret of `provider`, if one was saved in this run.
    public func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        contents.withLock { $0.providerSecrets[provider] }
    }

    /// Every queued revocation, in account order.
    public func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        contents.withLock {
            $0.pendingRevocations.values.sorted { ($0.record.account, $0.id) < ($1.record.account, $1.id) }
        }
    }
}
