import Varlink
import VarlinkServer
import VaultCore
import VaultProtocol

/// What a browser login keeps of its own between `BeginBrowserLogin` and
/// `FinishBrowserLogin` (`PendingLogins`). The verifier and the state never
/// leave vaultd but in the authorization URL's challenge and state.
struct BrowserLogin: Sendable {
    /// How long a browser login may wait for its redirect.
    static let lifetimeSeconds: Int64 = 600

    /// The PKCE code verifier (RFC 7636 section 4.1).
    var verifier: Secret
    var state: String
    var redirectURI: String
}

/// What `BeginBrowserLogin` answers.
struct BrowserLoginStart: Sendable {
    var id: String
    var authorizationURL: String
    var state: String
    var expiresAt: UnixTime
}

extension SessionManager {
    /// The OAuth 2.0 client of a browser login of `account` by `caller`, and
    /// the session's key: the provider must be oauth2 with
    /// `AuthorizationURL=`, and the caller one who may log the account in
    /// (as `loginOrReplace` checks again at the end).
    func browserLoginClient(_ account: Account, requested: UInt32?, caller: Caller) throws(VaultError) -> (
        OAuth2Client, SessionKey
    ) {
        guard let provider = config.providers[account.provider] else {
            throw .unknownProvider(account.provider, in: config)
        }
        guard provider.oauth2?.authorizationURL != nil, let client = client(for: account.provider) as? OAuth2Client
        else {
            throw VaultError(
                .invalidParameter,
                "provider '\(account.provider)' has no browser login: it needs Type=oauth2 and AuthorizationURL= in its [Provider] section"
            )
        }
        let access = policy.policy
        let key = SessionKey(owner: try access.owner(of: account, for: caller, requested: requested), account: account)
        guard access.mayManage(caller, key) else { throw AccessPolicy.notYours(key) }
        return (client, key)
    }

    /// Begins a browser login of `request` (no token) for `caller`: a new
    /// code verifier and state kept under a new id, and the authorization URL.
    func beginBrowserLogin(_ request: LoginRequest, redirectURI: String, caller: Caller) throws(VaultError)
        -> BrowserLoginStart
    {
        let account = Account(provider: request.provider, user: request.user)
        let (client, _) = try browserLoginClient(account, requested: request.ownerUID, caller: caller)
        let flow = BrowserLogin(
            verifier: Secret(BrowserFlow.randomText(bytes: 32)), state: BrowserFlow.randomText(bytes: 16),
            redirectURI: redirectURI)
        let now = clock.now()
        let expiresAt = now.adding(seconds: BrowserLogin.lifetimeSeconds)
        let id = try browserLogins.add(request, flow, caller: caller, expiresAt: expiresAt, now: now)
        dropPendingLogins(at: expiresAt)
        let url = BrowserFlow.authorizationURL(
            client.settings, redirectURI: redirectURI, state: flow.state,
            challenge: BrowserFlow.challenge(of: flow.verifier))
        return BrowserLoginStart(id: id, authorizationURL: url, state: flow.state, expiresAt: expiresAt)
    }

    /// Finishes the browser login `id` (taken out, whether the exchange
    /// works or not) once `state` is its own: exchanges `code` at the token
    /// endpoint (one provider request of the login's starter) and logs the
    /// account in with the token response, as `Login` does, as the starter.
    func finishBrowserLogin(_ id: String, code: Secret, state: String, caller: Caller) async throws(VaultError)
        -> (SessionRecord, LoginOutcome, replace: Bool)
    {
        let pending = try browserLogins.take(id, uid: caller.uid, now: clock.now())
        guard SHA256.constantTimeEqual(Array(state.utf8), Array(pending.flow.state.utf8)) else {
            throw VaultError(
                .authorizationFailed,
                "the redirect's state is not this browser login's (a redirect of another login, or a forged one); nothing was sent to the token endpoint; log in again"
            )
        }
        guard !code.isEmpty, code.utf8Count <= 4096 else {
            throw VaultError(.invalidParameter, "the authorization code must be 1 to 4096 bytes")
        }
        // The login is its starter's, as a device login is, whoever (the
        // starter or root) brings the code.
        let starter = pending.caller
        var request = pending.request
        let account = Account(provider: request.provider, user: request.user)
        let (client, key) = try browserLoginClient(account, requested: request.ownerUID, caller: starter)
        try chargeProviderRequest(
            chargedUID(.peer(starter), owner: key.owner), "the code exchange of \(account)'s browser login")
        switch await client.exchangeCode(code, verifier: pending.flow.verifier, redirectURI: pending.flow.redirectURI) {
        case .failed(let error):
            Audit.log(log, "Login", key, by: .peer(starter), result: error.code.seedCode)
            throw error
        case .tokens(let response):
            request.tokenResponse = response
            let (record, outcome) = try await finishInteractiveLogin(request, caller: starter)
            return (record, outcome, request.replace)
        }
    }
}

extension VaultMethods.Handlers {
    /// `BeginBrowserLogin`: a new pending login and its authorization URL.
    func beginBrowserLogin(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
        let (account, requested) = try VaultMethods.addressed(p)
        let redirectURI = try p.string("redirectUri")
        let replace = try p.optionalBool("replace") ?? false
        return VaultMethods.answered { () async throws(VaultError) -> VarlinkReply in
            let checked = try Account.validate(provider: account.provider, user: account.user)
            guard BrowserFlow.isLoopbackRedirect(redirectURI) else {
                throw VaultError(
                    .invalidParameter,
                    "redirectUri must be a loopback listener's, http://127.0.0.1:PORT/ (RFC 8252 7.3)")
            }
            let request = LoginRequest(
                provider: checked.provider, user: checked.user, ownerUID: requested, replace: replace)
            let start = try await manager.beginBrowserLogin(request, redirectURI: redirectURI, caller: caller)
            return VarlinkReply(parameters: [
                "login": .string(start.id), "authorizationUrl": .string(start.authorizationURL),
                "state": .string(start.state), "expiresAt": .int(start.expiresAt.seconds),
            ])
        }
    }

    /// `FinishBrowserLogin`: the code exchanged, the account logged in; Login's reply.
    func finishBrowserLogin(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
        let (id, code, state) = (try p.string("login"), Secret(try p.string("code")), try p.string("state"))
        return VaultMethods.answered { () async throws(VaultError) -> VarlinkReply in
            let (record, outcome, replace) = try await manager.finishBrowserLogin(
                id, code: code, state: state, caller: caller)
            var parameters: [String: JSON] = [
                "session": record.wireJSON(state: .logged), "created": .bool(outcome != .existing),
            ]
            if replace { parameters["replaced"] = .bool(outcome == .replaced) }
            return VarlinkReply(parameters: parameters)
        }
    }
}
