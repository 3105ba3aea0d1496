import Glibc
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// An error reply from vaultd, as the wire carries it: the Varlink error name,
/// the seed-style code and the message (vaultd's own errors carry both; the
/// `org.varlink.service` ones carry their parameter instead).
public struct VarlinkErrorReply: Sendable, Equatable, CustomStringConvertible {
    /// The full Varlink error name: `io.vaultd.Vault.NotLoggedIn`.
    public var name: String
    /// vaultd's code (`ERR_NOT_LOGGED_IN`); nil for `org.varlink.service` errors.
    public var code: String?
    /// What happened, for a human.
    public var message: String
    /// The provider's own code for the failure (`invalid_grant`,
    /// `AUTH_ERR_APIKEY_NOT_FOUND`), when it named one.
    public var providerCode: String?
    /// What the provider said of the failure, masked.
    public var providerMessage: String?
    /// The reply's parameters as they came.
    public var parameters: [String: JSON]

    /// The error of `reply`; nil when it is not an error.
    public init?(_ reply: VarlinkReply) {
        guard let name = reply.error else { return nil }
        self.name = name
        parameters = reply.parameters
        code = reply.parameters["code"]?.stringValue
        providerCode = reply.parameters["providerCode"]?.stringValue
        providerMessage = reply.parameters["providerMessage"]?.stringValue
        if let message = reply.parameters["message"]?.stringValue {
            self.message = message
        } else if let parameter = reply.parameters["parameter"]?.stringValue {
            self.message = "invalid parameter '\(parameter)'"
        } else {
            self.message = name
        }
    }

    /// vaultd's error code, when this is one of `io.vaultd.Vault`'s errors.
    public var vaultCode: VaultError.Code? {
        VaultError(reply: VarlinkReply(error: name, parameters: parameters))?.code
    }

    /// The message and the codes, as vaultctl prints them:
    /// `message (CODE)`, or `message (CODE; provider: PROVIDER_CODE)`.
    public var description: String {
        "\(message) (\(code ?? name)\(providerCode.map { "; provider: \($0)" } ?? ""))"
    }
}

/// Why a typed call of `io.vaultd.Vault` failed.
public enum VaultClientError: Error, Sendable, Equatable, CustomStringConvertible {
    /// vaultd answered with an error.
    case reply(VarlinkErrorReply)
    /// No answer: vaultd is not reachable, not trusted, too slow, or the connection broke.
    case client(ClientError)
    /// vaultd answered with something the interface does not declare.
    case unexpectedReply(method: String, detail: String)

    /// The Varlink error name of an error reply.
    public var varlinkName: String? {
        if case .reply(let reply) = self { return reply.name }
        return nil
    }

    /// The seed-style code of an error reply (`ERR_NOT_LOGGED_IN`).
    public var code: String? {
        if case .reply(let reply) = self { return reply.code }
        return nil
    }

    /// What happened, for a human.
    public var message: String {
        switch self {
        case .reply(let reply): return reply.message
        case .client(let error): return error.description
        case .unexpectedReply(let method, let detail): return "vaultd answered \(method) with \(detail)"
        }
    }

    /// vaultd's error code, when vaultd answered with one of its errors.
    public var vaultCode: VaultError.Code? {
        if case .reply(let reply) = self { return reply.vaultCode }
        return nil
    }

    public var description: String {
        if case .reply(let reply) = self { return reply.description }
        return message
    }
}

/// A session as vaultd shows it (`io.vaultd.Vault` type `Session`). Never
/// holds a secret: `maskedToken` is masked by vaultd.
public struct Session: Sendable, Equatable {
    public var account: Account
    public var state: LoginState
    public var profile: UserProfile?
    public var createdAt: UnixTime?
    public var expiresAt: UnixTime?
    /// Whose session it is.
    public var ownerUID: UInt32?
    public var tokenType: String?
    public var scope: String?
    /// Salesforce's instance URL: where API calls for this session go.
    public var instanceURL: String?
    public var hasRefreshToken: Bool
    /// The access token as vaultd shows it: masked.
    public var maskedToken: String?
    /// When the next refresh is due (refreshing providers).
    public var refreshAt: UnixTime?
    public var lastRefreshAt: UnixTime?
    /// Refresh failures since the last success.
    public var consecutiveFailures: Int64?
    public var lastError: String?
    public var nextRetryAt: UnixTime?
    /// connecting, connected or connectFailed (providers with a connection).
    public var connection: String?
    /// The code of the last failure, where known (failed logins: the session
    /// is then in state `logout`, and `nextRetryAt` says when a login that
    /// asks the provider is allowed again).
    public var lastErrorCode: String?
    /// The clients that report their own connection to the chat server.
    public var clients: [ClientReport] = []
    /// The session object as vaultd sent it, fields this client does not know included.
    public var json: JSON

