import Varlink
import VaultCore

/// A call waiting on the manager, woken by what it waits for or at its
/// deadline at the latest (a deadline of the manager's alarm). Listed from
/// when it begins to wait until its call runs on: a woken one is still
/// under way (the fleet simulation moves its clock only when none is).
struct Waiter {
    /// What a wait is for.
    enum Purpose: Equatable {
        /// A `GetToken` for the automatic login of its account, woken when
        /// that login ends one way or the other (and at shutdown).
        case login(SessionKey)
        /// A fleet host's refresh for another host's tokens, woken by a change
        /// of the session or when the other host's lock lease ends.
        case otherHost(SessionKey)
        /// A device login's poll for its next turn (and shutdown).
        case time
        /// Shutdown's grace, woken whenever background work ends.
        case grace
    }
    var purpose: Purpose
    /// Nil once woken.
    var continuation: CheckedContinuation<Void, Never>?
    /// When it stops waiting (clock seconds).
    var deadline: Double
}

/// Accounts vaultd keeps logged in (`[Account PROVIDER USER] AutoLogin=yes`)
/// and the backoff of failed logins. What to do and when is decided by each
/// account's `AccountStateMachine` (`autoLoginStarted`, `autoLoginDue`,
/// `loginFailed`, `sessionEnded`); this performs its actions: a login as
/// vaultd itself, or the account's `login` deadline in the one queue.
extension SessionManager {
    /// The session an automatic account is logged in as: its declared
    /// `Owner=`'s, or else the user vaultd runs as.
    func autoLoginKey(_ account: Account) -> SessionKey {
        let access = policy.policy
        return SessionKey(owner: access.declared[account]?.owner ?? access.vaultdUID, account: account)
    }

    /// Logs in, in the background, every `AutoLogin=yes` account that is not
    /// logged in (now, or when its backoff ends), and stops keeping in those
    /// a reload took it from. Called after `restore()` and after each reload.
    public func startAutoLogins() {
        let now = clock.now()
        var wanted: Set<SessionKey> = []
        for (account, settings) in config.accounts.sorted(by: { $0.key < $1.key }) where settings.autoLogin {
            let key = autoLoginKey(account)
            wanted.insert(key)
            var entry = entries[key] ?? makeEntry(account)
            entry.machine.autoLogin = true
            entry.machine.reloginAfterKick = settings.reloginAfterKick
            let actions = entry.machine.autoLoginStarted(now: now)
            entries[key] = entry
            performAutoLogin(actions, key)
        }
        for key in entries.keys.sorted() where entries[key]?.machine.autoLogin == true && !wanted.contains(key) {
            entries[key]?.machine.autoLoginStopped()
            deadlines.cancel(TimedWork(key: key, timer: .login))
            forget(key)
            wakeLoginWaiters(key)
        }
        rearmTimer()
    }

    /// The credential or configuration of `provider` (nil: of every provider)
    /// changed: the backoff of its accounts ends, and automatic ones waiting
    /// for their next login are logged in now.
    func providerCredentialsChanged(_ provider: String?) {
        let now = clock.now()
        for key in entries.keys.sorted() where provider == nil || key.account.provider == provider {
            guard var entry = entries[key] else { continue }
            let actions = entry.machine.credentialsChanged(now: now)
            entries[key] = entry
            performAutoLogin(actions, key)
        }
    }

    /// Performs what an account's state machine said about its automatic login.
    func performAutoLogin(_ actions: [AccountStateMachine.AutoLoginAction], _ key: SessionKey) {
        for action in actions {
            switch action {
            case .login:
                deadlines.cancel(TimedWork(key: key, timer: .login))
                spawn { await self.autoLogin(key) }
            case .schedule(let at):
                deadlines.schedule(TimedWork(key: key, timer: .login), at: at)
            case .forget:
                guard entries[key]?.machine.state == .loggedOut else { continue }
                entries[key] = nil
                for timer in SessionTimers.Timer.allCases { deadlines.cancel(TimedWork(key: key, timer: timer)) }
                table.publish(key, nil)
                return
            }
        }
        publishParked(key)
        rearmTimer()
    }

    /// The account's login deadline passed (`runDueWork`).
    func autoLoginDue(_ key: SessionKey) {
        guard var entry = entries[key] else { return }
        let actions = entry.machine.autoLoginDue(now: clock.now())
        entries[key] = entry
        performAutoLogin(actions, key)
    }

