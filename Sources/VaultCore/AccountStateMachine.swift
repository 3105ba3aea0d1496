/// The lifecycle of one account, as a value: events go in, actions come out,
/// and the owner of the state (the session manager) performs them. Keeping it
/// pure lets every interleaving of logins and logouts be tested without I/O.
/// Who may ask is not its business: `AccessPolicy` decides that before.
public struct AccountStateMachine: Sendable {
    /// Where the account is.
    public enum State: Sendable, Equatable {
        case loggedOut
        case loggingIn
        case loggedIn(SessionRecord)
        case loggingOut(SessionRecord)
        /// A replacing credential is being written; the record is the one it
        /// replaces, which stays served until the new one is in the store.
        case replacing(SessionRecord)

        /// The state as clients see it (OpenIM's three states).
        public var loginState: LoginState {
            switch self {
            case .loggedOut: return .logout
            case .loggingIn: return .logging
            case .loggedIn, .loggingOut, .replacing: return .logged
            }
        }
    }

    /// What to do about a login request.
    public enum LoginAction: Sendable, Equatable {
        /// Already logged in: answer with the existing session (CometChat).
        case returnExisting(SessionRecord)
        /// A login is in flight: wait for it and answer with its result (OpenIM).
        case joinInFlight
        /// A logout is in flight: wait for it to finish, then ask again.
        case waitThenRetry
        /// Write the new session to the store, then call `loginSucceeded` or `loginFailed`.
        case startLogin
        /// Replace the tokens of this logged-in session (`Login` with
        /// `replace`): write the new record, then call `replaceFinished`.
        case startReplace(SessionRecord)
        /// A login that asks the provider failed lately: refuse until
        /// `backoff.nextRetryAt`, naming it (the state does not change).
        case backingOff(LoginBackoff)
    }

    /// What to do about a logout request.
    public enum LogoutAction: Sendable, Equatable {
        /// Mark the stored record logging-out, finish, delete; then call `logoutFinished`.
        case startLogout(SessionRecord)
        /// A logout is in flight: wait for it and answer with its result.
        case joinInFlight
        /// A login is in flight: wait for it to finish, then ask again.
        case waitThenRetry
        /// Refuse.
        case fail(VaultError)
    }

    /// The account this machine tracks.
    public let account: Account
    /// The current state.
    public private(set) var state: State
    /// `AutoLogin=yes`: vaultd logs the account in on its own.
    public var autoLogin = false
    /// `ReloginAfterKick=yes`: and again after a kick.
    public var reloginAfterKick = false
    /// Failed logins and when the next may start.
    public private(set) var backoff = LoginBackoff()
    /// When vaultd logs the account in next on its own, if it plans to.
    public private(set) var autoLoginAt: UnixTime?

    /// A machine for `account` in `state` (restored records start `loggedIn`).
    public init(account: Account, state: State = .loggedOut) {
        self.account = account
        self.state = state
    }

    /// A login was asked for. `asksProvider`: it has the provider issue the
    /// tokens (client credentials, an exec helper); such a login is refused
    /// while the account backs off after a failed one (`now` before
    /// `backoff.nextRetryAt`), whoever asks.
    public mutating func loginRequested(asksProvider: Bool = false, now: UnixTime? = nil) -> LoginAction {
        switch state {
        case .loggedOut:
            if asksProvider, let now, backoff.isBackingOff(at: now) { return .backingOff(backoff) }
            state = .loggingIn
            return .startLogin
        case .loggingIn:
            return .joinInFlight
        case .loggingOut:
            return .waitThenRetry
        case .loggedIn(let record):
            return .returnExisting(record)
        case .replacing:
            // Answered with the session as the replace leaves it.
            return .waitThenRetry
        }
    }

    /// A login that replaces the credential of a logged-in session was asked
    /// for (`Login` with `replace`). A logged-out account is logged in as by
    /// `loginRequested`; a login, logout or replace in flight is waited for
    /// first (a login in flight is not joined: its credential is not this one).
    public mutating func replaceRequested() -> LoginAction {
        switch state {
        case .loggedOut:
            state = .loggingIn
            return .startLogin
        case .loggingIn, .loggingOut, .replacing:
            return .waitThenRetry
        case .loggedIn(let record):
            state = .replacing(record)
            return .startReplace(record)
        }
    }