    /// Reads a session object; nil names the field that is missing or malformed.
    init(json: JSON) throws(FieldError) {
        guard let o = json.objectValue else { throw FieldError("session") }
        let p = ParameterReader(o)
        do {
            account = Account(provider: try p.string("provider"), user: try p.string("user"))
            guard let state = LoginState(rawValue: try p.string("state")) else { throw FieldError("state") }
            self.state = state
            if let profile = try p.optionalObject("profile") {
                do { self.profile = try UserProfile(json: profile) } catch { throw FieldError("profile") }
            }
            createdAt = try p.optionalInt("createdAt").map(UnixTime.init(seconds:))
            expiresAt = try p.optionalInt("expiresAt").map(UnixTime.init(seconds:))
            ownerUID = try p.optionalUID("ownerUid")
            tokenType = try p.optionalString("tokenType")
            scope = try p.optionalString("scope")
            instanceURL = try p.optionalString("instanceUrl")
            hasRefreshToken = o["hasRefreshToken"]?.boolValue ?? false
            maskedToken = try p.optionalString("token")
            refreshAt = try p.optionalInt("refreshAt").map(UnixTime.init(seconds:))
            lastRefreshAt = try p.optionalInt("lastRefreshAt").map(UnixTime.init(seconds:))
            consecutiveFailures = try p.optionalInt("consecutiveFailures")
            lastError = try p.optionalString("lastError")
            nextRetryAt = try p.optionalInt("nextRetryAt").map(UnixTime.init(seconds:))
            connection = try p.optionalString("connection")
            lastErrorCode = try p.optionalString("lastErrorCode")
            for item in o["clients"]?.arrayValue ?? [] {
                guard let c = item.objectValue else { throw FieldError("clients") }
                let r = ParameterReader(c)
                guard let state = ClientConnectionState(rawValue: try r.string("state")),
                    let pid = try r.optionalInt("pid").flatMap({ Int32(exactly: $0) }),
                    let since = try r.optionalInt("since")
                else { throw FieldError("clients") }
                // vaultd's connection id is its own business: 0 here.
                clients.append(
                    ClientReport(
                        connection: 0, name: try r.string("name"), pid: pid, state: state,
                        since: UnixTime(seconds: since)))
            }
        } catch let invalid as ParameterReader.Invalid {
            throw FieldError(invalid.parameter)
        } catch let error as FieldError {
            throw error
        } catch {
            throw FieldError("session")
        }
        self.json = json
    }
}

/// A field of a reply that is missing or of the wrong type.
struct FieldError: Error {
    var field: String
    init(_ field: String) { self.field = field }
}

/// The answer to `Login`.
public struct LoginResult: Sendable, Equatable {
    /// The session, new or the one already there.
    public var session: Session
    /// False when the account was already logged in and kept its session.
    public var created: Bool
    /// True when a login with `replace` replaced the tokens of a logged-in session.
    public var replaced: Bool = false
}

/// An access token from `GetToken`. The token is a `Secret`: printing it shows it masked.
public struct Token: Sendable, Equatable {
    public var value: Secret
    public var tokenType: String?
    public var expiresAt: UnixTime?
    /// Salesforce's instance URL: where API calls with this token go.
    public var instanceURL: String?
    /// Whose session the token came from.
    public var ownerUID: UInt32
    /// The OAuth 2.0 scope granted, when the provider said (nil from a vaultd that does not tell).
    public var scope: String? = nil
}

/// One page of `ListSessions`.
public struct SessionListPage: Sendable, Equatable {
    public var sessions: [Session]
    /// The cursor of the next page (pass it back as `after`); nil on the last.
    public var next: String?
    /// The store's state as vaultd sees it (`available`, `unavailable`,
    /// `locked`); nil from a vaultd that does not say.
    public var store: String?
}

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