    /// Logs an automatic account in as vaultd: the provider issues the tokens
    /// (client credentials, or the exec helper with its own credential). Joins
    /// nothing and starts nothing when a login or logout is in flight or the
    /// account is logged in; waits out the backoff.
    func autoLogin(_ key: SessionKey) async {
        guard var entry = entries[key], entry.machine.autoLogin else { return }
        let account = key.account
        let now = clock.now()
        let action = entry.machine.loginRequested(asksProvider: true, now: now)
        entries[key] = entry
        switch action {
        case .returnExisting, .joinInFlight, .waitThenRetry, .startReplace:
            // Logged in already, or the work in flight decides (a logout's end plans the next login).
            return
        case .backingOff:
            let again = entry.machine.autoLoginStarted(now: now)
            entries[key] = entry
            performAutoLogin(again, key)
            return
        case .startLogin:
            break
        }
        let failure: VaultError?
        if let refusal = gate.health.refusal {
            // Tokens minted now could not be kept: try again after the backoff.
            failure = refusal
        } else if config.providers[account.provider] == nil {
            failure = .unknownProvider(account.provider, in: config)
        } else if config.providers[account.provider]?.singleAccount == true, otherSession(of: key) != nil {
            failure = VaultError(
                .invalidParameter,
                "[Provider \(account.provider)] is SingleAccount=yes and uid \(key.owner) holds another session of it; vaultd does not switch accounts on its own: log that one out"
            )
        } else {
            failure = nil
        }
        if let failure {
            _ = failLogin(key, .vaultd, failure)
            return
        }
        table.publish(key, SessionView(state: .logging, record: nil))
        let request = LoginRequest(provider: account.provider, user: account.user)
        let task = Task { () -> Result<SessionRecord, VaultError> in
            await self.performLogin(request, key: key, by: .vaultd)
        }
        entries[key]?.login = task
        _ = await task.value
    }

    /// A client's login was refused before it began (the store is down, too
    /// many sessions): the account is logged out again. An automatic account
    /// is then logged in by vaultd, now or after its backoff: the client
    /// wanted it logged in, and vaultd keeps trying.
    func abandonLogin(_ key: SessionKey) {
        guard var entry = entries[key] else { return }
        entry.machine.loginFailed()
        let again = entry.machine.autoLoginStarted(now: clock.now())
        entries[key] = entry
        performAutoLogin(again, key)
    }

    /// Publishes a logged-out account that stays (automatic, or with failed
    /// logins to show): state `logout`, its failed logins, not counted as a session.
    func publishParked(_ key: SessionKey) {
        guard let entry = entries[key], entry.machine.state == .loggedOut, entry.parks else { return }
        let backoff = entry.machine.backoff
        table.publish(
            key,
            SessionView(
                state: .logout, record: nil, refresh: backoff == LoginBackoff() ? nil : backoff.status, parked: true))
    }

    /// A new session begins in a parked entry: it gets a new id (work of the
    /// session before, such as a late refresh, must not touch this one) and
    /// a fresh timed life (a refused grant, failures and the refresh in
    /// flight were the old session's).
    func renewParkedEntry(_ key: SessionKey) {
        guard entries[key] != nil else { return }
        nextEntryID += 1
        entries[key]?.id = nextEntryID
        entries[key]?.timers = SessionTimers()
        entries[key]?.refresh = nil
        deadlines.cancel(TimedWork(key: key, timer: .login))
    }

    /// The error of a login refused during the backoff: what failed, and
    /// from when a login is allowed again.
    static func backingOff(_ account: Account, _ backoff: LoginBackoff) -> VaultError {
        let failures = backoff.consecutiveFailures
        return VaultError(
            .loginBackingOff,
            "logging \(account) in failed \(failures) time\(failures == 1 ? "" : "s") in a row (last: \(backoff.lastErrorCode ?? "?"): \(backoff.lastError ?? "unknown error")); the next login is allowed from \(backoff.nextRetryAt.map { "\($0)" } ?? "now") on, for every caller (vaultctl status \(account.provider) \(account.user) shows it)"
        )
    }

    // MARK: GetToken waiting for an automatic login

