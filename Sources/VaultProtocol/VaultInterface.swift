import Varlink
import VaultCore

/// The interface `io.vaultd.Vault`, declared once as data: its types, its
/// methods with their typed parameters and output, and its errors (from
/// `VaultError.Code.declaration`). The interface definition text
/// (`GetInterfaceDescription`, `docs/io.vaultd.Vault.varlink`), the checks a
/// call passes before its handler runs, and the binding of handlers derive
/// from it. Adding a method: a `VaultMethod` case, its declaration below, and
/// its handler in `VaultMethods`.
public enum VaultInterface {
    /// The interface name.
    public static let name = "io.vaultd.Vault"

    /// The interface, as data.
    public static let declaration = VarlinkInterfaceDeclaration(
        name,
        doc: """
            vaultd keeps the sessions of chat and messaging services (CometChat, OpenIM,
            Salesforce and the like) in the Linux secret store and shares them with every
            local process of their owner. An account is a provider (a section of
            vaultd.conf) and a user id at that provider. A session is an account held by
            one local user (its owner, ownerUid): two users may each hold one of the
            same account and neither sees the other's. Calls address the caller's own
            session; for an account that vaultd.conf declares ([Account PROVIDER USER]
            Owner=), the declared owner's. Root and the admin group may name another
            user's session with ownerUid; when they name none and hold none of the
            account, the only session of it there is is meant.
            """,
        types: types,
        methods: VaultMethod.allCases.map(\.declaration),
        errors: VaultError.Code.allCases.map { code in
            VarlinkErrorDeclaration(
                code.varlinkErrorName, doc: code.declaration.doc,
                parameters: [
                    VarlinkField("code", .string), VarlinkField("message", .string),
                    VarlinkField("providerCode", .nullable(.string)),
                    VarlinkField("providerMessage", .nullable(.string)),
                ]
                    + (code.declaration.retryAt ? [VarlinkField("retryAt", .nullable(.int))] : []))
        })

    /// The interface definition text, as `GetInterfaceDescription` returns it
    /// and `docs/io.vaultd.Vault.varlink` holds it (a test keeps the two identical).
    public static let description = declaration.idl

