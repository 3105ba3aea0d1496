import Synchronization
import Varlink
import VaultCore

/// The connections to vaultd whose clients reported their connection state
/// (`SetConnectionState`), and the sessions each reported on. The serving
/// loop marks a connection when a report arrives on it and takes it out when
/// the server says it closed; the session manager records a report only
/// while its connection is still marked, checked and recorded in one step,
/// so that a report whose connection closed meanwhile is never kept.
public final class ReportingConnections: Sendable {
    private let sessions = Mutex<[UInt64: Set<SessionKey>]>([:])

    /// An empty registry.
    public init() {}

    /// Marks `connection` as one that reports (loop thread, as its call is read).
    public func opened(_ connection: UInt64) {
        sessions.withLock { if $0[connection] == nil { $0[connection] = [] } }
    }

    /// Records that `connection` reported on `key`; false when the connection
    /// closed meanwhile (its report must not be kept).
    public func add(_ key: SessionKey, to connection: UInt64) -> Bool {
        sessions.withLock {
            guard $0[connection] != nil else { return false }
            $0[connection]!.insert(key)
            return true
        }
    }

    /// Takes `connection` out; the sessions it reported on, or nil when it never reported.
    public func closed(_ connection: UInt64) -> Set<SessionKey>? {
        sessions.withLock { $0.removeValue(forKey: connection) }
    }

    /// How many connections report now.
    public var count: Int { sessions.withLock { $0.count } }
}

/// Clients' reports of their own connection to the chat server (OpenIM's
/// connection callbacks): listed in the session while their connection to
/// vaultd is open, told to subscribers as `connectionChanged` with source
/// `client`. A `kickedOffline` report ends the session as `ForceLogout` does.
extension SessionManager {
    /// Records that the client of `caller` (named `client`) is in `state` for
    /// the session `key`. Only the session's owner and root may report.
    public func setConnectionState(
        _ key: SessionKey, state: ClientConnectionState, client: String, caller: Caller
    ) async throws(VaultError) {
        let account = key.account
        guard caller.uid == key.owner || caller.isRoot else {
            Audit.log(log, "SetConnectionState", key, by: .peer(caller), result: VaultError.Code.accessDenied.seedCode)
            throw VaultError(
                .accessDenied,
                "only the owner of the session of \(account) (uid \(key.owner)) and root may report its connection state"
            )
        }
        guard let connection = caller.connection else {
            throw VaultError(.internalError, "a connection state was reported outside of a connection")
        }
        guard var entry = entries[key], entry.record != nil else { throw .notLoggedIn(account) }
        if state == .kickedOffline {
            // The chat server kicked the client: the token is no good to anyone
            // any more, so the session ends as with ForceLogout (the SDKs do the same).
            log.info(
                "a client reports it was kicked offline; the session is logged out",
                fields(key, event: "connectionChanged", by: .peer(caller)).merging(["client": client]) { a, _ in a })
            events(
                VaultEvent(
                    kind: .connectionChanged, account: account, ownerUID: key.owner, time: clock.now(),
                    reason: state.rawValue, source: .client, client: client))
            try await performLogout(key, by: .peer(caller), reason: "kicked")
            return
        }
        let changed = try entry.clients.report(
            connection: connection, name: client, pid: caller.pid, state: state, now: clock.now(), account: account)
        // Kept only while the connection is open; checked and recorded with no await between.
        guard reporting.add(key, to: connection) else { return }
        entries[key] = entry
        publishView(key)
        guard changed else { return }
        // Debug only: a client reconnecting in a loop would flood the journal;
        // subscribers get every change as an event.
        log.debug(
            "a client reports its connection",
            fields(key, event: "connectionChanged", by: .peer(caller)).merging([
                "client": client, "state": state.rawValue,
            ]) { a, _ in a })
        events(
            VaultEvent(
                kind: .connectionChanged, account: account, ownerUID: key.owner, time: clock.now(),
                reason: state.rawValue, source: .client, client: client))
    }

    /// Drops the reports of a connection that closed, from the sessions it
    /// reported on; subscribers get `connectionChanged` with reason `clientGone`.
    public func clientGone(_ connection: UInt64, from keys: Set<SessionKey>) {
        for key in keys.sorted() {
            guard let report = entries[key]?.clients.drop(connection: connection) else { continue }
            // A session being logged out is no longer live to subscribers: nothing to tell.
            guard entries[key]?.record != nil else { continue }
            publishView(key)
            events(
                VaultEvent(
                    kind: .connectionChanged, account: key.account, ownerUID: key.owner, time: clock.now(),
                    reason: "clientGone", source: .client, client: report.name))
        }
    }
}