/// A `Subscribe` stream: the snapshot of the sessions, then one `VaultEvent`
/// per `next()` until the stream ends. It ends when vaultd closes the
/// connection or ends the stream with an error (`SubscriberTooSlow` when this
/// reader fell behind); `end` says which. Reads are bounded by the
/// connection's receive timeout, if it has one. A stream subscribed with a
/// `ReconnectPolicy` connects again instead of ending (see
/// `VaultConnection.subscribe(provider:user:kinds:reconnect:)`).
public final class VaultEventStream {
    /// Why a stream ended.
    public enum End: Sendable, Equatable, CustomStringConvertible {
        /// vaultd closed the connection (it stopped, or dropped the subscriber).
        case closed
        /// vaultd ended the stream with this error: `SubscriberTooSlow`, or
        /// vaultd stopping.
        case error(VarlinkErrorReply)
        /// vaultd sent a last reply that does not continue the stream.
        case finished

        /// Why, as a sentence: an error's message and code.
        public var description: String {
            switch self {
            case .closed: return "vaultd closed the connection"
            case .error(let reply): return reply.description
            case .finished: return "vaultd ended the stream"
            }
        }
    }

    /// How this stream connects again, when it does.
    struct Reconnection {
        var schedule: ReconnectSchedule
        let connect: () throws(VaultClientError) -> VarlinkClient

        init(policy: ReconnectPolicy, connect: @escaping () throws(VaultClientError) -> VarlinkClient) {
            schedule = ReconnectSchedule(policy: policy)
            self.connect = connect
        }
    }

    /// The connection the stream holds (a new one after each reconnection).
    public private(set) var raw: VarlinkClient
    /// The sessions the caller could see when the stream started, or when it
    /// last subscribed again after a reconnection.
    public private(set) var snapshot: [Session]
    /// Why the stream ended; nil while it goes on.
    public private(set) var end: End?
    /// How many times the stream connected and subscribed again.
    public private(set) var reconnections = 0
    /// Called as the connection is lost, with why, before the stream
    /// connects again (reconnecting streams only).
    public var onDisconnect: ((_ why: String) -> Void)?
    /// Called after the stream subscribed again, with the new snapshot,
    /// before the events that follow it (reconnecting streams only).
    public var onReconnect: ((_ snapshot: [Session]) -> Void)?
    var reconnection: Reconnection?
    private let filters: [String: JSON]
    /// The receive timeout set through `setReceiveTimeout`, for connections made later.
    private var receiveTimeoutSeconds: Int?

    /// Sends `Subscribe` on `client` and reads the snapshot; a refusal
    /// (`TooManySubscriptions`, a bad filter) throws.
    public init(_ client: VarlinkClient, provider: String? = nil, user: String? = nil, kinds: [EventKind] = [])
        throws(VaultClientError)
    {
        raw = client
        var parameters: [String: JSON] = [:]
        parameters["provider"] = provider.map(JSON.string)
        parameters["user"] = user.map(JSON.string)
        if !kinds.isEmpty { parameters["kinds"] = .array(kinds.map { .string($0.rawValue) }) }
        filters = parameters
        let (sessions, continues) = try Self.subscribe(client, parameters)
        snapshot = sessions
        if !continues { end = .finished }
    }

    /// Sends `Subscribe` and reads the first reply: the snapshot, and whether events follow.
    private static func subscribe(_ client: VarlinkClient, _ parameters: [String: JSON]) throws(VaultClientError)
        -> (sessions: [Session], continues: Bool)
    {
        let reply: VarlinkReply
        do { reply = try client.call(VaultMethod.subscribe.rawValue, parameters, more: true) } catch {
            throw .client(error)
        }
        if let error = VarlinkErrorReply(reply) { throw .reply(error) }
        guard let list = reply.parameters["sessions"]?.arrayValue else {
            throw .unexpectedReply(method: VaultMethod.subscribe.rawValue, detail: "a first reply without sessions")
        }
        var sessions: [Session] = []
        for json in list { sessions.append(try VaultConnection.session(json, of: .subscribe)) }
        return (sessions, reply.continues)
    }

    /// Changes how long a read waits (0: without limit), on this connection
    /// and on those a reconnection makes.
    public func setReceiveTimeout(seconds: Int) {
        receiveTimeoutSeconds = seconds
        raw.setReceiveTimeout(seconds: seconds)
    }

