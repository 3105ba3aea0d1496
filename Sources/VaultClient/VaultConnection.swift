import Glibc
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// A typed client of `io.vaultd.Vault` on one connection: one method per
/// interface method, typed values back, `VaultClientError` on failure.
/// Blocking, like `VarlinkClient`, whose raw calls stay available as `raw`.
///
///     let vault = try VaultConnection()
///     try vault.login(provider: "demo", user: "alice", token: token)
///     let token = try vault.token(provider: "demo", user: "alice", minValidSeconds: 300)
public final class VaultConnection {
    /// The underlying connection, for raw calls (`call`, `send`, `receive`).
    public let raw: VarlinkClient
    private let timeoutSeconds: Int?
    private let connectTimeoutSeconds: Int?

    /// Connects to vaultd at `path` (default: where vaultctl looks), with the
    /// timeouts of `VarlinkClient.init(path:timeoutSeconds:connectTimeoutSeconds:)`.
    public init(path: String? = nil, timeoutSeconds: Int? = nil, connectTimeoutSeconds: Int? = nil)
        throws(VaultClientError)
    {
        let path = path ?? SocketPath.default(environment: Environment.all(), uid: getuid())
        do {
            raw = try VarlinkClient(
                path: path, timeoutSeconds: timeoutSeconds, connectTimeoutSeconds: connectTimeoutSeconds)
        } catch {
            throw .client(error)
        }
        self.timeoutSeconds = timeoutSeconds
        self.connectTimeoutSeconds = connectTimeoutSeconds
    }

    /// The socket this connection is on.
    public var path: String { raw.path }

    // MARK: Methods of io.vaultd.Vault

    /// Logs an account in with a ready token (CometChat authToken, OpenIM token).
    /// `expiresAt` overrides a JWT's `exp`; `ownerUID` names whose session (root and admins).
    @discardableResult
    public func login(
        provider: String, user: String, token: String, expiresAt: UnixTime? = nil, profile: UserProfile? = nil,
        ownerUID: UInt32? = nil, replace: Bool = false
    ) throws(VaultClientError) -> LoginResult {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["token"] = .string(token)
        return try login(parameters, expiresAt: expiresAt, profile: profile, replace: replace)
    }

    /// Logs an account in with an OAuth 2.0 token response as the token
    /// endpoint sent it (`access_token`, `refresh_token`, `expires_in`, ...).
    @discardableResult
    public func login(
        provider: String, user: String, tokenResponse: JSON, expiresAt: UnixTime? = nil,
        profile: UserProfile? = nil, ownerUID: UInt32? = nil, replace: Bool = false
    ) throws(VaultClientError) -> LoginResult {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["tokenResponse"] = tokenResponse
        return try login(parameters, expiresAt: expiresAt, profile: profile, replace: replace)
    }

    /// Logs an account in with tokens the provider obtains itself (client
    /// credentials, an exec provider's helper).
    @discardableResult
    public func loginFromProvider(
        provider: String, user: String, profile: UserProfile? = nil, ownerUID: UInt32? = nil, replace: Bool = false
    ) throws(VaultClientError) -> LoginResult {
        try login(Self.account(provider, user, ownerUID), expiresAt: nil, profile: profile, replace: replace)
    }

    /// Logs an account out and deletes its stored session.
    public func logout(provider: String, user: String, ownerUID: UInt32? = nil) throws(VaultClientError) {
        _ = try call(.logout, Self.account(provider, user, ownerUID))
    }

    /// The session of one account.
    public func session(provider: String, user: String, ownerUID: UInt32? = nil) throws(VaultClientError)
        -> Session
    {
        let reply = try call(.getSession, Self.account(provider, user, ownerUID))
        return try Self.session(reply.parameters["session"], of: .getSession)
    }

    /// One page of the sessions the caller may see: at most `limit` (vaultd's
    /// default when nil) after the cursor `after`.
    public func sessionsPage(limit: Int? = nil, after: String? = nil) throws(VaultClientError) -> SessionListPage {
        var parameters: [String: JSON] = [:]
        parameters["limit"] = limit.map { .int(Int64($0)) }
        parameters["after"] = after.map(JSON.string)
        let reply = try call(.listSessions, parameters)
        guard let list = reply.parameters["sessions"]?.arrayValue else {
            throw .unexpectedReply(method: VaultMethod.listSessions.rawValue, detail: "no sessions array")
        }
        var sessions: [Session] = []
        for json in list { sessions.append(try Self.session(json, of: .listSessions)) }
        return SessionListPage(
            sessions: sessions, next: reply.parameters["next"]?.stringValue,
            store: reply.parameters["store"]?.stringValue)
    }

