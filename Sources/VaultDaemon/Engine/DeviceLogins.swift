import Varlink
import VaultCore
import VaultSystem

/// What a device login (RFC 8628) keeps of its own while it waits for its
/// user (`PendingLogins`): the device code never leaves it but for the
/// token endpoint.
struct DeviceLogin: Sendable {
    /// Failures worth another poll that end the login when they come in a row.
    static let transientLimit = 3

    var deviceCode: Secret
    /// Seconds between polls: the server's, 5 seconds longer for each slow_down.
    var interval: Int64
    /// When the next poll may be sent, as the manager's clock's `preciseNow()`.
    var nextPollAt: Double
    /// True while a PollDeviceLogin waits for or sends this login's poll.
    var polling = false
    /// Failures worth another poll in a row (5xx, network faults).
    var transientFailures = 0
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
        let (account, provider, key) = try admitLogin(probe, caller: caller)
        guard provider.oauth2?.deviceAuthorizationURL != nil,
            let client = client(for: account.provider) as? OAuth2Client
        else {
            throw VaultError(
                .invalidParameter,
                "provider '\(account.provider)' has no device login: it needs Type=oauth2 and DeviceAuthorizationURL= in its [Provider] section"
            )
        }
        // Nothing goes to the provider for a uid at its cap, and each start is
        // one of the caller's provider requests (ProviderRequestsPerMinute=).
        try deviceLogins.checkRoom(for: caller, now: clock.now())
        try chargeProviderRequest(chargedUID(.peer(caller), owner: key.owner), "the device login of \(account)")
        let authorization: DeviceAuthorization
        switch await client.authorizeDevice() {
        case .success(let made): authorization = made
        case .failure(let error):
            log.notice("device login refused", ["provider": account.provider, "code": error.code.seedCode])
            throw error
        }
        let now = clock.now()
        let expiresAt = now.adding(seconds: authorization.expiresIn)
        let flow = DeviceLogin(
            deviceCode: authorization.deviceCode, interval: authorization.interval,
            nextPollAt: clock.preciseNow() + Double(authorization.interval))
        let id = try deviceLogins.add(request, flow, caller: caller, expiresAt: expiresAt, now: now)
        log.info("device login started", ["provider": account.provider, "user": account.user])
        dropPendingLogins(at: expiresAt)
        return DeviceLoginStart(
            id: id, userCode: authorization.userCode, verificationURI: authorization.verificationURI,
            verificationURIComplete: authorization.verificationURIComplete, expiresIn: authorization.expiresIn,
            interval: authorization.interval)
    }

    /// Waits until the device login `id`'s next poll is due (at most
    /// `longestPollWait`), then polls the token endpoint once: pending while
    /// the user has not finished, the login (as `Login` with the token
    /// response does it) once tokens came, the error when it is over.
    func pollDeviceLogin(_ id: String, caller: Caller) async throws(VaultError) -> DevicePollResult {
        let pending = try deviceLogins.login(id, uid: caller.uid, now: clock.now())
        var login = pending.flow
        guard !login.polling else {
            throw VaultError(.loginInProgress, "this device login is being polled by another call already")
        }
        login.polling = true
        deviceLogins.update(id, login)
        login.polling = false
        await wait(.time, until: min(login.nextPollAt, clock.preciseNow() + Double(Self.longestPollWait)))
        guard pending.expiresAt > clock.now() else {
            deviceLogins.remove(id)
            throw VaultError(.loginExpired, "the device code expired before the user approved the login; start again")
        }
        guard login.nextPollAt <= clock.preciseNow() else {
            deviceLogins.update(id, login)
            return .pending(interval: login.interval)
        }
        guard let client = client(for: pending.request.provider) as? OAuth2Client else {
            // The provider went with a reload.
            deviceLogins.remove(id)
            throw .unknownProvider(pending.request.provider, in: config)
        }
        let answer = await client.pollDevice(login.deviceCode)
        switch answer {
        case .tokens(let response):
            deviceLogins.remove(id)
            var request = pending.request
            request.tokenResponse = response
            let (record, outcome) = try await finishInteractiveLogin(request, caller: pending.caller)
            return .done(record, outcome)
        case .pending, .slowDown, .transient:
            if case .slowDown = answer { login.interval += 5 }
            if case .transient(let error) = answer {
                login.transientFailures += 1
                guard login.transientFailures < DeviceLogin.transientLimit else {
                    deviceLogins.remove(id)
                    throw error
                }
            } else {
                login.transientFailures = 0
            }
            login.nextPollAt = clock.preciseNow() + Double(login.interval)
            deviceLogins.update(id, login)
            return .pending(interval: login.interval)
        case .failed(let error):
            deviceLogins.remove(id)
            log.notice(
                "device login failed",
                ["provider": pending.request.provider, "user": pending.request.user, "code": error.code.seedCode])
            throw error
        }
    }
}
