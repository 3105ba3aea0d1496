/// Who is asking: the Unix credentials of the peer of a connection.
public struct Caller: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    /// Supplementary groups (SO_PEERGROUPS).
    public var groups: [UInt32]
    /// The peer's executable, for the audit log, when it could be read.
    public var executable: String?
    /// The server's id of the connection the call came on: unique for the
    /// server's life (never reused), so that state a service keeps per
    /// connection can be dropped when the server says the connection closed.
    /// Nil for a caller that is no peer of a connection.
    public var connection: UInt64?

    /// Makes a caller from peer credentials.
    public init(
        uid: UInt32, gid: UInt32, pid: Int32, groups: [UInt32] = [], executable: String? = nil,
        connection: UInt64? = nil
    ) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.groups = groups
        self.executable = executable
        self.connection = connection
    }

    /// True for root.
    public var isRoot: Bool { uid == 0 }

    /// The primary and the supplementary groups.
    public var allGroups: Set<UInt32> { Set(groups).union([gid]) }
}