    /// Every session the caller may see, following `ListSessions`' pages to
    /// the last. A page too large for the connection's output limit
    /// (`ReplyTooLarge`) is asked for again in halves.
    public func sessions(pageSize: Int? = nil) throws(VaultClientError) -> [Session] {
        try sessionList(pageSize: pageSize).sessions
    }

    /// Every session the caller may see, as `sessions(pageSize:)`, and the
    /// store's state on the last page (nil when vaultd did not say).
    public func sessionList(pageSize: Int? = nil) throws(VaultClientError) -> (sessions: [Session], store: String?) {
        var sessions: [Session] = []
        var after: String?
        var limit = pageSize
        while true {
            let page: SessionListPage
            do { page = try sessionsPage(limit: limit, after: after) } catch {
                guard error.vaultCode == .replyTooLarge, limit ?? 2 > 1 else { throw error }
                limit = max(1, (limit ?? SessionPage.defaultLimit) / 2)
                continue
            }
            sessions += page.sessions
            guard let next = page.next, next != after else { return (sessions, page.store) }
            after = next
        }
    }

    /// The current access token of a session; with `minValidSeconds`, one
    /// valid at least that long (vaultd refreshes first where it can). For an
    /// account vaultd keeps logged in (`AutoLogin=yes`) that is not logged in
    /// now, vaultd waits up to `waitSeconds` (its default: 30) for its login.
    public func token(
        provider: String, user: String, minValidSeconds: Int64? = nil, ownerUID: UInt32? = nil,
        waitSeconds: Int64? = nil
    ) throws(VaultClientError) -> Token {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["minValidSeconds"] = minValidSeconds.map(JSON.int)
        parameters["waitSeconds"] = waitSeconds.map(JSON.int)
        return try Self.token(from: try call(.getToken, parameters))
    }

    /// The token a `GetToken` reply that is not an error carries.
    public static func token(from reply: VarlinkReply) throws(VaultClientError) -> Token {
        let p = ParameterReader(reply.parameters)
        do throws(ParameterReader.Invalid) {
            guard let owner = try p.optionalUID("ownerUid") else {
                throw ParameterReader.Invalid(parameter: "ownerUid")
            }
            return Token(
                value: Secret(try p.string("token")), tokenType: try p.optionalString("tokenType"),
                expiresAt: try p.optionalInt("expiresAt").map(UnixTime.init(seconds:)),
                instanceURL: try p.optionalString("instanceUrl"), ownerUID: owner,
                scope: try p.optionalString("scope"))
        } catch {
            throw .unexpectedReply(method: VaultMethod.getToken.rawValue, detail: "a bad '\(error.parameter)'")
        }
    }

    /// Refreshes the session's tokens now and returns the session afterwards.
    @discardableResult
    public func refresh(provider: String, user: String, ownerUID: UInt32? = nil) throws(VaultClientError) -> Session {
        let reply = try call(.refresh, Self.account(provider, user, ownerUID))
        return try Self.session(reply.parameters["session"], of: .refresh)
    }

    /// Logs an account out at once (its chat server kicked it, or an admin
    /// says so); subscribers see `kickedOffline` with `reason` (default: kicked).
    public func forceLogout(provider: String, user: String, reason: String? = nil, ownerUID: UInt32? = nil)
        throws(VaultClientError)
    {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["reason"] = reason.map(JSON.string)
        _ = try call(.forceLogout, parameters)
    }

    /// Tells vaultd that the chat server rejected `token`, a token of this
    /// session; only its SHA-256 is sent. vaultd refreshes the session (once
    /// for all reporters), ends it when it cannot be refreshed, or does
    /// nothing when the token is no longer the current one (read it again).
    @discardableResult
    public func reportRejected(provider: String, user: String, token: Secret, ownerUID: UInt32? = nil)
        throws(VaultClientError) -> RejectedOutcome
    {
        try reportRejected(provider: provider, user: user, tokenHash: SHA256.hexDigest(of: token), ownerUID: ownerUID)
    }

