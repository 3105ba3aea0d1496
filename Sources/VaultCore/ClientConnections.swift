import Varlink

/// A client's own connection to the chat server, as it reports it
/// (`SetConnectionState`): OpenIM's connection callbacks (onConnecting,
/// onConnectSuccess, onConnectFailed, onKickedOffline).
public enum ClientConnectionState: String, Sendable, CaseIterable {
    case connecting
    case connected
    case connectFailed
    /// The chat server kicked the client offline: vaultd ends the session as
    /// `ForceLogout` does (subscribers get `kickedOffline`, reason `kicked`).
    case kickedOffline
}

/// Where a `connectionChanged` event comes from.
public enum ConnectionSource: String, Sendable {
    /// vaultd's own requests to the provider's token endpoint (a refresh).
    case vaultd
    /// A client reporting its connection to the chat server (`SetConnectionState`).
    case client
}

/// What one client reported about its connection for one session.
public struct ClientReport: Sendable, Equatable {
    /// vaultd's connection the client reported on (`Caller.connection`): the
    /// report lasts as long as that connection.
    public var connection: UInt64
    /// The name the client gave itself.
    public var name: String
    /// The client's process, from the socket's peer credentials.
    public var pid: Int32
    public var state: ClientConnectionState
    /// Since when the client is in `state`.
    public var since: UnixTime

    /// A report.
    public init(connection: UInt64, name: String, pid: Int32, state: ClientConnectionState, since: UnixTime) {
        self.connection = connection
        self.name = name
        self.pid = pid
        self.state = state
        self.since = since
    }

    /// The report as clients see it (type `ClientConnection`).
    public func json() -> JSON {
        [
            "name": .string(name), "pid": .int(Int64(pid)), "state": .string(state.rawValue),
            "since": .int(since.seconds),
        ]
    }
}

/// The clients that report their connection for one session: one entry per
/// vaultd connection, in the order they first reported, at most `limit`.
/// Pure bookkeeping; the session manager keeps one per session and drops a
/// connection's entry when the server says the connection closed.
public struct ClientConnections: Sendable, Equatable {
    /// The most clients one session lists: a report past it is refused, so
    /// that no caller makes a session's status (and every reply that shows
    /// it) grow without bound.
    public static let limit = 64
    /// The most bytes of a client's name.
    public static let maximumNameBytes = 64

    /// The clients, in the order they first reported.
    public private(set) var clients: [ClientReport] = []

    /// No clients.
    public init() {}

    /// Checks a client's name: 1 to 64 bytes, no control characters (it goes
    /// into status, events and the log).
    public static func validate(name: String) throws(VaultError) -> String {
        guard !name.isEmpty, name.utf8.count <= maximumNameBytes,
            name.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F })
        else {
            throw VaultError(
                .invalidParameter,
                "client must be 1 to \(maximumNameBytes) bytes without control characters (a name such as 'mybot')")
        }
        return name
    }

    /// Records that the client on `connection` is in `state` at `now`, and
    /// returns whether that is news (a new client, or another state than it
    /// reported last; a repeat keeps `since`). A new client past `limit` is
    /// refused with `TooManyClients`.
    public mutating func report(
        connection: UInt64, name: String, pid: Int32, state: ClientConnectionState, now: UnixTime, account: Account
    ) throws(VaultError) -> Bool {
        if let index = clients.firstIndex(where: { $0.connection == connection }) {
            let changed = clients[index].state != state || clients[index].name != name
            if clients[index].state != state { clients[index].since = now }
            clients[index].state = state
            clients[index].name = name
            return changed
        }
        guard clients.count < ClientConnections.limit else {
            throw VaultError(
                .tooManyClients,
                "\(ClientConnections.limit) clients already report their connection for \(account), the most one session lists; a client's report goes away when its connection to vaultd closes, so report over one connection per client and close the ones you are done with"
            )
        }
        clients.append(ClientReport(connection: connection, name: name, pid: pid, state: state, since: now))
        return true
    }

    /// Forgets the client on `connection`; returns its last report, if it had one.
    public mutating func drop(connection: UInt64) -> ClientReport? {
        guard let index = clients.firstIndex(where: { $0.connection == connection }) else { return nil }
        return clients.remove(at: index)
    }
}
