/// What happened to an account, as the chat SDKs' callbacks report it
/// (CometChat's login delegate, OpenIM's onKickedOffline and friends).
public enum EventKind: String, Sendable, CaseIterable {
    case loginSuccess
    case loginFailed
    case logoutSuccess
    case logoutFailed
    case tokenRefreshed
    case tokenExpired
    case tokenInvalid
    case kickedOffline
    case connectionChanged
}

/// One event about one account. Never holds a secret.
public struct VaultEvent: Sendable, Equatable {
    public var kind: EventKind
    public var account: Account
    /// The uid that owns the session: who may see the event besides admins.
    public var ownerUID: UInt32
    public var time: UnixTime
    /// Why it happened (kickedOffline: kicked, revoked, admin, switched, ...).
    public var reason: String?
    /// The error code of a failure (loginFailed, logoutFailed).
    public var code: String?
    /// The token's new expiry (tokenRefreshed).
    public var expiresAt: UnixTime?

    /// Makes an event.
    public init(
        kind: EventKind, account: Account, ownerUID: UInt32, time: UnixTime, reason: String? = nil,
        code: String? = nil, expiresAt: UnixTime? = nil
    ) {
        self.kind = kind
        self.account = account
        self.ownerUID = ownerUID
        self.time = time
        self.reason = reason
        self.code = code
        self.expiresAt = expiresAt
    }

    /// The event as clients see it.
    public func json() -> JSON {
        var o: [String: JSON] = [
            "kind": .string(kind.rawValue), "provider": .string(account.provider), "user": .string(account.user),
            "time": .int(time.seconds),
        ]
        o["reason"] = reason.map(JSON.string)
        o["code"] = code.map(JSON.string)
        o["expiresAt"] = expiresAt.map { .int($0.seconds) }
        return .object(o)
    }
}

/// What a subscriber asked to see.
public struct EventFilter: Sendable, Equatable {
    public var provider: String?
    public var user: String?
    /// Empty means every kind.
    public var kinds: Set<EventKind>

    /// A filter; nil and empty mean "any".
    public init(provider: String? = nil, user: String? = nil, kinds: Set<EventKind> = []) {
        self.provider = provider
        self.user = user
        self.kinds = kinds
    }

    /// True when `event` passes the filter.
    public func matches(_ event: VaultEvent) -> Bool {
        if let provider, provider != event.account.provider { return false }
        if let user, user != event.account.user { return false }
        return kinds.isEmpty || kinds.contains(event.kind)
    }

    /// True when an account passes the filter's provider and user.
    public func matches(_ account: Account) -> Bool {
        (provider == nil || provider == account.provider) && (user == nil || user == account.user)
    }
}

/// Who may do what with whose session. Pure: the daemon resolves user and
/// group names to ids when it loads the configuration.
public struct AccessPolicy: Sendable, Equatable {
    /// Members of these groups may see every session and force any logout.
    public var adminGIDs: Set<UInt32>
    /// Per account: uids and gids that may read its token besides its owner.
    public var tokenReaders: [Account: (uids: Set<UInt32>, gids: Set<UInt32>)]

    /// A policy.
    public init(adminGIDs: Set<UInt32> = [], tokenReaders: [Account: (uids: Set<UInt32>, gids: Set<UInt32>)] = [:]) {
        self.adminGIDs = adminGIDs
        self.tokenReaders = tokenReaders
    }

    public static func == (lhs: AccessPolicy, rhs: AccessPolicy) -> Bool {
        lhs.adminGIDs == rhs.adminGIDs && lhs.tokenReaders.keys == rhs.tokenReaders.keys
            && lhs.tokenReaders.allSatisfy { key, value in
                rhs.tokenReaders[key].map { $0.uids == value.uids && $0.gids == value.gids } ?? false
            }
    }

    /// Root, or a member of an admin group.
    public func isAdmin(_ caller: Caller) -> Bool {
        caller.isRoot || !adminGIDs.isDisjoint(with: caller.allGroups)
    }

    /// May see the session (status, list, events) and log it out.
    public func maySee(_ caller: Caller, ownerUID: UInt32) -> Bool {
        caller.uid == ownerUID || isAdmin(caller)
    }

    /// May read the token: the owner, or someone the account's allow list names.
    /// Being root or an admin is not enough.
    public func mayReadToken(_ caller: Caller, account: Account, ownerUID: UInt32) -> Bool {
        if caller.uid == ownerUID { return true }
        guard let readers = tokenReaders[account] else { return false }
        return readers.uids.contains(caller.uid) || !readers.gids.isDisjoint(with: caller.allGroups)
    }
}