    /// The types the methods use.
    static let types: [VarlinkTypeDeclaration] = [
        VarlinkTypeDeclaration(
            "LoginState", doc: "The login state of an account, as OpenIM names them.",
            .enumeration(["logout", "logging", "logged"])),
        VarlinkTypeDeclaration(
            "StoreState",
            doc: """
                Whether vaultd can write to its secret store now: available; unavailable (the
                Secret Service or the session bus is gone: tokens are served from memory,
                changes are refused with StoreUnavailable, and vaultd reconnects with
                backoff and then writes through what it holds); locked (the collection is
                locked: the same, with StoreLocked, until someone unlocks it).
                """,
            .enumeration(["available", "unavailable", "locked"])),
        VarlinkTypeDeclaration(
            "UserProfile",
            doc: """
                The user a session belongs to: the fields of CometChat's User object.
                Times are Unix seconds.
                """,
            .structure([
                VarlinkField("uid", .string),
                VarlinkField("name", .nullable(.string)),
                VarlinkField("avatar", .nullable(.string)),
                VarlinkField("role", .nullable(.string)),
                VarlinkField("metadata", .nullable(.object)),
                VarlinkField("status", .nullable(.string)),
                VarlinkField("statusMessage", .nullable(.string)),
                VarlinkField("lastActiveAt", .nullable(.int)),
                VarlinkField("deactivatedAt", .nullable(.int)),
            ])),
        VarlinkTypeDeclaration(
            "Session",
            doc: """
                A session as clients see it. Never holds a secret: token is masked. For
                providers that refresh: when the next refresh is due (refreshAt), the last
                one (lastRefreshAt), failures since the last success, the last error, when
                the next retry is (nextRetryAt), and the connection state (connecting,
                connected, connectFailed). An account that is not logged in but failed to
                (state logout) or that vaultd keeps logged in (AutoLogin=yes) shows its failed
                logins: consecutiveFailures, lastError and lastErrorCode, and nextRetryAt, before
                which no login that asks the provider starts (LoginBackingOff). lastErrorCode is
                vaultd's code of the last failure, lastProviderCode and lastProviderMessage the
                provider's own code and words, as the error and the event carried them. clients:
                the clients that report their own connection to the chat server
                (SetConnectionState), absent when none does. tokenFileError: why the
                session's TokenFile= could not be written, until a later write succeeds.
                """,
            .structure([
                VarlinkField("provider", .string),
                VarlinkField("user", .string),
                VarlinkField("state", .named("LoginState")),
                VarlinkField("profile", .nullable(.named("UserProfile"))),
                VarlinkField("createdAt", .nullable(.int)),
                VarlinkField("expiresAt", .nullable(.int)),
                VarlinkField("ownerUid", .nullable(.int)),
                VarlinkField("tokenType", .nullable(.string)),
                VarlinkField("scope", .nullable(.string)),
                VarlinkField("instanceUrl", .nullable(.string)),
                VarlinkField("hasRefreshToken", .bool),
                VarlinkField("token", .nullable(.string)),
                VarlinkField("refreshAt", .nullable(.int)),
                VarlinkField("lastRefreshAt", .nullable(.int)),
                VarlinkField("consecutiveFailures", .nullable(.int)),
                VarlinkField("lastError", .nullable(.string)),
                VarlinkField("nextRetryAt", .nullable(.int)),
                VarlinkField("connection", .nullable(.string)),
                VarlinkField("clients", .nullable(.array(.named("ClientConnection")))),
                VarlinkField("lastErrorCode", .nullable(.string)),
                VarlinkField("tokenFileError", .nullable(.string)),
                VarlinkField("lastProviderCode", .nullable(.string)),
                VarlinkField("lastProviderMessage", .nullable(.string)),
            ])),
        VarlinkTypeDeclaration(
            "Event",
            doc: """
                Something that happened to an account, as the chat SDKs' callbacks report
                it. kind is one of loginSuccess, loginFailed, logoutSuccess, logoutFailed,
                tokenRefreshed, tokenExpired, tokenInvalid, kickedOffline, connectionChanged,
                storeChanged, tokenFileFailed. reason says why (kickedOffline: kicked, revoked,
                admin, switched, ...; storeChanged: the new StoreState, sent for every live
                session; tokenFileFailed: write or remove; connectionChanged: the new
                state, told only when it changes). A failure (loginFailed, logoutFailed,
                tokenInvalid, connectFailed) carries vaultd's code and message, and the
                provider's own providerCode and providerMessage when it named them: the same
                pair as the error reply and GetSession. Never holds a secret.
                """,
            .structure([
                VarlinkField("kind", .string),
                VarlinkField("provider", .string),
                VarlinkField("user", .string),
                VarlinkField("ownerUid", .int),
                VarlinkField("time", .int),
                VarlinkField("reason", .nullable(.string)),
                VarlinkField("code", .nullable(.string)),
                VarlinkField("expiresAt", .nullable(.int)),
                VarlinkField("message", .nullable(.string)),
                VarlinkField("source", .nullable(.string)),
                VarlinkField("client", .nullable(.string)),
                VarlinkField("providerCode", .nullable(.string)),
                VarlinkField("providerMessage", .nullable(.string)),
            ])),
        VarlinkTypeDeclaration(
            "ClientConnection",
            doc: """
                A client that reports its own connection to the chat server (SetConnectionState):
                the name it gave, its pid, its state (connecting, connected, connectFailed) and
                since when (Unix seconds). Listed for as long as its connection to vaultd is open.
                """,
            .structure([
                VarlinkField("name", .string),
                VarlinkField("pid", .int),
                VarlinkField("state", .string),
                VarlinkField("since", .int),
            ])),
    ]
}

