import Glibc
import Synchronization
import VaultCore
import VaultSystem

/// The access policy in force, read by the serving loops at every call and
/// replaced on reload.
public final class PolicyBox: Sendable {
    /// Read by the serving loop at every call.
    private let current: Mutex<AccessPolicy>

    /// Holds `policy`.
    public init(_ policy: AccessPolicy) { current = Mutex(policy) }

    /// The policy in force.
    public var policy: AccessPolicy { current.withLock { $0 } }

    /// Puts `policy` in force.
    public func replace(_ policy: AccessPolicy) {
        current.withLock { $0 = policy }
    }
}

/// Turns the names in the configuration into uids and gids.
public enum PolicyResolver {
    /// The access policy of `config` for a vaultd running as `vaultdUID`; an
    /// unknown user or group is an error that names the key.
    public static func resolve(_ config: VaultConfig, vaultdUID: UInt32 = getuid()) throws(VaultError) -> AccessPolicy {
        var policy = AccessPolicy(vaultdUID: vaultdUID)
        if let group = config.adminGroup { policy.adminGIDs = [try gid(group, key: "[Vault] AdminGroup")] }
        for (account, settings) in config.accounts {
            let section = "[Account \(account.provider) \(account.user)]"
            let owner = try settings.owner.map { (name) throws(VaultError) in try uid(name, key: "\(section) Owner") }
            policy.declared[account] = DeclaredAccount(
                owner: owner ?? vaultdUID,
                readers: try principals(settings.readUsers, settings.readGroups, section, "TokenRead"))
        }
        for (name, provider) in config.providers where !provider.mintUsers.isEmpty || !provider.mintGroups.isEmpty {
            policy.minters[name] = try principals(provider.mintUsers, provider.mintGroups, "[Provider \(name)]", "Mint")
        }
        return policy
    }

    static func principals(_ users: [String], _ groups: [String], _ section: String, _ prefix: String)
        throws(VaultError) -> Principals
    {
        var result = Principals()
        for user in users { result.uids.insert(try uid(user, key: "\(section) \(prefix)Users")) }
        for group in groups { result.gids.insert(try gid(group, key: "\(section) \(prefix)Groups")) }
        return result
    }

    static func uid(_ name: String, key: String) throws(VaultError) -> UInt32 {
        if let number = UInt32(name) { return number }
        guard let entry = getpwnam(name) else {
            throw VaultError(.invalidConfig, "\(key)=: no user '\(name)' on this host; create it or fix the name")
        }
        return entry.pointee.pw_uid
    }

    static func gid(_ name: String, key: String) throws(VaultError) -> UInt32 {
        if let number = UInt32(name) { return number }
        guard let entry = getgrnam(name) else {
            throw VaultError(.invalidConfig, "\(key)=: no group '\(name)' on this host; create it or fix the name")
        }
        return entry.pointee.gr_gid
    }
}