    /// The replace ended: `record` is the new session, safely in the store;
    /// nil when it failed, and the replaced session goes on.
    public mutating func replaceFinished(_ record: SessionRecord?) {
        guard case .replacing(let old) = state else {
            preconditionFailure("replaceFinished in state \(state)")
        }
        state = .loggedIn(record ?? old)
    }

    /// The login's record is safely in the store. The backoff of failed
    /// logins is over, and so is any automatic login still planned.
    public mutating func loginSucceeded(_ record: SessionRecord) {
        precondition(state == .loggingIn, "loginSucceeded in state \(state)")
        state = .loggedIn(record)
        backoff = LoginBackoff()
        autoLoginAt = nil
    }

    /// The login failed; the account is logged out.
    public mutating func loginFailed() {
        precondition(state == .loggingIn, "loginFailed in state \(state)")
        state = .loggedOut
    }

    /// A logout was asked for.
    public mutating func logoutRequested() -> LogoutAction {
        switch state {
        case .loggedOut:
            return .fail(.notLoggedIn(account))
        case .loggingIn, .replacing:
            return .waitThenRetry
        case .loggingOut:
            return .joinInFlight
        case .loggedIn(let record):
            state = .loggingOut(record)
            return .startLogout(record)
        }
    }

    /// A refresh replaced the tokens of the logged-in session. Ignored in any
    /// other state (the session ended while the refresh was in flight).
    public mutating func refreshed(_ record: SessionRecord) {
        if case .loggedIn = state { state = .loggedIn(record) }
    }

    /// The logout finished (the record is gone from the store), or failed
    /// before the record was touched (`succeeded: false` keeps the session).
    public mutating func logoutFinished(succeeded: Bool) {
        guard case .loggingOut(let record) = state else {
            preconditionFailure("logoutFinished in state \(state)")
        }
        state = succeeded ? .loggedOut : .loggedIn(record)
    }
}

/// The failed logins of one account that asked the provider (or were
/// vaultd's own), and when the next may be made: every caller waits out the
/// same backoff, so a failing provider is not asked by each in turn.
public struct LoginBackoff: Sendable, Equatable {
    /// Failed logins since the last success.
    public var consecutiveFailures = 0
    /// No login that asks the provider starts before this.
    public var nextRetryAt: UnixTime?
    /// vaultd's code of the last failure.
    public var lastErrorCode: String?
    /// What the last failure said; never a secret.
    public var lastError: String?
    /// The provider's own code of the last failure, when it named one.
    public var lastProviderCode: String? { lastProvider?.code }
    /// What the provider said of the last failure, masked.
    public var lastProviderMessage: String? { lastProvider?.message }
    /// Both, out of line (every account's entry holds a backoff).
    private var lastProvider: ProviderWords?

    /// No failure.
    public init() {}

    /// Keeps what the provider said of `failure`.
    mutating func setProviderWords(_ failure: VaultError) {
        lastProvider = ProviderWords(code: failure.providerCode, message: failure.providerMessage)
    }

    /// True while `now` is before `nextRetryAt`.
    public func isBackingOff(at now: UnixTime) -> Bool { nextRetryAt.map { now < $0 } ?? false }

    /// The fields as clients see them for an account that is not logged in
    /// (the `Session` type's `consecutiveFailures`, `nextRetryAt`,
    /// `lastError`, `lastErrorCode`).
    public var status: RefreshStatus {
        var status = RefreshStatus()
        status.consecutiveFailures = consecutiveFailures
        status.nextRetryAt = nextRetryAt
        status.lastError = lastError
        status.lastErrorCode = lastErrorCode
        status.setProviderWords(code: lastProviderCode, message: lastProviderMessage)
        return status
    }
}

/// Accounts vaultd keeps logged in (`[Account PROVIDER USER] AutoLogin=yes`):
/// when to log in on its own, and the backoff after failed logins. Time and
/// randomness come in as arguments (`now`, `random`), so every schedule is
/// tested without a clock.
extension AccountStateMachine {
    /// What the owner must do about the account's automatic login.
    public enum AutoLoginAction: Sendable, Equatable {
        /// Log the account in now, as vaultd.
        case login
        /// Arm the account's login deadline (`SessionTimers.Timer.login`) at `at`.
        case schedule(at: UnixTime)
        /// Drop the account's entry: an account vaultd does not log in whose
        /// last failure is `forgetFailuresAfter` past its backoff.
        case forget
    }

