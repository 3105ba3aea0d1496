/// What one local user may take of the Varlink server: connections, time and
/// queued output. Every limit has a default, a `[Vault]` key and an error code,
/// so that no uid can make vaultd refuse root or hold unbounded memory.
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

    /// The `[Vault]` keys these limits are read from.
    public static let keys = [
        "MaxConnections", "MaxConnectionsPerUser", "IdleTimeout", "RequestTimeout", "MaxOutputPerConnection",
    ]

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

    /// The error a refused caller gets as its connection's only reply.
    public func refusal(_ admission: Admission, uid: UInt32) -> VaultError {
        switch admission {
        case .perUserLimit:
            return VaultError(
                .tooManyConnections,
                "uid \(uid) already has \(maxConnectionsPerUser) connections open to vaultd, the most one user may (MaxConnectionsPerUser=); close idle ones or make several calls on one connection"
            )
        case .sharedLimit:
            return VaultError(
                .tooManyConnections,
                "users other than root and the admin group hold every connection vaultd gives them (\(maxConnections - reservedConnections)); try again later, or ask the administrator to raise MaxConnections="
            )
        case .keptForRoot:
            return VaultError(
                .tooManyConnections,
                "vaultd has \(maxConnections - rootReservedConnections) connections open, all but the \(rootReservedConnections) it keeps for root; try again later, or ask the administrator to raise MaxConnections="
            )
        case .full, .admit:
            return VaultError(
                .tooManyConnections,
                "vaultd has \(maxConnections) connections open, the most it serves (MaxConnections=); try again later")
        }
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

extension ConfigParser {
    /// Reads the serving limits from the merged `[Vault]` section; an error
    /// names the file, the line and the key (not the value).
    static func servingLimits(_ vault: [String: Entry]) throws(VaultError) -> ServingLimits {
        var limits = ServingLimits()
        func count(_ key: String, _ range: ClosedRange<Int>) throws(VaultError) -> Int? {
            try wholeNumber(vault, key, in: range)
        }
        func seconds(_ key: String) throws(VaultError) -> Int64? {
            guard let entry = vault[key] else { return nil }
            guard let value = DurationParser.seconds(entry.value), value >= 1, value <= 86400 else {
                throw entry.error("key '\(key)': expected a duration from 1s to 1d (e.g. 30s, 5min)")
            }
            return value
        }
        let reserve = limits.reservedConnections
        if let value = try count("MaxConnections", (reserve + 1)...65536) { limits.maxConnections = value }
        if let value = try count("MaxConnectionsPerUser", 1...65536) {
            guard value <= limits.maxConnections - reserve else {
                throw vault["MaxConnectionsPerUser"]!.error(
                    "key 'MaxConnectionsPerUser': must leave room under MaxConnections= less the \(reserve) connections kept for root and the admin group"
                )
            }
            limits.maxConnectionsPerUser = value
        } else {
            limits.maxConnectionsPerUser = min(limits.maxConnectionsPerUser, limits.maxConnections - reserve)
        }
        if let value = try seconds("IdleTimeout") { limits.idleTimeoutSeconds = value }
        if let value = try seconds("RequestTimeout") { limits.requestTimeoutSeconds = value }
        if let entry = vault["MaxOutputPerConnection"] {
            guard let bytes = ByteSizeParser.bytes(entry.value),
                bytes >= ServingLimits.minimumOutputPerConnection, bytes <= 1 << 30
            else {
                throw entry.error("key 'MaxOutputPerConnection': expected a size from 64K to 1G (e.g. 4M)")
            }
            limits.maxOutputPerConnection = bytes
        }
        return limits
    }
}

/// Parses sizes as systemd writes them: `65536`, `64K`, `4M`, `1G` (powers of 1024).
public enum ByteSizeParser {
    /// The size in bytes, or nil when the text is not a size.
    public static func bytes(_ text: String) -> Int? {
        let digits = text.prefix(while: { $0.isASCII && $0.isNumber })
        guard !digits.isEmpty, let number = Int(digits) else { return nil }
        let shifts: [String: Int] = ["": 0, "K": 10, "KiB": 10, "M": 20, "MiB": 20, "G": 30, "GiB": 30]
        guard let shift = shifts[String(text.dropFirst(digits.count))], number <= Int.max >> shift else { return nil }
        return number << shift
    }
}
