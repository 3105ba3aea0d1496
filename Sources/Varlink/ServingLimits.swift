/// What one local user may take of a Varlink server: connections, time and
/// queued output. Every limit has a default (the service reads its own
/// settings and names its own refusals), so that no uid can make the server
/// refuse root or hold unbounded memory.
public struct ServingLimits: Sendable, Equatable {
    /// Open connections in all (`MaxConnections=`); past it even root is refused.
    public var maxConnections: Int = 8192
    /// Connections kept for root and `AdminGroup` members: the others together
    /// may hold `maxConnections - reservedConnections`.
    public var reservedConnections: Int = 64
    /// The last of those kept for root alone: admins together with everyone
    /// else may hold `maxConnections - rootReservedConnections`, so that no
    /// admin can take root's last way in.
    public var rootReservedConnections: Int = 16
    /// Open connections per uid other than root (`MaxConnectionsPerUser=`).
    public var maxConnectionsPerUser: Int = 128
    /// A connection with nothing in flight, no unfinished message and nothing
    /// read or sent for this long is closed (`IdleTimeout=`), in seconds.
    /// Subscriptions and connections with a call in flight are exempt.
    public var idleTimeoutSeconds: Int64 = 300
    /// A message whose first bytes arrived must be complete within this long
    /// (`RequestTimeout=`), in seconds, or the connection is closed.
    public var requestTimeoutSeconds: Int64 = 30
    /// Reply bytes one connection may have queued, the reply being built
    /// included (`MaxOutputPerConnection=`); a reply past it is answered with
    /// `ReplyTooLarge` instead.
    public var maxOutputPerConnection: Int = 4 << 20

    /// The defaults.
    public init() {}

    /// The smallest `MaxOutputPerConnection=`: room for any error reply on top
    /// of what a connection may queue before it stops being read.
    public static let minimumOutputPerConnection = 64 << 10

    /// Queued output past which a connection's input is no longer read: 1 MiB,
    /// or half the bound when that is smaller. A reply is built only below it,
    /// so an error reply in place of one always fits in the bound.
    public var outputHighWater: Int { min(1 << 20, maxOutputPerConnection / 2) }

    /// Whether a new connection is taken, and if not, which limit refused it.
    public enum Admission: Sendable, Equatable {
        case admit
        /// The caller's uid holds `maxConnectionsPerUser` connections.
        case perUserLimit
        /// Users outside root and the admin group hold their whole share.
        case sharedLimit
        /// `maxConnections` are open.
        case full
        /// All but root's own reserve are open, and the caller is not root.
        case keptForRoot
    }

    /// Decides on a new connection of a caller who is root (`isRoot`), in the
    /// admin group or root (`privileged`), or neither, given what is open: in
    /// all, by callers neither root nor admin, and by the caller's uid. Root
    /// is refused only when every connection is open; an admin also when
    /// only root's own reserve is left.
    public func admission(
        isRoot: Bool, privileged: Bool, open: Int, openUnprivileged: Int, openForUser: Int
    ) -> Admission {
        if open >= maxConnections { return .full }
        if isRoot { return .admit }
        if openForUser >= maxConnectionsPerUser { return .perUserLimit }
        if open >= maxConnections - rootReservedConnections { return .keptForRoot }
        if !privileged && openUnprivileged >= maxConnections - reservedConnections { return .sharedLimit }
        return .admit
    }

    /// When a connection is closed for lack of progress, in milliseconds of
    /// the monotonic clock, and why; nil while it may wait for ever (a
    /// stream such as a subscription, or a call in flight). `lastActivity` is when bytes last
    /// went either way; `partialSince` is when the unfinished message read so
    /// far started, while the connection is read.
    public func deadline(
        streaming: Bool, busy: Bool, lastActivity: UInt64, partialSince: UInt64?
    ) -> (at: UInt64, reason: Expiry)? {
        if streaming || busy { return nil }
        if let partialSince { return (partialSince + UInt64(requestTimeoutSeconds) * 1000, .unfinishedMessage) }
        return (lastActivity + UInt64(idleTimeoutSeconds) * 1000, .idle)
    }

    /// Why a connection ran out of time.
    public enum Expiry: String, Sendable {
        case idle
        case unfinishedMessage
    }
}
