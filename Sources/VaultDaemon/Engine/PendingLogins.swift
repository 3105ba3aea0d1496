import Varlink
import VaultCore

/// The interactive logins of one kind (the device flow's, the browser
/// login's) begun and waiting for their user, by id: held in the manager's
/// memory only (a restart loses them), each only its starter's uid's (or
/// root's) to continue, at most `perUser` per uid (root excepted), dropped
/// when they end and at their expiry. `Flow` is what the kind keeps of its
/// own, its secrets among it: they never leave vaultd but for the provider.
struct PendingLogins<Flow: Sendable>: Sendable {
    /// One login waiting for its user.
    struct Login: Sendable {
        /// The login as the caller asked for it (no token: that comes later).
        var request: LoginRequest
        /// Who began it.
        var caller: Caller
        var expiresAt: UnixTime
        var flow: Flow
    }

    /// Pending logins of one kind one uid (but root) may hold.
    static var perUser: Int { 4 }

    /// The kind, as messages name it: "device", "browser".
    let kind: String
    private(set) var logins: [String: Login] = [:]

    /// An empty table of logins of `kind`.
    init(kind: String) { self.kind = kind }

    /// The error of an id that is unknown, expired, finished or another
    /// uid's: the same for each, so that no caller learns another's logins.
    func unknown() -> VaultError {
        VaultError(
            .loginExpired,
            "no \(kind) login of this id is pending for you: it was finished, it expired, or vaultd restarted; start the login again"
        )
    }

    /// Keeps a login under a new random id (128 bits, base64url), once the
    /// expired ones are gone; refused when the caller's uid holds `perUser`.
    mutating func add(_ request: LoginRequest, _ flow: Flow, caller: Caller, expiresAt: UnixTime, now: UnixTime)
        throws(VaultError) -> String
    {
        try checkRoom(for: caller, now: now)
        var id = JWS.newID()
        // 128 random bits do not collide; the loop only makes it certain.
        for _ in 0..<4 where logins[id] != nil { id = JWS.newID() }
        logins[id] = Login(request: request, caller: caller, expiresAt: expiresAt, flow: flow)
        return id
    }

    /// Throws when the caller's uid (but root) holds `perUser` logins
    /// already, once the expired ones are gone: asked before anything is
    /// sent to the provider, and again by `add`.
    mutating func checkRoom(for caller: Caller, now: UnixTime) throws(VaultError) {
        dropExpired(now: now)
        let uid = caller.uid
        if uid != 0, logins.values.count(where: { $0.caller.uid == uid }) >= Self.perUser {
            throw VaultError(
                .invalidParameter,
                "uid \(uid) has \(Self.perUser) \(kind) logins pending already, the most one user may; finish one, or let one expire, first"
            )
        }
    }

    /// The login `id`, when it lives and `uid` may continue it (the uid that
    /// began it, or root); `unknown()` otherwise.
    mutating func login(_ id: String, uid: UInt32, now: UnixTime) throws(VaultError) -> Login {
        dropExpired(now: now)
        guard let login = logins[id], uid == 0 || login.caller.uid == uid else { throw unknown() }
        return login
    }

    /// The login `id` taken out, as `login` finds it.
    mutating func take(_ id: String, uid: UInt32, now: UnixTime) throws(VaultError) -> Login {
        let login = try login(id, uid: uid, now: now)
        logins[id] = nil
        return login
    }

    /// Stores `flow` as login `id`'s, when it is still pending.
    mutating func update(_ id: String, _ flow: Flow) { logins[id]?.flow = flow }

    /// Removes the login `id`.
    mutating func remove(_ id: String) { logins[id] = nil }

    /// Removes every login past its expiry.
    mutating func dropExpired(now: UnixTime) { logins = logins.filter { $0.value.expiresAt > now } }

    /// The nearest expiry of a login held; nil when none is.
    var nextExpiry: UnixTime? { logins.values.lazy.map(\.expiresAt).min() }
}

extension SessionManager {
    /// Has the manager's one timer drop the pending logins past their expiry
    /// once `expiresAt` comes, even when nobody continues them (their secrets
    /// go with them): `runDueWork` drops them (`dropExpiredLogins`).
    func dropPendingLogins(at expiresAt: UnixTime) {
        if let next = pendingLoginsExpire, next <= expiresAt { return }
        pendingLoginsExpire = expiresAt
        rearmTimer()
    }

    /// Removes the device and browser logins past their expiry; the timer
    /// then waits for the nearest expiry of those left.
    func dropExpiredLogins() {
        let now = clock.now()
        deviceLogins.dropExpired(now: now)
        browserLogins.dropExpired(now: now)
        pendingLoginsExpire = [deviceLogins.nextExpiry, browserLogins.nextExpiry].compactMap { $0 }.min()
    }
}

extension SessionManager {
    /// Logs in with the token response an interactive login (device,
    /// browser) obtained for `caller`, as `Login` with it does. Tokens that
    /// do not become the session (the account was logged in already and
    /// kept its session, or the login was refused) are revoked: nobody else
    /// holds them, and they would stay valid at the provider.
    func finishInteractiveLogin(_ request: LoginRequest, caller: Caller) async throws(VaultError) -> (
        SessionRecord, LoginOutcome
    ) {
        do throws(VaultError) {
            let (record, outcome) = try await loginOrReplace(request, caller: caller)
            if outcome == .existing { await revokeUnused(request, caller: caller) }
            return (record, outcome)
        } catch {
            await revokeUnused(request, caller: caller)
            throw error
        }
    }

    /// Queues in the store, then starts, the revocation of the tokens
    /// `request`'s token response holds, when its provider revokes tokens.
    private func revokeUnused(_ request: LoginRequest, caller: Caller) async {
        let account = Account(provider: request.provider, user: request.user)
        guard let response = request.tokenResponse, let provider = client(for: account.provider),
            let credential = try? LoginCredential(tokenResponse: response)
        else { return }
        let owner = (try? policy.policy.owner(of: account, for: caller, requested: request.ownerUID)) ?? caller.uid
        let record = SessionRecord(
            account: account, user: UserProfile(uid: account.user), tokens: credential.tokens, createdAt: clock.now(),
            expiresAt: nil, ownerUID: owner)
        guard provider.revokes(record) else { return }
        log.info(
            "an interactive login's tokens did not become the session; they are revoked",
            fields(record.key, event: "revokeUnused"))
        await queueRevocation(
            PendingRevocation(queueing: record), provider: provider, by: .peer(caller), event: "revokeUnused")
    }
}