/// The methods of `io.vaultd.Vault`, by their full names.
public enum VaultMethod: String, Sendable, CaseIterable {
    case login = "io.vaultd.Vault.Login"
    case logout = "io.vaultd.Vault.Logout"
    case getSession = "io.vaultd.Vault.GetSession"
    case listSessions = "io.vaultd.Vault.ListSessions"
    case getToken = "io.vaultd.Vault.GetToken"
    case subscribe = "io.vaultd.Vault.Subscribe"
    case forceLogout = "io.vaultd.Vault.ForceLogout"
    case refresh = "io.vaultd.Vault.Refresh"
    case setProviderSecret = "io.vaultd.Vault.SetProviderSecret"
    case reportRejected = "io.vaultd.Vault.ReportRejected"
    case setConnectionState = "io.vaultd.Vault.SetConnectionState"
    case startDeviceLogin = "io.vaultd.Vault.StartDeviceLogin"
    case pollDeviceLogin = "io.vaultd.Vault.PollDeviceLogin"
    case beginBrowserLogin = "io.vaultd.Vault.BeginBrowserLogin"
    case finishBrowserLogin = "io.vaultd.Vault.FinishBrowserLogin"

    /// The method's declaration: its doc comment, parameters and output.
    public var declaration: VarlinkMethodDeclaration {
        switch self {
        case .login:
            return VarlinkMethodDeclaration(
                "Login",
                doc: """
                    Logs an account in with a ready token (CometChat authToken, OpenIM token) or
                    an OAuth 2.0 token response as the token endpoint sent it (access_token,
                    refresh_token, expires_in, token_type, scope, instance_url, issued_at).
                    Exactly one of token and tokenResponse. expiresAt (Unix seconds) overrides
                    expires_in and a JWT's exp. An account that is already logged in answers
                    with its existing session and created false; a login that joins one in
                    flight gets that login's result. Without a token (or for an exec provider,
                    whose helper acts with the provider's own credential) the provider issues
                    the tokens: only root, the admin group, the account's declared Owner=, the
                    user vaultd runs as and [Provider] MintUsers=/MintGroups= may ask for that.
                    One user (but root) may hold MaxSessionsPerUser= sessions (TooManySessions);
                    a session may take MaxSessionSize= bytes (SessionTooLarge).
                    With replace, a logged-in session gets the new tokens instead: they are in
                    the secret store before the reply, served at once, subscribers get
                    tokenRefreshed with reason replaced, and a replaced refresh token is
                    revoked at the provider (queued in the store first); replaced is then true.
                    Without a profile the session keeps its own.
                    profile: the user's (CometChat User fields; uid must be user). Without one,
                    the profile is an exec helper's when vaultd obtained the tokens, else the
                    claims of an id_token in the token response (read unverified, shown only,
                    never used to decide anything), else the uid alone.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("token", .nullable(.string)),
                    VarlinkField("tokenResponse", .nullable(.object)),
                    VarlinkField("profile", .nullable(.named("UserProfile"))),
                    VarlinkField("expiresAt", .nullable(.int)),
                    VarlinkField("ownerUid", .nullable(.int)),
                    VarlinkField("replace", .nullable(.bool)),
                ],
                output: [
                    VarlinkField("session", .named("Session")),
                    VarlinkField("created", .bool),
                    VarlinkField("replaced", .nullable(.bool)),
                ])
        case .logout:
            return VarlinkMethodDeclaration(
                "Logout",
                doc: """
                    Logs an account out and deletes its stored session. Subscribers get
                    logoutSuccess as soon as the token is no longer handed out; the reply comes
                    once the secret store is updated (if that fails, the reply is the error,
                    subscribers get logoutFailed and the session is served again).
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("ownerUid", .nullable(.int)),
                ],
                output: [])
        case .getSession:
            return VarlinkMethodDeclaration(
                "GetSession",
                doc: "The session of one account (getLoggedInUser).",
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("ownerUid", .nullable(.int)),
                ],
                output: [
                    VarlinkField("session", .named("Session"))
                ])
        case .listSessions:
            return VarlinkMethodDeclaration(
                "ListSessions",
                doc: """
                    The sessions the caller may see, ordered by provider, user and owner, a page
                    at a time: at most limit of them (default 100, at most 1000), starting after
                    the cursor after. next is the cursor of the following page, absent on the
                    last; pass it back as after, unchanged (it is opaque). A client that passes
                    neither gets the first page. store says whether changes can be stored now.
                    """,
                parameters: [
                    VarlinkField("limit", .nullable(.int)),
                    VarlinkField("after", .nullable(.string)),
                ],
                output: [
                    VarlinkField("sessions", .array(.named("Session"))),
                    VarlinkField("next", .nullable(.string)),
                    VarlinkField("store", .nullable(.named("StoreState"))),
                ])
        case .getToken:
            return VarlinkMethodDeclaration(
                "GetToken",
                doc: """
                    The current access token of a session the caller owns, or of a declared
                    account whose TokenReadUsers=/TokenReadGroups= name the caller; ownerUid in
                    the reply says whose session it came from. minValidSeconds asks for a token
                    valid at least that long from now: vaultd refreshes first where it can, at
                    most once per MinRefreshInterval=, and answers TokenExpired at once when no
                    token of the session lives that long. For an account vaultd keeps logged in
                    (AutoLogin=yes) that is not logged in now, the call waits for vaultd's login
                    in flight or due within waitSeconds (default 30, at most 300; 0 does not
                    wait), and answers NotLoggedIn or LoginBackingOff when none comes by then.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("minValidSeconds", .nullable(.int)),
                    VarlinkField("ownerUid", .nullable(.int)),
                    VarlinkField("waitSeconds", .nullable(.int)),
                ],
                output: [
                    VarlinkField("token", .string),
                    VarlinkField("tokenType", .nullable(.string)),
                    VarlinkField("expiresAt", .nullable(.int)),
                    VarlinkField("instanceUrl", .nullable(.string)),
                    VarlinkField("ownerUid", .int),
                    VarlinkField("scope", .nullable(.string)),
                ])
        case .subscribe:
            return VarlinkMethodDeclaration(
                "Subscribe",
                doc: """
                    Streams what happens to the sessions the caller may see; call it with more.
                    The first reply is a snapshot (sessions and store, no event); then one reply per event
                    (event, no sessions), in the order of the changes, for as long as the
                    connection stays open. provider, user and kinds narrow what is sent. A
                    subscriber that does not read is dropped with SubscriberTooSlow once its
                    queue is full. One user (but root) may keep 64 streams open at once; one more
                    is refused with TooManySubscriptions.
                    """,
                parameters: [
                    VarlinkField("provider", .nullable(.string)),
                    VarlinkField("user", .nullable(.string)),
                    VarlinkField("kinds", .nullable(.array(.string))),
                ],
                output: [
                    VarlinkField("sessions", .nullable(.array(.named("Session")))),
                    VarlinkField("event", .nullable(.named("Event"))),
                    VarlinkField("store", .nullable(.named("StoreState"))),
                ], streams: true)
        case .forceLogout:
            return VarlinkMethodDeclaration(
                "ForceLogout",
                doc: """
                    Logs an account out at once because its chat server kicked it offline
                    (OpenIM onKickedOffline) or an administrator says so. Subscribers get
                    kickedOffline with the reason (default: kicked) as soon as the token is no
                    longer handed out; the reply comes once the secret store is updated (if that
                    fails, the reply is the error, subscribers get logoutFailed and the session
                    is served again). The owner, root and members of the configured admin group
                    may call it.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("reason", .nullable(.string)),
                    VarlinkField("ownerUid", .nullable(.int)),
                ],
                output: [])
        case .refresh:
            return VarlinkMethodDeclaration(
                "Refresh",
                doc: """
                    Refreshes the session's tokens now (for providers that can), joining a
                    refresh already in flight; answers with the session afterwards. A refresh
                    starts at most once per MinRefreshInterval= after the last one, failed or not,
                    while the token is valid (RefreshTooSoon), waits out the backoff of a failed
                    one and the server's Retry-After (RefreshBackingOff), and counts against the
                    caller's provider requests (TooManyProviderRequests); each refusal says in
                    retryAt when to try again, and sends nothing to the provider.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("ownerUid", .nullable(.int)),
                ],
                output: [
                    VarlinkField("session", .named("Session"))
                ])
        case .setProviderSecret:
            return VarlinkMethodDeclaration(
                "SetProviderSecret",
                doc: """
                    Stores the OAuth 2.0 client secret of an oauth2 provider in the secret
                    store (never in vaultd.conf). Root, the admin group, or the user vaultd
                    runs as.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("secret", .string),
                ],
                output: [])
        case .reportRejected:
            return VarlinkMethodDeclaration(
                "ReportRejected",
                doc: """
                    The chat server rejected a token of this session. tokenHash is the SHA-256 of
                    the token, as 64 lowercase hex digits, so the token itself never travels.
                    When it is the session's current token, vaultd refreshes the session once for
                    every reporter (later reports join the refresh in flight; at most once per
                    MinRefreshInterval=, RefreshTooSoon) and outcome is refreshed; a provider that
                    cannot refresh it ends the session with tokenInvalid (reason rejected) and
                    outcome is ended. When it is no longer the current token, nothing is done and
                    outcome is alreadyReplaced: read the token again. The owner and the token's
                    readers may report.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("tokenHash", .string),
                    VarlinkField("ownerUid", .nullable(.int)),
                ],
                output: [
                    VarlinkField("outcome", .string)
                ])
        case .setConnectionState:
            return VarlinkMethodDeclaration(
                "SetConnectionState",
                doc: """
                    A client reports its own connection to the chat server for a session, as
                    OpenIM's connection callbacks: state is connecting, connected, connectFailed or
                    kickedOffline; client names the client (default: its executable's name).
                    The session's owner or root may report. The client is listed in the session
                    (clients) for as long as this connection to vaultd stays open, at most 64
                    per session (TooManyClients); subscribers get connectionChanged with source
                    client when its state changes, and with reason clientGone when the
                    connection closes. kickedOffline ends the session as ForceLogout does
                    (kickedOffline, reason kicked); the reply comes once it is stored.
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("state", .string),
                    VarlinkField("client", .nullable(.string)),
                    VarlinkField("ownerUid", .nullable(.int)),
                ],
                output: [])
        case .startDeviceLogin:
            return VarlinkMethodDeclaration(
                "StartDeviceLogin",
                doc: """
                    Starts an OAuth 2.0 device login (RFC 8628) of an account at an oauth2
                    provider with DeviceAuthorizationURL=: vaultd asks the provider for a user
                    code, which the user enters at verificationUri (or opens
                    verificationUriComplete), and keeps the device code itself. The caller must
                    be one who may log the account in (as Login). login names the pending login
                    for PollDeviceLogin: only the caller's uid (or root) may poll it; at most 4
                    wait per uid (root excepted), held in memory until they end or expiresIn
                    seconds pass (a restart of vaultd loses them).
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("ownerUid", .nullable(.int)),
                    VarlinkField("replace", .nullable(.bool)),
                ],
                output: [
                    VarlinkField("login", .string),
                    VarlinkField("userCode", .string),
                    VarlinkField("verificationUri", .string),
                    VarlinkField("verificationUriComplete", .nullable(.string)),
                    VarlinkField("expiresIn", .int),
                    VarlinkField("interval", .int),
                ])
        case .pollDeviceLogin:
            return VarlinkMethodDeclaration(
                "PollDeviceLogin",
                doc: """
                    Waits until the device login's next poll is due (interval seconds after the
                    last, 5 more after each slow_down; at most 25 seconds per call), polls the
                    provider's token endpoint once, and answers pending true while the user has
                    not finished (call again), or the login done as Login with the token response
                    does it (session, created, replaced). The user's refusal is LoginDenied, an
                    expired device code (or an unknown login, or another user's) LoginExpired. A
                    client that stops calling stops the polling.
                    """,
                parameters: [
                    VarlinkField("login", .string)
                ],
                output: [
                    VarlinkField("pending", .bool),
                    VarlinkField("interval", .nullable(.int)),
                    VarlinkField("session", .nullable(.named("Session"))),
                    VarlinkField("created", .nullable(.bool)),
                    VarlinkField("replaced", .nullable(.bool)),
                ])
        case .beginBrowserLogin, .finishBrowserLogin: return browserLoginDeclaration
        }
    }
}
