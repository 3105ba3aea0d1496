import Varlink

/// The key of a session: whose it is and which account. Two local users may
/// each hold a session of `alice @ demo`; neither sees the other's.
public struct SessionKey: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The uid that owns the session.
    public var owner: UInt32
    /// The account at the provider.
    public var account: Account

    /// The session of `account` owned by `owner`.
    public init(owner: UInt32, account: Account) {
        self.owner = owner
        self.account = account
    }

    /// Ordered by provider, then user, then owner: how lists are sorted.
    public static func < (lhs: SessionKey, rhs: SessionKey) -> Bool {
        (lhs.account.provider, lhs.account.user, lhs.owner) < (rhs.account.provider, rhs.account.user, rhs.owner)
    }

    public var description: String { "\(account) (uid \(owner))" }
}

extension SessionRecord {
    /// The key this record is kept under.
    public var key: SessionKey { SessionKey(owner: ownerUID, account: account) }
}

/// Uids and gids named by a configuration key, resolved.
public struct Principals: Sendable, Equatable {
    /// Users named.
    public var uids: Set<UInt32>
    /// Groups named: their members are included.
    public var gids: Set<UInt32>

    /// A set of users and groups.
    public init(uids: Set<UInt32> = [], gids: Set<UInt32> = []) {
        self.uids = uids
        self.gids = gids
    }

    /// True when `caller` is one of the users or a member of one of the groups.
    public func contains(_ caller: Caller) -> Bool {
        uids.contains(caller.uid) || !gids.isDisjoint(with: caller.allGroups)
    }
}

/// An `[Account PROVIDER USER]` section, resolved: a shared account the
/// administrator declared.
public struct DeclaredAccount: Sendable, Equatable {
    /// The only uid whose session of this account exists (`Owner=`).
    public var owner: UInt32
    /// Who may read the owner's token besides the owner (`TokenReadUsers=`, `TokenReadGroups=`).
    public var readers: Principals

    /// A declaration.
    public init(owner: UInt32, readers: Principals = Principals()) {
        self.owner = owner
        self.readers = readers
    }
}

/// The one authority on who may do what to whose session. Pure: the daemon
/// resolves user and group names to ids when it loads the configuration, and
/// every method asks here before it acts.
///
/// - A session belongs to the uid that logged it in, or for a declared
///   account to its `Owner=`: the key is (owner uid, provider, user).
/// - The owner, root and members of `AdminGroup=` may see a session, log it
///   out and refresh it; only the owner and the declared readers get its token.
/// - Asking the provider for tokens ("minting": a login without a token, or
///   any login through an `exec` helper, which acts with the provider's own
///   credential) is allowed to root, `AdminGroup=`, the uid vaultd runs as,
///   the declared owner of the account and `MintUsers=` / `MintGroups=`.
public struct AccessPolicy: Sendable, Equatable {
    /// The uid vaultd runs as: on a user instance, the user; it configured the providers.
    public var vaultdUID: UInt32
    /// Members of these groups may see every session and force any logout.
    public var adminGIDs: Set<UInt32>
    /// Accounts the administrator declared, with their owner and readers.
    public var declared: [Account: DeclaredAccount]
    /// Per provider: who may mint tokens besides root, admins and vaultd's uid.
    public var minters: [String: Principals]

    /// A policy.
    public init(
        vaultdUID: UInt32 = 0, adminGIDs: Set<UInt32> = [], declared: [Account: DeclaredAccount] = [:],
        minters: [String: Principals] = [:]
    ) {
        self.vaultdUID = vaultdUID
        self.adminGIDs = adminGIDs
        self.declared = declared
        self.minters = minters
    }

    /// Root, or a member of an admin group.
    public func isAdmin(_ caller: Caller) -> Bool {
        caller.isRoot || !adminGIDs.isDisjoint(with: caller.allGroups)
    }

    /// Whose session of `account` a call of `caller` addresses: the declared
    /// owner for a declared account, else the owner the caller named
    /// (`ownerUid`), else the caller's own. An administrator may still name
    /// another owner of a declared account, to reach a session held before
    /// the account was declared (it can be seen and logged out, not logged in).
    public func owner(of account: Account, for caller: Caller, requested: UInt32?) throws(VaultError) -> UInt32 {
        if let declaration = declared[account] {
            if let requested, requested != declaration.owner {
                if isAdmin(caller) { return requested }
                throw VaultError(
                    .invalidParameter,
                    "[Account \(account.provider) \(account.user)] belongs to uid \(declaration.owner) (Owner=); there is no session of uid \(requested); leave ownerUid out"
                )
            }
            return declaration.owner
        }
        return requested ?? caller.uid
    }

    /// May see the session (status, list, events), log it out or refresh it.
    public func maySee(_ caller: Caller, ownerUID: UInt32) -> Bool {
        caller.uid == ownerUID || isAdmin(caller)
    }

    /// May be told of the session `key`'s changes (its events, its place in
    /// a subscription's snapshot): whoever may see it, and whoever may read
    /// its token, so that a reader's program learns that the token it holds
    /// was replaced or withdrawn.
    public func mayWatch(_ caller: Caller, _ key: SessionKey) -> Bool {
        maySee(caller, ownerUID: key.owner) || mayReadToken(caller, key)
    }

    /// May log in, log out or refresh the session of `key`: its owner, root
    /// and admins.
    public func mayManage(_ caller: Caller, _ key: SessionKey) -> Bool {
        maySee(caller, ownerUID: key.owner)
    }

    /// May read the token of the session `key`: its owner, or, for a declared
    /// account, whom the declaration names. Being root or an admin is not enough.
    public func mayReadToken(_ caller: Caller, _ key: SessionKey) -> Bool {
        if caller.uid == key.owner { return true }
        guard let declaration = declared[key.account], declaration.owner == key.owner else { return false }
        return declaration.readers.contains(caller)
    }

    /// May have the provider of `account` issue tokens (see the type's documentation).
    public func mayMint(_ caller: Caller, _ account: Account) -> Bool {
        if caller.uid == vaultdUID || isAdmin(caller) { return true }
        if declared[account]?.owner == caller.uid { return true }
        return minters[account.provider]?.contains(caller) ?? false
    }

    /// Why `caller` may not mint for `account`, with what to do.
    public static func mintDenied(_ account: Account) -> VaultError {
        VaultError(
            .accessDenied,
            "only root, the admin group, the account's Owner= and [Provider \(account.provider)] MintUsers=/MintGroups= may have provider '\(account.provider)' issue tokens; log in with a token of your own, or ask an administrator"
        )
    }

    /// Why `caller` may not act on another user's session.
    public static func notYours(_ key: SessionKey) -> VaultError {
        VaultError(.accessDenied, "\(key.account) of uid \(key.owner) is another user's session")
    }
}
