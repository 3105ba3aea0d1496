import Varlink

/// An account: one user at one provider. The key of every session.
public struct Account: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// The provider's name, a section of the config file.
    public var provider: String
    /// The user id at that provider (CometChat UID, OpenIM userID, Salesforce user).
    public var user: String

    /// Makes an account key.
    public init(provider: String, user: String) {
        self.provider = provider
        self.user = user
    }

    public static func < (lhs: Account, rhs: Account) -> Bool {
        (lhs.provider, lhs.user) < (rhs.provider, rhs.user)
    }

    public var description: String { "\(user) @ \(provider)" }

    /// Checks that both names are usable: non-empty, at most 256 bytes, no control characters.
    public static func validate(provider: String, user: String) throws(VaultError) -> Account {
        for (name, value) in [("provider", provider), ("user", user)] {
            if value.isEmpty { throw VaultError(.invalidParameter, "\(name) must not be empty") }
            if value.utf8.count > 256 { throw VaultError(.invalidParameter, "\(name) is longer than 256 bytes") }
            if value.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
                throw VaultError(.invalidParameter, "\(name) must not contain control characters")
            }
        }
        return Account(provider: provider, user: user)
    }
}

/// The login state of an account, as OpenIM names them.
public enum LoginState: String, Sendable, CaseIterable {
    case logout
    case logging
    case logged
}

/// The user a session belongs to, with the fields of CometChat's User object.
public struct UserProfile: Sendable, Equatable {
    public var uid: String
    public var name: String?
    public var avatar: String?
    public var role: String?
    public var metadata: JSON?
    public var status: String?
    public var statusMessage: String?
    public var lastActiveAt: UnixTime?
    public var deactivatedAt: UnixTime?

    /// A profile that knows only the user id.
    public init(uid: String) { self.uid = uid }
}

/// The tokens of a session. Secrets are `Secret`s, masked when printed.
public struct TokenSet: Sendable, Equatable {
    /// The access token (CometChat authToken, OpenIM token, OAuth2 access token).
    public var accessToken: Secret
    /// The OAuth2 refresh token, when the provider issued one.
    public var refreshToken: Secret?
    /// The token type, "Bearer" for OAuth2.
    public var tokenType: String?
    /// The OAuth2 scope granted.
    public var scope: String?
    /// Salesforce's instance URL: where API calls for this session go.
    public var instanceURL: String?
    /// The OAuth2 client id the tokens were issued to.
    public var clientID: String?
    /// When the token was issued, as the server said.
    public var issuedAt: UnixTime?

    /// A token set holding only an access token.
    public init(accessToken: Secret) { self.accessToken = accessToken }
}

/// Where a stored record is in its life. A record found `loggingOut` at start-up
/// is a logout that a crash interrupted: it is finished then.
public enum RecordPhase: String, Sendable {
    case active
    case loggingOut
}

/// A session as kept in the secret store: tokens and metadata, one JSON document,
/// so that one store write is atomic.
///
/// A value with copy-on-write storage: the session table, the session manager
/// and the store all hold the same record, so each copy costs a reference,
/// not the record's few hundred bytes (this is most of vaultd's memory per
/// session).
public struct SessionRecord: Sendable, Equatable {
    /// The record's fields, kept once however many copies share them.
    private struct Fields: Equatable {
        var account: Account
        var user: UserProfile
        var tokens: TokenSet
        var createdAt: UnixTime
        var expiresAt: UnixTime?
        var ownerUID: UInt32
        var phase: RecordPhase
        var revocationID: String?
    }

    /// Mutated only when no other copy refers to it (see `fields`), so sharing
    /// it between threads is safe.
    private final class Storage: @unchecked Sendable {
        var fields: Fields
        init(_ fields: Fields) { self.fields = fields }
    }

    private var storage: Storage

    private var fields: Fields {
        get { storage.fields }
        set {
            if isKnownUniquelyReferenced(&storage) {
                storage.fields = newValue
            } else {
                storage = Storage(newValue)
            }
        }
    }

    public var account: Account {
        get { storage.fields.account }
        set { fields.account = newValue }
    }
    public var user: UserProfile {
        get { storage.fields.user }
        set { fields.user = newValue }
    }
    public var tokens: TokenSet {
        get { storage.fields.tokens }
        set { fields.tokens = newValue }
    }
    // Single token fields, read where the record keeps them: reading
    // `tokens` copies the whole set (a retain per field, a release after).
    /// `tokens.accessToken`.
    public var accessToken: Secret { storage.fields.tokens.accessToken }
    /// `tokens.tokenType`.
    public var tokenType: String? { storage.fields.tokens.tokenType }
    /// `tokens.instanceURL`.
    public var instanceURL: String? { storage.fields.tokens.instanceURL }
    /// `tokens.scope`.
    public var scope: String? { storage.fields.tokens.scope }
    /// `tokens.issuedAt`.
    public var tokensIssuedAt: UnixTime? { storage.fields.tokens.issuedAt }
    public var createdAt: UnixTime {
        get { storage.fields.createdAt }
        set { fields.createdAt = newValue }
    }
    /// When the access token stops being valid, when known.
    public var expiresAt: UnixTime? {
        get { storage.fields.expiresAt }
        set { fields.expiresAt = newValue }
    }
    /// The Unix uid that logged the session in and owns it.
    public var ownerUID: UInt32 {
        get { storage.fields.ownerUID }
        set { fields.ownerUID = newValue }
    }
    public var phase: RecordPhase {
        get { storage.fields.phase }
        set { fields.phase = newValue }
    }
    /// The id under which the revocation of this session's tokens is queued,
    /// set with the `loggingOut` mark: the intent to revoke is in the store
    /// in the same write, before the provider is asked.
    public var revocationID: String? {
        get { storage.fields.revocationID }
        set { fields.revocationID = newValue }
    }

    /// Makes an active record.
    public init(
        account: Account, user: UserProfile, tokens: TokenSet, createdAt: UnixTime, expiresAt: UnixTime?,
        ownerUID: UInt32
    ) {
        storage = Storage(
            Fields(
                account: account, user: user, tokens: tokens, createdAt: createdAt, expiresAt: expiresAt,
                ownerUID: ownerUID, phase: .active, revocationID: nil))
    }

    public static func == (lhs: SessionRecord, rhs: SessionRecord) -> Bool {
        lhs.storage === rhs.storage || lhs.storage.fields == rhs.storage.fields
    }

    /// True when the access token has an expiry and it has passed at `now`.
    public func isExpired(at now: UnixTime) -> Bool {
        guard let expiresAt else { return false }
        return expiresAt <= now
    }

    /// The human label of the secret store item: `vaultd: alice @ salesforce`.
    public var storeLabel: String { "vaultd: \(account.user) @ \(account.provider)" }
}
