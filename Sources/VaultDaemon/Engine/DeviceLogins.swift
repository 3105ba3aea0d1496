import Varlink
import VaultCore
import VaultSystem

/// The device logins (RFC 8628) that wait for their user, by id: held in
/// memory only (a restart loses them), each only its starter's (or root's)
/// to poll, at most `perUser` per uid (root excepted), dropped when they end
/// and at their expiry. The device code never leaves this table but for the
/// token endpoint.
struct DeviceLogins: Sendable {
    /// One login waiting for its user.
    struct Pending: Sendable {
        /// The login as the caller asked for it (no token: those come later).
        var request: LoginRequest
        /// Who started it; the login is done as this caller.
        var caller: Caller
        var deviceCode: Secret
        /// Seconds between polls: the server's, 5 seconds longer for each slow_down.
        var interval: Int64
        /// When the next poll may be sent.
        var nextPollAt: ContinuousClock.Instant
        var expiresAt: ContinuousClock.Instant
        /// True while a PollDeviceLogin waits for or sends this login's poll.
        var polling = false
        /// Failures worth another poll in a row (5xx, network faults).
        var transientFailures = 0
    }

    /// Pending logins one uid (but root) may hold.
    static let perUser = 4
    /// Failures worth another poll that end the login when they come in a row.
    static let transientLimit = 3

    private(set) var pending: [String: Pending] = [:]

    /// The error of an id that is unknown, over or another user's: the same for each.
    static func unknown() -> VaultError {
        VaultError(
            .loginExpired,
            "no device login with this id is waiting for you: it finished, expired, or vaultd restarted; start the login again"
        )
    }

    /// Adds `login` under a new random id, once the expired ones are gone;
    /// refused when its uid holds `perUser` already.
    mutating func add(_ login: Pending, now: ContinuousClock.Instant) throws(VaultError) -> String {
        dropExpired(now: now)
        let uid = login.caller.uid
        if uid != 0, pending.values.filter({ $0.caller.uid == uid }).count >= Self.perUser {
            throw VaultError(
                .invalidParameter,
                "uid \(uid) has \(Self.perUser) device logins waiting already; finish or cancel one (or let it expire) first"
            )
        }
        var id = Self.newID()
        // 128 random bits do not collide; the loop only makes it certain.
        for _ in 0..<4 where pending[id] != nil { id = Self.newID() }
        pending[id] = login
        return id
    }

    /// The login `id` for a poll by `uid`, marked as polled; `unknown()`
    /// when there is none of `uid`'s (root may poll any) or it expired.
    mutating func claim(_ id: String, uid: UInt32, now: ContinuousClock.Instant) throws(VaultError) -> Pending {
        dropExpired(now: now)
        guard var login = pending[id], uid == 0 || login.caller.uid == uid else { throw Self.unknown() }
        guard !login.polling else {
            throw VaultError(.loginInProgress, "this device login is being polled by another call already")
        }
        login.polling = true
        pending[id] = login
        return login
    }

    /// Puts `login` back after a poll that left it waiting.
    mutating func release(_ id: String, _ login: Pending) {
        guard pending[id] != nil else { return }
        var login = login
        login.polling = false
        pending[id] = login
    }

    /// Removes the login `id`.
    mutating func remove(_ id: String) { pending[id] = nil }

    /// Removes every login past its expiry.
    mutating func dropExpired(now: ContinuousClock.Instant) {
        for (id, login) in pending where login.expiresAt <= now { pending[id] = nil }
    }

    /// A new id: 128 random bits (the system's CSPRNG), base64url.
    static func newID() -> String {
        var generator = SystemRandomNumberGenerator()
        return JWS.base64url((0..<16).map { _ in UInt8.random(in: 0...255, using: &generator) })
    }
}

/// What `StartDeviceLogin` answers: what to show the user, and the login's id.
struct DeviceLoginStart: Sendable {
    var id: String
    var userCode: String
    var verificationURI: String
    var verificationURIComplete: String?
    var expiresIn: Int64
    var interval: Int64
}

/// What one `PollDeviceLogin` came to, when the login is not over with an error.
enum DevicePollResult: Sendable {
    /// The user has not finished: call again; the poll interval is this many seconds now.
    case pending(interval: Int64)
    /// The login, done as `Login` with the token response does it.
    case done(SessionRecord, LoginOutcome)
}