    /// The next event, waiting for it; nil once the stream has ended (see
    /// `end`). Events of kinds this client does not know are skipped. A
    /// reconnecting stream waits through a restart of vaultd here, and throws
    /// only when subscribing again fails in a way another attempt would not
    /// mend, or when a read times out.
    public func next() throws(VaultClientError) -> VaultEvent? {
        // Bounded by the connection: each turn reads one reply, or reconnects
        // (bounded by the policy's attempts, or by the reader's patience).
        while true {
            while end == nil {
                let reply: VarlinkReply?
                do { reply = try raw.nextReply() } catch {
                    if case .timedOut = error { throw .client(error) }
                    guard reconnection != nil else { throw .client(error) }
                    end = .closed
                    if try reconnect(why: error.description) { continue }
                    return nil
                }
                guard let reply else {
                    end = .closed
                    break
                }
                if let error = VarlinkErrorReply(reply) {
                    end = .error(error)
                    break
                }
                if !reply.continues { end = .finished }
                guard let json = reply.parameters["event"], json != .null else { continue }
                if let event = try VaultEventStream.event(json) { return event }
            }
            guard reconnection != nil, let why = end, why != .finished else { return nil }
            guard try reconnect(why: why.description) else { return nil }
        }
    }

    /// Connects and subscribes again on the policy's schedule, until it
    /// works (true), fails for good (throws), or the policy gives up (false);
    /// after either of the last two the stream stays ended (`end`).
    private func reconnect(why: String) throws(VaultClientError) -> Bool {
        guard var reconnection else { return false }
        // Given up unless it worked; put back below when it did.
        self.reconnection = nil
        onDisconnect?(why)
        shutdown(raw.fileDescriptor, Int32(SHUT_RDWR))
        reconnection.schedule.lost(now: ReconnectSchedule.now())
        // Bounded by the policy's maxAttempts, or kept up for as long as the reader waits.
        while reconnection.schedule.nextAttemptAt != nil {
            let wait = reconnection.schedule.waitMilliseconds(now: ReconnectSchedule.now())
            if wait > 0 { _ = poll(nil, 0, wait) }
            guard reconnection.schedule.isDue(now: ReconnectSchedule.now()) else { continue }
            do {
                let client = try reconnection.connect()
                // The subscription itself is bounded by the connection's timeout, as the first was.
                let (sessions, continues) = try Self.subscribe(client, filters)
                if let receiveTimeoutSeconds { client.setReceiveTimeout(seconds: receiveTimeoutSeconds) }
                raw = client
                snapshot = sessions
                end = continues ? nil : .finished
                reconnections += 1
                reconnection.schedule.connected()
                self.reconnection = reconnection
                onReconnect?(sessions)
                return true
            } catch {
                guard ReconnectPolicy.isWorthRetrying(error) else {
                    if case .reply(let reply) = error { end = .error(reply) }
                    throw error
                }
                reconnection.schedule.failed(now: ReconnectSchedule.now())
            }
        }
        return false
    }

    /// Reads an event object; nil for a kind this client does not know.
    static func event(_ json: JSON) throws(VaultClientError) -> VaultEvent? {
        guard let o = json.objectValue else {
            throw .unexpectedReply(method: VaultMethod.subscribe.rawValue, detail: "an event that is not an object")
        }
        let p = ParameterReader(o)
        do throws(ParameterReader.Invalid) {
            guard let kind = EventKind(rawValue: try p.string("kind")) else { return nil }
            guard let owner = try p.optionalUID("ownerUid"), let time = try p.optionalInt("time") else {
                throw ParameterReader.Invalid(parameter: "ownerUid or time")
            }
            return VaultEvent(
                kind: kind, account: Account(provider: try p.string("provider"), user: try p.string("user")),
                ownerUID: owner, time: UnixTime(seconds: time), reason: try p.optionalString("reason"),
                code: try p.optionalString("code"),
                expiresAt: try p.optionalInt("expiresAt").map(UnixTime.init(seconds:)),
                message: try p.optionalString("message"),
                source: try p.optionalString("source").flatMap(ConnectionSource.init(rawValue:)),
                client: try p.optionalString("client"), providerCode: try p.optionalString("providerCode"),
                providerMessage: try p.optionalString("providerMessage"))
        } catch {
            throw .unexpectedReply(
                method: VaultMethod.subscribe.rawValue, detail: "an event with a bad '\(error.parameter)'")
        }
    }
}
