import Varlink

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
    /// The secret store became unavailable, locked, or available again
    /// (reason: the new state); sent for every live session, whose changes
    /// cannot be stored meanwhile.
    case storeChanged
    /// The session's `TokenFile=` could not be written or removed (reason:
    /// `write` or `remove`; message: the path and the system's error). Tried
    /// again at the session's next change; `status` shows it until then.
    case tokenFileFailed
}

/// One event about one account. Never holds a secret.
public struct VaultEvent: Sendable, Equatable {
    public var kind: EventKind
    public var account: Account
    /// The uid that owns the session: who may see the event besides admins
    /// and, for a declared account, its token's readers.
    public var ownerUID: UInt32
    public var time: UnixTime
    /// Why it happened (kickedOffline: kicked, revoked, admin, switched, ...).
    public var reason: String?
    /// vaultd's code of a failure (loginFailed, logoutFailed, tokenInvalid, connectFailed).
    public var code: String?
    /// The token's new expiry (tokenRefreshed).
    public var expiresAt: UnixTime?
    /// What the failure was, for a human (tokenInvalid, loginFailed): the
    /// provider's words, masked by `Redactor`. Never a secret.
    public var message: String?
    /// Where a `connectionChanged` comes from: vaultd's token endpoint, or a client.
    public var source: ConnectionSource?
    /// The name of the client whose report a `connectionChanged` is.
    public var client: String?
    /// The provider's own code of a failure, beside vaultd's `code`.
    public var providerCode: String?
    /// What the provider said of a failure, masked.
    public var providerMessage: String?

    /// Makes an event.
    public init(
        kind: EventKind, account: Account, ownerUID: UInt32, time: UnixTime, reason: String? = nil,
        code: String? = nil, expiresAt: UnixTime? = nil, message: String? = nil, source: ConnectionSource? = nil,
        client: String? = nil, providerCode: String? = nil, providerMessage: String? = nil
    ) {
        self.providerCode = providerCode
        self.providerMessage = providerMessage
        self.kind = kind
        self.account = account
        self.ownerUID = ownerUID
        self.time = time
        self.reason = reason
        self.code = code
        self.expiresAt = expiresAt
        self.message = message
        self.source = source
        self.client = client
    }

    /// The event as clients see it.
    public func json() -> JSON {
        var o: [String: JSON] = [
            "kind": .string(kind.rawValue), "provider": .string(account.provider), "user": .string(account.user),
            "time": .int(time.seconds), "ownerUid": .int(Int64(ownerUID)),
        ]
        o["reason"] = reason.map(JSON.string)
        o["code"] = code.map(JSON.string)
        o["expiresAt"] = expiresAt.map { .int($0.seconds) }
        o["message"] = message.map(JSON.string)
        o["source"] = source.map { .string($0.rawValue) }
        o["client"] = client.map(JSON.string)
        o["providerCode"] = providerCode.map(JSON.string)
        o["providerMessage"] = providerMessage.map(JSON.string)
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