extension SessionManager {
    /// The longest one PollDeviceLogin waits before it answers: a poll due
    /// later is answered `pending` without a request, and the client calls again.
    static let longestPollWait: Int64 = 25

    /// Starts a device login of `request` (no token) for `caller`: checks it
    /// as a login, asks the provider's device authorization endpoint, and
    /// keeps the device code.
    func startDeviceLogin(_ request: LoginRequest, caller: Caller) async throws(VaultError) -> DeviceLoginStart {
        var probe = request
        // A login that brings tokens: the device flow's are the user's, not minted.
        probe.tokenResponse = .object([:])
        let (account, provider, _) = try admitLogin(probe, caller: caller)
        guard provider.oauth2?.deviceAuthorizationURL != nil,
            let client = client(for: account.provider) as? OAuth2Client
        else {
            throw VaultError(
                .invalidParameter,
                "provider '\(account.provider)' has no device login: it needs Type=oauth2 and DeviceAuthorizationURL= in its [Provider] section"
            )
        }
        let authorization: DeviceAuthorization
        switch await client.authorizeDevice() {
        case .success(let made): authorization = made
        case .failure(let error):
            log.notice("device login refused", ["provider": account.provider, "code": error.code.seedCode])
            throw error
        }
        let now = ContinuousClock.now
        let expiresAt = now + .seconds(authorization.expiresIn)
        let id = try deviceLogins.add(
            DeviceLogins.Pending(
                request: request, caller: caller, deviceCode: authorization.deviceCode,
                interval: authorization.interval, nextPollAt: now + .seconds(authorization.interval),
                expiresAt: expiresAt),
            now: now)
        log.info("device login started", ["provider": account.provider, "user": account.user])
        // Dropped at expiry even when nobody polls it again.
        Task { [weak self] in
            try? await Task.sleep(until: expiresAt, clock: .continuous)
            await self?.dropExpiredDeviceLogins()
        }
        return DeviceLoginStart(
            id: id, userCode: authorization.userCode, verificationURI: authorization.verificationURI,
            verificationURIComplete: authorization.verificationURIComplete, expiresIn: authorization.expiresIn,
            interval: authorization.interval)
    }

    /// Removes the device logins past their expiry.
    func dropExpiredDeviceLogins() { deviceLogins.dropExpired(now: .now) }

    /// Waits until the device login `id`'s next poll is due (at most
    /// `longestPollWait`), then polls the token endpoint once: pending while
    /// the user has not finished, the login (as `Login` with the token
    /// response does it) once tokens came, the error when it is over.
    func pollDeviceLogin(_ id: String, caller: Caller) async throws(VaultError) -> DevicePollResult {
        var login = try deviceLogins.claim(id, uid: caller.uid, now: .now)
        let wakeAt = min(login.nextPollAt, ContinuousClock.now + .seconds(Self.longestPollWait))
        try? await Task.sleep(until: wakeAt, clock: .continuous)
        let now = ContinuousClock.now
        guard login.expiresAt > now else {
            deviceLogins.remove(id)
            throw VaultError(.loginExpired, "the device code expired before the user approved the login; start again")
        }
        guard login.nextPollAt <= now else {
            deviceLogins.release(id, login)
            return .pending(interval: login.interval)
        }
        guard let client = client(for: login.request.provider) as? OAuth2Client else {
            // The provider went with a reload.
            deviceLogins.remove(id)
            throw .unknownProvider(login.request.provider, in: config)
        }
        let answer = await client.pollDevice(login.deviceCode)
        switch answer {
        case .tokens(let response):
            deviceLogins.remove(id)
            var request = login.request
            request.tokenResponse = response
            let (record, outcome) = try await loginOrReplace(request, caller: login.caller)
            return .done(record, outcome)
        case .pending, .slowDown, .transient:
            if case .slowDown = answer { login.interval += 5 }
            if case .transient(let error) = answer {
                login.transientFailures += 1
                guard login.transientFailures < DeviceLogins.transientLimit else {
                    deviceLogins.remove(id)
                    throw error
                }
            } else {
                login.transientFailures = 0
            }
            login.nextPollAt = ContinuousClock.now + .seconds(login.interval)
            deviceLogins.release(id, login)
            return .pending(interval: login.interval)
        case .failed(let error):
            deviceLogins.remove(id)
            log.notice(
                "device login failed",
                ["provider": login.request.provider, "user": login.request.user, "code": error.code.seedCode])
            throw error
        }
    }
}
