import VaultCore

/// What differs between a single host and a host of a fleet, asked for at
/// the few points where a change of a session meets the store: reading a
/// session the table lacks, refreshing, writing again what the store may
/// lack, deleting, catching up after an outage, following other hosts. A
/// single host (`SingleHost`) keeps its own store; a host of a fleet
/// (`FleetHost`, Engine/Fleet/) shares one with other hosts. The manager
/// holds one of the two, chosen once by its store, and branches on neither.
///
/// The requirements that take the manager run on it (`isolated`), and
/// read and change its state as its own methods do.
protocol StoreSharing: AnyObject {
    /// Tokens obtained by a refresh whose session changed meanwhile are
    /// revoked even when the session is still served with newer tokens:
    /// true on a single host. A fleet drops them unrevoked: they may belong
    /// to the grant of the tokens another host stored (RFC 7009 2.1).
    var revokesSupersededTokens: Bool { get }

    /// Reads `key` from the store for a client, when this host does not
    /// know the session: another host may have logged it in.
    func catchUp(_ key: SessionKey, _ manager: isolated SessionManager) async throws(VaultError)

    /// A refresh of `key` was decided and its task is about to start.
    func refreshDecided(_ key: SessionKey)

    /// Asks the provider for new tokens from `snapshot` and writes them
    /// before anyone gets them (`SessionManager.performRefresh`).
    func refresh(
        _ key: SessionKey, entryID: UInt64, provider: any TokenProvider, snapshot: SessionRecord,
        _ manager: isolated SessionManager
    ) async -> Result<SessionRecord, VaultError>

    /// Writes again what the session `entryID` of `key` serves and the store
    /// may lack, then tells its timers whether that worked.
    func persist(_ key: SessionKey, entryID: UInt64, _ manager: isolated SessionManager) async

    /// Deletes the record of a session logged out here (`SessionWrite`),
    /// off the manager: it reads nothing of it.
    var deleteRecord: @Sendable (SessionKey, SessionEnding) async throws(VaultError) -> Void { get }

    /// The store is back after an outage: makes it hold what is served.
    func writeThrough(_ manager: isolated SessionManager) async

    /// Starts following other hosts' changes, after the restore.
    func follow(_ manager: isolated SessionManager)

    /// Stops following, first thing at shutdown.
    func stopFollowing(_ manager: isolated SessionManager)

    /// One last write, at shutdown, of refreshed tokens the store lacks.
    func saveBeforeStopping(_ key: SessionKey, entryID: UInt64, _ manager: isolated SessionManager) async
}

/// How the refreshed tokens' write ended (`SessionManager.performRefresh`).
enum RefreshWrite {
    /// Written, or not (`failure`): the tokens are served either way, and
    /// an unsaved write is retried.
    case written(failure: VaultError?)
    /// Not written, and the refresh ends with this answer: the store holds
    /// another host's newer change.
    case superseded(Result<SessionRecord, VaultError>)
}

/// A single host: its store holds only what this process wrote.
final class SingleHost: StoreSharing {
    /// The manager's store, behind its gate.
    let store: any SessionStore

    init(_ store: any SessionStore) { self.store = store }

    var revokesSupersededTokens: Bool { true }

    func catchUp(_ key: SessionKey, _ manager: isolated SessionManager) async throws(VaultError) {}

    func refreshDecided(_ key: SessionKey) {}

    func refresh(
        _ key: SessionKey, entryID: UInt64, provider: any TokenProvider, snapshot: SessionRecord,
        _ manager: isolated SessionManager
    ) async -> Result<SessionRecord, VaultError> {
        await manager.performRefresh(key, entryID: entryID, provider: provider, snapshot: snapshot) { record in
            // The write goes ahead of every store call waiting (it waits for
            // the one in progress only), unless an earlier write of this
            // session is still out (its tokens were unsaved): that one holds
            // older tokens and must land first.
            let store = manager.store
            let write = { () async -> VaultError? in
                do throws(VaultError) {
                    try await store.apply(.save(record))
                    return nil
                } catch {
                    return error
                }
            }
            let mustFollow = manager.entries[key]?.timers.status.unsaved == true
            return .written(failure: mustFollow ? await write() : await WorkerPool.urgent(write))
        }
    }

    func persist(_ key: SessionKey, entryID: UInt64, _ manager: isolated SessionManager) async {
        // What is served now, read after the caller's awaits: a refresh may
        // have written newer tokens meanwhile, and writing the record read
        // before it would put the older tokens (a rotated-away refresh token) back.
        guard var record = manager.entries[key]?.record, manager.entries[key]?.id == entryID else { return }
        for _ in 0..<3 {
            do throws(VaultError) {
                try await manager.store.apply(.save(record))
            } catch {
                manager.handle(key, .saveFailed(now: manager.clock.now()))
                return
            }
            // Only what is served now counts as saved. When the tokens changed
            // while this write was out, the newer write may have gone ahead of
            // it (a refresh's write is urgent): write what is served again.
            guard let served = manager.entries[key]?.record, manager.entries[key]?.id == entryID else { return }
            if served.tokens == record.tokens {
                manager.handle(key, .saved)
                await manager.perform(manager.replacedRevocations(of: key))
                return
            }
            record = served
        }
        // Still changing after three writes: tried again later, like a failed write.
        manager.handle(key, .saveFailed(now: manager.clock.now()))
    }

    var deleteRecord: @Sendable (SessionKey, SessionEnding) async throws(VaultError) -> Void {
        { [store] key, _ throws(VaultError) in try await store.apply(.delete(key)) }
    }

    /// Records written while the store was gone (refreshed tokens, a failed
    /// logout's record put back) are written, and a record it holds that
    /// vaultd does not serve (a login refused while its write was cut off,
    /// which landed all the same) is removed. Sessions with a login or
    /// logout in flight are left to it.
    func writeThrough(_ manager: isolated SessionManager) async {
        let contents: StoreContents
        do throws(VaultError) {
            contents = try await manager.store.loadAll()
        } catch {
            // Gone again: the health probes anew, and this runs when it is back.
            return
        }
        var stored: [SessionKey: SessionRecord] = [:]
        for record in contents.records { stored[record.key] = record }
        var written = 0
        for key in manager.entries.keys.sorted() {
            guard let entry = manager.entries[key], let record = entry.record, entry.login == nil, entry.logout == nil
            else { continue }
            let held = stored[key]
            if entry.timers.status.unsaved || entry.unqueue != nil || held?.tokens != record.tokens
                || held?.phase != .active
            {
                await manager.persist(key)
                written += 1
            }
        }
        var removed = 0
        for key in stored.keys.sorted() where manager.entries[key] == nil {
            do throws(VaultError) {
                try await manager.store.apply(.delete(key))
                removed += 1
            } catch {
                manager.log.warning(
                    "a stored session vaultd does not serve could not be removed",
                    manager.fields(key, event: "storeChanged", code: error.code))
            }
        }
        manager.log.notice(
            "wrote through to the secret store what it lacked",
            ["event": "storeChanged", "written": String(written), "removed": String(removed)])
    }

    func follow(_ manager: isolated SessionManager) {}

    func stopFollowing(_ manager: isolated SessionManager) {}

    func saveBeforeStopping(_ key: SessionKey, entryID: UInt64, _ manager: isolated SessionManager) async {
        guard let record = manager.entries[key]?.record else { return }
        do throws(VaultError) {
            try await manager.store.apply(.save(record))
        } catch {
            manager.log.error(
                "refreshed tokens could not be stored before stopping",
                manager.fields(key, event: "tokenRefreshed", code: error.code))
        }
    }
}
