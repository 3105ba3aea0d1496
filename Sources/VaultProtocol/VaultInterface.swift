/// The interface `io.vaultd.Vault` in Varlink's interface definition language,
/// as `GetInterfaceDescription` returns it. `docs/io.vaultd.Vault.varlink` is the
/// same text as a file; a test keeps the two identical.
public enum VaultInterface {
    /// The interface name.
    public static let name = "io.vaultd.Vault"

    /// The interface definition.
    public static let description = """
        # vaultd keeps the sessions of chat and messaging services (CometChat, OpenIM,
        # Salesforce and the like) in the Linux secret store and shares them with every
        # local process of their owner. An account is a provider (a section of
        # vaultd.conf) and a user id at that provider. A session is an account held by
        # one local user (its owner, ownerUid): two users may each hold one of the
        # same account and neither sees the other's. Calls address the caller's own
        # session; for an account that vaultd.conf declares ([Account PROVIDER USER]
        # Owner=), the declared owner's. Root and the admin group may name another
        # user's session with ownerUid; when they name none and hold none of the
        # account, the only session of it there is is meant.
        interface io.vaultd.Vault

        # The login state of an account, as OpenIM names them.
        type LoginState (logout, logging, logged)

        # The user a session belongs to: the fields of CometChat's User object.
        # Times are Unix seconds.
        type UserProfile (
          uid: string,
          name: ?string,
          avatar: ?string,
          role: ?string,
          metadata: ?object,
          status: ?string,
          statusMessage: ?string,
          lastActiveAt: ?int,
          deactivatedAt: ?int
        )

        # A session as clients see it. Never holds a secret: token is masked. For
        # providers that refresh: when the next refresh is due (refreshAt), the last
        # one (lastRefreshAt), failures since the last success, the last error, when
        # the next retry is (nextRetryAt), and the connection state (connecting,
        # connected, connectFailed).
        type Session (
          provider: string,
          user: string,
          state: LoginState,
          profile: ?UserProfile,
          createdAt: ?int,
          expiresAt: ?int,
          ownerUid: ?int,
          tokenType: ?string,
          scope: ?string,
          instanceUrl: ?string,
          hasRefreshToken: bool,
          token: ?string,
          refreshAt: ?int,
          lastRefreshAt: ?int,
          consecutiveFailures: ?int,
          lastError: ?string,
          nextRetryAt: ?int,
          connection: ?string
        )

        # Logs an account in with a ready token (CometChat authToken, OpenIM token) or
        # an OAuth 2.0 token response as the token endpoint sent it (access_token,
        # refresh_token, expires_in, token_type, scope, instance_url, issued_at).
        # Exactly one of token and tokenResponse. expiresAt (Unix seconds) overrides
        # expires_in and a JWT's exp. An account that is already logged in answers
        # with its existing session and created false; a login that joins one in
        # flight gets that login's result. Without a token (or for an exec provider,
        # whose helper acts with the provider's own credential) the provider issues
        # the tokens: only root, the admin group, the account's declared Owner=, the
        # user vaultd runs as and [Provider] MintUsers=/MintGroups= may ask for that.
        # One user (but root) may hold MaxSessionsPerUser= sessions (TooManySessions);
        # a session may take MaxSessionSize= bytes (SessionTooLarge).
        method Login(
          provider: string,
          user: string,
          token: ?string,
          tokenResponse: ?object,
          profile: ?UserProfile,
          expiresAt: ?int,
          ownerUid: ?int
        ) -> (session: Session, created: bool)

        # Logs an account out and deletes its stored session. Subscribers get
        # logoutSuccess as soon as the token is no longer handed out; the reply comes
        # once the secret store is updated (if that fails, the reply is the error,
        # subscribers get logoutFailed and the session is served again).
        method Logout(provider: string, user: string, ownerUid: ?int) -> ()

        # The session of one account (getLoggedInUser).
        method GetSession(provider: string, user: string, ownerUid: ?int) -> (session: Session)

        # The sessions the caller may see, ordered by provider, user and owner, a page
        # at a time: at most limit of them (default 100, at most 1000), starting after
        # the cursor after. next is the cursor of the following page, absent on the
        # last; pass it back as after, unchanged (it is opaque). A client that passes
        # neither gets the first page.
        method ListSessions(limit: ?int, after: ?string) -> (sessions: []Session, next: ?string)

        # The current access token of a session the caller owns, or of a declared
        # account whose TokenReadUsers=/TokenReadGroups= name the caller; ownerUid in
        # the reply says whose session it came from. minValidSeconds asks for a token
        # valid at least that long from now: vaultd refreshes first where it can, at
        # most once per MinRefreshInterval=, and answers TokenExpired at once when no
        # token of the session lives that long.
        method GetToken(
          provider: string,
          user: string,
          minValidSeconds: ?int,
          ownerUid: ?int
        ) -> (token: string, tokenType: ?string, expiresAt: ?int, instanceUrl: ?string, ownerUid: int)

        # Something that happened to an account, as the chat SDKs' callbacks report
        # it. kind is one of loginSuccess, loginFailed, logoutSuccess, logoutFailed,
        # tokenRefreshed, tokenExpired, tokenInvalid, kickedOffline, connectionChanged.
        # reason says why (kickedOffline: kicked, revoked, admin, switched, ...), code
        # is the error code of a failure. Never holds a secret.
        type Event (
          kind: string,
          provider: string,
          user: string,
          ownerUid: int,
          time: int,
          reason: ?string,
          code: ?string,
          expiresAt: ?int
        )

        # Streams what happens to the sessions the caller may see; call it with more.
        # The first reply is a snapshot (sessions, no event); then one reply per event
        # (event, no sessions), in the order of the changes, for as long as the
        # connection stays open. provider, user and kinds narrow what is sent. A
        # subscriber that does not read is dropped with SubscriberTooSlow once its
        # queue is full. One user (but root) may keep 64 streams open at once; one more
        # is refused with TooManySubscriptions.
        method Subscribe(
          provider: ?string,
          user: ?string,
          kinds: ?[]string
        ) -> (sessions: ?[]Session, event: ?Event)

        # Logs an account out at once because its chat server kicked it offline
        # (OpenIM onKickedOffline) or an administrator says so. Subscribers get
        # kickedOffline with the reason (default: kicked) as soon as the token is no
        # longer handed out; the reply comes once the secret store is updated (if that
        # fails, the reply is the error, subscribers get logoutFailed and the session
        # is served again). The owner, root and members of the configured admin group
        # may call it.
        method ForceLogout(provider: string, user: string, reason: ?string, ownerUid: ?int) -> ()

        # Refreshes the session's tokens now (for providers that can), joining a
        # refresh already in flight; answers with the session afterwards. A refresh
        # starts at most once per MinRefreshInterval= while the token is valid
        # (RefreshTooSoon).
        method Refresh(provider: string, user: string, ownerUid: ?int) -> (session: Session)

        # Stores the OAuth 2.0 client secret of an oauth2 provider in the secret
        # store (never in vaultd.conf). Root, the admin group, or the user vaultd
        # runs as.
        method SetProviderSecret(provider: string, secret: string) -> ()

        # The account is not logged in (ERR_NOT_LOGGED_IN).
        error NotLoggedIn (code: string, message: string)

        # A login of the account is already in progress.
        error LoginInProgress (code: string, message: string)

        # The provider is not defined in vaultd.conf.
        error UnknownProvider (code: string, message: string)

        # The token is missing, empty or malformed (AUTH_ERR_AUTH_TOKEN_NOT_FOUND).
        error InvalidCredential (code: string, message: string)

        # The token has expired, or would before minValidSeconds.
        error TokenExpired (code: string, message: string)

        # The user is deactivated at the provider (ERR_USER_DEACTIVATED).
        error UserDeactivated (code: string, message: string)

        # The user id is unknown at the provider (ERR_UID_NOT_FOUND).
        error UidNotFound (code: string, message: string)

        # The caller may not use this account.
        error AccessDenied (code: string, message: string)

        # The secret store cannot be reached.
        error StoreUnavailable (code: string, message: string)

        # The secret store's collection is locked.
        error StoreLocked (code: string, message: string)

        # The secret store refused or failed a read or write.
        error StoreFailed (code: string, message: string)

        # A parameter has a bad value.
        error InvalidParameter (code: string, message: string)

        # The provider could not be reached (ERR_NETWORK_ERROR).
        error NetworkError (code: string, message: string)

        # The configuration is invalid.
        error InvalidConfig (code: string, message: string)

        # The subscriber did not read its events fast enough and was dropped.
        error SubscriberTooSlow (code: string, message: string)

        # The caller's user has as many Subscribe streams open as vaultd allows one
        # user (root is not limited).
        error TooManySubscriptions (code: string, message: string)

        # The session's owner holds as many sessions as vaultd allows one user
        # (MaxSessionsPerUser=; root is not limited).
        error TooManySessions (code: string, message: string)

        # The session record (tokens and profile) is larger than MaxSessionSize=.
        error SessionTooLarge (code: string, message: string)

        # The session's tokens were refreshed less than MinRefreshInterval= ago and are
        # still valid: no refresh was started.
        error RefreshTooSoon (code: string, message: string)

        # The caller's user holds as many connections as vaultd allows one user
        # (MaxConnectionsPerUser=), or vaultd serves as many as it may; sent as the only
        # reply before the connection is closed.
        error TooManyConnections (code: string, message: string)

        # The reply would take more than the connection may have queued
        # (MaxOutputPerConnection=): read replies before sending more calls, or ask for
        # less (a smaller limit to ListSessions, a narrower Subscribe).
        error ReplyTooLarge (code: string, message: string)

        # vaultd failed in a way it did not expect.
        error InternalError (code: string, message: string)
        """
}
