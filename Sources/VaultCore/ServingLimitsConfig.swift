import Varlink

/// The transport's limits as vaultd configures and explains them: the
/// `[Vault]` keys they are read from, and the error each refusal is.
extension ServingLimits {
    /// The `[Vault]` keys these limits are read from.
    public static let keys = [
        "MaxConnections", "MaxConnectionsPerUser", "IdleTimeout", "RequestTimeout", "MaxOutputPerConnection",
    ]

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
