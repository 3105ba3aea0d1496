import Synchronization
import Varlink
import VarlinkServer
import VaultCore
import VaultProtocol

/// A browser login begun and not finished: what vaultd keeps of it between
/// `BeginBrowserLogin` and `FinishBrowserLogin`. The verifier and the state
/// never leave vaultd but in the authorization URL's challenge and state.
struct PendingBrowserLogin: Sendable {
    /// The login's id, 128 random bits in base64url, as the client names it.
    var id: String
    var account: Account
    /// Whose session, when the caller named one (`ownerUid`).
    var ownerUID: UInt32?
    /// The uid that began it: only it, or root, may finish it.
    var uid: UInt32
    var replace: Bool
    var expiresAt: UnixTime
    /// The PKCE code verifier (RFC 7636 section 4.1).
    var verifier: Secret
    var state: String
    var redirectURI: String
}

/// The browser logins pending, in memory only (a restart loses them): at
/// most `perUID` per uid but root's, each dropped when it expires or is
/// finished, whether its exchange works or not.
final class BrowserLogins: Sendable {
    /// How long a browser login may wait for its redirect.
    static let lifetimeSeconds: Int64 = 600
    /// The most browser logins one uid (but root) may have pending.
    static let perUID = 4

    private let pending = Mutex<[String: PendingBrowserLogin]>([:])

    /// Keeps `login`, or throws when its uid has `perUID` pending already.
    func add(_ login: PendingBrowserLogin, now: UnixTime) throws(VaultError) {
        let refused = pending.withLock { table -> Bool in
            table = table.filter { $0.value.expiresAt > now }
            let mine = table.values.filter { $0.uid == login.uid }.count
            guard login.uid == 0 || mine < Self.perUID else { return true }
            table[login.id] = login
            return false
        }
        if refused {
            throw VaultError(
                .invalidParameter,
                "uid \(login.uid) has \(Self.perUID) browser logins pending, the most one user may; finish one, or wait until one expires (\(Self.lifetimeSeconds / 60) minutes after it began)"
            )
        }
    }

    /// Takes the pending login `id` out, when it lives and `uid` may finish
    /// it (the uid that began it, or root); nil otherwise, alike for an
    /// unknown, expired, finished or another user's login.
    func take(_ id: String, uid: UInt32, now: UnixTime) -> PendingBrowserLogin? {
        pending.withLock { table -> PendingBrowserLogin? in
            table = table.filter { $0.value.expiresAt > now }
            guard let login = table[id], uid == 0 || login.uid == uid else { return nil }
            table[id] = nil
            return login
        }
    }

    /// The error of a login `take` did not find.
    static func unknown() -> VaultError {
        VaultError(
            .invalidParameter,
            "no such browser login pending: it expired (\(lifetimeSeconds / 60) minutes after it began), was finished already, was begun by another user or before vaultd restarted; log in again"
        )
    }
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

    /// Finishes `pending`: exchanges `code` at the token endpoint (one
    /// provider request of the caller's) and logs the account in with the
    /// token response, as `Login` does.
    func finishBrowserLogin(_ pending: PendingBrowserLogin, code: Secret, caller: Caller) async throws(VaultError)
        -> (SessionRecord, LoginOutcome)
    {
        let (client, key) = try browserLoginClient(pending.account, requested: pending.ownerUID, caller: caller)
        try chargeProviderRequest(
            chargedUID(.peer(caller), owner: key.owner), "the code exchange of \(pending.account)'s browser login")
        switch await client.exchangeCode(code, verifier: pending.verifier, redirectURI: pending.redirectURI) {
        case .failed(let error):
            Audit.log(log, "Login", key, by: .peer(caller), result: error.code.seedCode)
            throw error
        case .tokens(let response):
            let request = LoginRequest(
                provider: pending.account.provider, user: pending.account.user, tokenResponse: response,
                ownerUID: pending.ownerUID, replace: pending.replace)
            return try await loginOrReplace(request, caller: caller)
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
            let (client, _) = try await manager.browserLoginClient(checked, requested: requested, caller: caller)
            let verifier = Secret(BrowserFlow.randomText(bytes: 32))
            let login = PendingBrowserLogin(
                id: BrowserFlow.randomText(bytes: 16), account: checked, ownerUID: requested, uid: caller.uid,
                replace: replace, expiresAt: UnixTime(seconds: clock.now().seconds + BrowserLogins.lifetimeSeconds),
                verifier: verifier, state: BrowserFlow.randomText(bytes: 16), redirectURI: redirectURI)
            try browserLogins.add(login, now: clock.now())
            let url = BrowserFlow.authorizationURL(
                client.settings, redirectURI: redirectURI, state: login.state,
                challenge: BrowserFlow.challenge(of: verifier))
            return VarlinkReply(parameters: [
                "login": .string(login.id), "authorizationUrl": .string(url), "state": .string(login.state),
                "expiresAt": .int(login.expiresAt.seconds),
            ])
        }
    }

    /// `FinishBrowserLogin`: the code exchanged, the account logged in; Login's reply.
    func finishBrowserLogin(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
        let (id, code, state) = (try p.string("login"), Secret(try p.string("code")), try p.string("state"))
        return VaultMethods.answered { () async throws(VaultError) -> VarlinkReply in
            guard let pending = browserLogins.take(id, uid: caller.uid, now: clock.now()) else {
                throw BrowserLogins.unknown()
            }
            guard SHA256.constantTimeEqual(Array(state.utf8), Array(pending.state.utf8)) else {
                throw VaultError(
                    .authorizationFailed,
                    "the redirect's state is not this browser login's (a redirect of another login, or a forged one); nothing was sent to the token endpoint; log in again"
                )
            }
            guard !code.isEmpty, code.utf8Count <= 4096 else {
                throw VaultError(.invalidParameter, "the authorization code must be 1 to 4096 bytes")
            }
            let (record, outcome) = try await manager.finishBrowserLogin(pending, code: code, caller: caller)
            var parameters: [String: JSON] = [
                "session": record.wireJSON(state: .logged), "created": .bool(outcome != .existing),
            ]
            if pending.replace { parameters["replaced"] = .bool(outcome == .replaced) }
            return VarlinkReply(parameters: parameters)
        }
    }
}