    /// `reportRejected(provider:user:token:ownerUID:)` with the token's
    /// SHA-256 already computed, as 64 lowercase hex digits.
    @discardableResult
    public func reportRejected(provider: String, user: String, tokenHash: String, ownerUID: UInt32? = nil)
        throws(VaultClientError) -> RejectedOutcome
    {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["tokenHash"] = .string(tokenHash)
        let reply = try call(.reportRejected, parameters)
        guard let outcome = reply.parameters["outcome"]?.stringValue.flatMap(RejectedOutcome.init(rawValue:)) else {
            throw .unexpectedReply(method: VaultMethod.reportRejected.rawValue, detail: "no known outcome")
        }
        return outcome
    }

    /// Reports this client's own connection to the chat server for a session
    /// (OpenIM's connection callbacks), as `client` (default: the executable's
    /// name). The report lasts as long as this connection; `kickedOffline`
    /// ends the session as `forceLogout` does.
    public func setConnectionState(
        provider: String, user: String, state: ClientConnectionState, client: String? = nil, ownerUID: UInt32? = nil
    ) throws(VaultClientError) {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["state"] = .string(state.rawValue)
        parameters["client"] = client.map(JSON.string)
        _ = try call(.setConnectionState, parameters)
    }

    /// Stores the OAuth 2.0 client secret of an oauth2 provider in the secret store.
    public func setProviderSecret(provider: String, secret: Secret) throws(VaultClientError) {
        _ = try call(.setProviderSecret, ["provider": .string(provider), "secret": .string(secret.revealed)])
    }

    /// Subscribes to what happens to the sessions the caller may see, narrowed
    /// by `provider`, `user` and `kinds`, on a connection of its own (a stream
    /// holds its connection for as long as it lasts) with this one's timeouts.
    /// The stream starts with the snapshot; its events follow.
    ///
    /// With `reconnect`, the stream outlives a restart of vaultd: when its
    /// connection closes or vaultd ends it (stopping, or this reader fell
    /// behind), `next()` connects again on the policy's schedule, subscribes
    /// with the same filters and goes on with the events after that.
    /// `snapshot` then holds the sessions as they are after the restart and
    /// `onReconnect` is called with them; events that happened while vaultd
    /// was away are not replayed, so compare the snapshots to learn what
    /// changed. Without it (the default), the stream ends with the connection.
    public func subscribe(
        provider: String? = nil, user: String? = nil, kinds: [EventKind] = [], reconnect: ReconnectPolicy? = nil
    ) throws(VaultClientError) -> VaultEventStream {
        let (path, timeout, connectTimeout) = (path, timeoutSeconds, connectTimeoutSeconds)
        let connect = { () throws(VaultClientError) -> VarlinkClient in
            do throws(ClientError) {
                return try VarlinkClient(path: path, timeoutSeconds: timeout, connectTimeoutSeconds: connectTimeout)
            } catch {
                throw .client(error)
            }
        }
        let stream = try VaultEventStream(try connect(), provider: provider, user: user, kinds: kinds)
        if let reconnect { stream.reconnection = VaultEventStream.Reconnection(policy: reconnect, connect: connect) }
        return stream
    }

    // MARK: Plumbing

    /// Calls `method` and returns its reply, or throws the error it answered with.
    public func call(_ method: VaultMethod, _ parameters: [String: JSON]) throws(VaultClientError) -> VarlinkReply {
        let reply: VarlinkReply
        do { reply = try raw.call(method.rawValue, parameters) } catch { throw .client(error) }
        if let error = VarlinkErrorReply(reply) { throw .reply(error) }
        return reply
    }

    private func login(_ parameters: [String: JSON], expiresAt: UnixTime?, profile: UserProfile?, replace: Bool)
        throws(VaultClientError) -> LoginResult
    {
        var parameters = parameters
        parameters["expiresAt"] = expiresAt.map { .int($0.seconds) }
        parameters["profile"] = profile.map { $0.json() }
        if replace { parameters["replace"] = true }
        let reply = try call(.login, parameters)
        return LoginResult(
            session: try Self.session(reply.parameters["session"], of: .login),
            created: reply.parameters["created"]?.boolValue ?? false,
            replaced: reply.parameters["replaced"]?.boolValue ?? false)
    }

    static func account(_ provider: String, _ user: String, _ ownerUID: UInt32?) -> [String: JSON] {
        var parameters: [String: JSON] = ["provider": .string(provider), "user": .string(user)]
        parameters["ownerUid"] = ownerUID.map { .int(Int64($0)) }
        return parameters
    }

    static func session(_ json: JSON?, of method: VaultMethod) throws(VaultClientError) -> Session {
        do { return try Session(json: json ?? .null) } catch {
            throw .unexpectedReply(method: method.rawValue, detail: "a session with a bad '\(error.field)'")
        }
    }
}