    /// A token of the session `key` for `caller`, waiting up to `waitSeconds`
    /// for vaultd's login of an `AutoLogin=yes` account that is not logged in
    /// (one in flight, or one due by then); then as `freshToken`. An account
    /// vaultd does not log in, or whose next login comes too late, is
    /// answered at once (`NotLoggedIn`, or `LoginBackingOff` naming when).
    public func autoLoginToken(_ key: SessionKey, minValidSeconds: Int64, waitSeconds: Int64, caller: Caller)
        async throws(VaultError) -> SessionRecord
    {
        let account = key.account
        guard policy.policy.mayReadToken(caller, key) else {
            throw VaultError(.accessDenied, "the token of \(account) is handed only to its owner")
        }
        let deadline = clock.preciseNow() + Double(max(0, waitSeconds))
        // Bounded: each pass waits for one login to end, or for the deadline.
        for _ in 0..<64 {
            guard let entry = entries[key] else { throw .notLoggedIn(account) }
            if entry.record != nil {
                return try await freshToken(key, minValidSeconds: minValidSeconds, caller: caller)
            }
            let last = UnixTime(seconds: Int64(deadline.rounded(.down)))
            guard !stopping, clock.preciseNow() < deadline, entry.machine.expectsLogin(by: last) else {
                if entry.machine.backoff.isBackingOff(at: clock.now()) {
                    throw Self.backingOff(account, entry.machine.backoff)
                }
                throw .notLoggedIn(account)
            }
            await waitForLogin(key, until: deadline)
        }
        throw .notLoggedIn(account)
    }

    /// Waits until a login of `key` ends (or `wakeLoginWaiters` is called
    /// for it), or until `deadline`.
    func waitForLogin(_ key: SessionKey, until deadline: Double) async { await wait(.login(key), until: deadline) }

    /// Waits for `purpose` until `deadline` (clock seconds) at the latest:
    /// time kept by the alarm's due work (`wakeWaiters(dueAt:)`), not a
    /// sleep on the clock. Returns at once once stopping, but for the grace.
    func wait(_ purpose: Waiter.Purpose, until deadline: Double) async {
        guard !stopping || purpose == .grace else { return }
        nextWaiterID += 1
        let id = nextWaiterID
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            waiters[id] = Waiter(purpose: purpose, continuation: continuation, deadline: deadline)
            rearmTimer()
        }
        waiters[id] = nil
    }

    /// Wakes the waiting calls `which` picks, each once, in the order they began to wait.
    private func wakeWaiters(where which: (Waiter) -> Bool) {
        for id in waiters.keys.sorted() {
            guard let waiter = waiters[id], let continuation = waiter.continuation, which(waiter) else { continue }
            waiters[id]?.continuation = nil
            continuation.resume()
        }
    }

    /// Wakes every call whose wait ended by `now`.
    func wakeWaiters(dueAt now: Double) { wakeWaiters { $0.deadline <= now } }

    /// Wakes every call waiting for `purpose`.
    func wakeWaiters(for purpose: Waiter.Purpose) { wakeWaiters { $0.purpose == purpose } }

    /// Wakes every `GetToken` waiting for a login of `key`: it looks again.
    func wakeLoginWaiters(_ key: SessionKey) { wakeWaiters(for: .login(key)) }

    /// Wakes the calls of clients (shutdown): a fleet host's refresh waits
    /// on for the other host's tokens, at most through the grace.
    func wakeClientWaiters() {
        wakeWaiters {
            if case .otherHost = $0.purpose { false } else { true }
        }
    }

    /// The waits still waiting for `purpose`'s kind, as `pick` names them.
    func waiting<T>(_ pick: (Waiter.Purpose) -> T?) -> [T] {
        waiters.values.compactMap { $0.continuation == nil ? nil : pick($0.purpose) }
    }
}

extension SessionManager {
    /// When vaultd logs the account of `key` in next on its own, if it plans
    /// to (the simulation's liveness check, `vaultctl status` through the view).
    public func plannedAutoLogin(_ key: SessionKey) -> UnixTime? {
        entries[key]?.machine.autoLoginAt
    }

    /// `GetToken` calls waiting for an automatic login now.
    public var waitingForLogin: Int {
        waiting {
            if case .login(let key) = $0 { key } else { nil }
        }.count
    }
}