    /// How long after its backoff ended the failures of an account that is
    /// not automatic are kept (and shown): a client retrying within it keeps
    /// the backoff growing; after it, the account is forgotten.
    public static let forgetFailuresAfter: Int64 = 300

    /// vaultd starts, or a reload declared the account `AutoLogin=yes`: log it
    /// in now, or when its backoff ends.
    public mutating func autoLoginStarted(now: UnixTime) -> [AutoLoginAction] {
        guard autoLogin, state == .loggedOut else { return [] }
        return planAutoLogin(now: now)
    }

    /// The account's login deadline passed.
    public mutating func autoLoginDue(now: UnixTime) -> [AutoLoginAction] {
        if !autoLogin, state == .loggedOut, let retryAt = backoff.nextRetryAt {
            let forgetAt = retryAt.adding(seconds: Self.forgetFailuresAfter)
            return now < forgetAt ? [.schedule(at: forgetAt)] : [.forget]
        }
        guard autoLogin, state == .loggedOut, let at = autoLoginAt else { return [] }
        return at <= now ? [.login] : [.schedule(at: at)]
    }

    /// A login failed in a way that counts: it asked the provider, or it was
    /// vaultd's own (every failure of an `AutoLogin=yes` account counts). The
    /// account backs off: full jitter from 1 s up to 5 min (`random` in
    /// 0..<1 picks the wait), at least the server's `Retry-After`. An
    /// automatic account is logged in again when the wait is over.
    public mutating func loginFailed(
        _ failure: VaultError, retryAfter: Int64?, random: Double, now: UnixTime
    ) -> [AutoLoginAction] {
        loginFailed()
        backoff.consecutiveFailures += 1
        backoff.lastErrorCode = failure.code.seedCode
        backoff.lastError = failure.message
        backoff.setProviderWords(failure)
        let wait = RefreshPolicy.backoff(
            attempt: backoff.consecutiveFailures, random: random, retryAfter: retryAfter)
        let at = now.adding(seconds: wait)
        backoff.nextRetryAt = at
        guard autoLogin else { return [.schedule(at: at.adding(seconds: Self.forgetFailuresAfter))] }
        autoLoginAt = at
        return [.schedule(at: at)]
    }

    /// The session ended (its logout is in the store) with `kind`. An
    /// `AutoLogin=yes` account is logged in again after `tokenExpired` and
    /// `tokenInvalid`, and after `kickedOffline` only with
    /// `ReloginAfterKick=yes`; never after a logout a client asked for.
    public mutating func sessionEnded(_ kind: EventKind, now: UnixTime) -> [AutoLoginAction] {
        guard autoLogin, state == .loggedOut else { return [] }
        let again = kind == .tokenExpired || kind == .tokenInvalid || (kind == .kickedOffline && reloginAfterKick)
        guard again else {
            autoLoginAt = nil
            return []
        }
        return planAutoLogin(now: now)
    }

    /// The provider's credential or configuration changed (a new client
    /// secret, a reload): the failures it caused say nothing about the next
    /// try, so the backoff ends, and an automatic account is logged in now;
    /// another logged-out account's failures are forgotten.
    public mutating func credentialsChanged(now: UnixTime) -> [AutoLoginAction] {
        if !autoLogin, state == .loggedOut, backoff != LoginBackoff() {
            backoff = LoginBackoff()
            return [.forget]
        }
        backoff.nextRetryAt = nil
        guard autoLogin, state == .loggedOut, autoLoginAt != nil else { return [] }
        return planAutoLogin(now: now)
    }

    /// The account stops being kept logged in (a reload took `AutoLogin=yes` away).
    public mutating func autoLoginStopped() {
        autoLogin = false
        reloginAfterKick = false
        autoLoginAt = nil
    }

    /// True when vaultd will log the account in on its own by `deadline`: a
    /// login is in flight, or one is planned by then. A token reader of an
    /// automatic account waits for it instead of failing at once.
    public func expectsLogin(by deadline: UnixTime) -> Bool {
        switch state {
        case .loggingIn: return true
        case .loggedOut: return autoLogin && autoLoginAt.map { $0 <= deadline } == true
        case .loggedIn, .loggingOut, .replacing: return false
        }
    }

    private mutating func planAutoLogin(now: UnixTime) -> [AutoLoginAction] {
        let at = max(now, backoff.nextRetryAt ?? now)
        autoLoginAt = at
        return at <= now ? [.login] : [.schedule(at: at)]
    }
}
