import Glibc
import Synchronization
import VaultCore

/// The access policy in force, read by the serving thread and replaced on reload.
public final class PolicyBox: Sendable {
    private let current: Mutex<AccessPolicy>

    /// Holds `policy`.
    public init(_ policy: AccessPolicy) { current = Mutex(policy) }

    /// The policy in force.
    public var policy: AccessPolicy { current.withLock { $0 } }

    /// Puts `policy` in force.
    public func replace(_ policy: AccessPolicy) { current.withLock { $0 = policy } }
}

/// Turns the names in the configuration into uids and gids.
public enum PolicyResolver {
    /// The access policy of `config`; an unknown user or group is an error.
    public static func resolve(_ config: VaultConfig) throws(VaultError) -> AccessPolicy {
        var policy = AccessPolicy()
        if let group = config.adminGroup { policy.adminGIDs = [try gid(group, key: "AdminGroup")] }
        for (account, readers) in config.tokenReaders {
            var uids: Set<UInt32> = []
            var gids: Set<UInt32> = []
            for user in readers.users { uids.insert(try uid(user, account: account)) }
            for group in readers.groups { gids.insert(try gid(group, key: "TokenReadGroups")) }
            policy.tokenReaders[account] = (uids, gids)
        }
        return policy
    }

    static func uid(_ name: String, account: Account) throws(VaultError) -> UInt32 {
        if let number = UInt32(name) { return number }
        guard let entry = getpwnam(name) else {
            throw VaultError(
                .invalidConfig, "TokenReadUsers of [Account \(account.provider) \(account.user)]: no user '\(name)'")
        }
        return entry.pointee.pw_uid
    }

    static func gid(_ name: String, key: String) throws(VaultError) -> UInt32 {
        if let number = UInt32(name) { return number }
        guard let entry = getgrnam(name) else { throw VaultError(.invalidConfig, "\(key): no group '\(name)'") }
        return entry.pointee.gr_gid
    }
}
