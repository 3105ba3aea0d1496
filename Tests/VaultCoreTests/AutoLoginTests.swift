import Testing
import VaultCore

private let t0 = UnixTime(seconds: 1_800_000_000)

/// A logged-out machine for the fixture account, automatic or not.
private func machine(autoLogin: Bool = true, reloginAfterKick: Bool = false) -> AccountStateMachine {
    var m = AccountStateMachine(account: Fixtures.account)
    m.autoLogin = autoLogin
    m.reloginAfterKick = reloginAfterKick
    return m
}

/// Fails the login in flight at `now` with `random` picking the wait.
private func fail(
    _ m: inout AccountStateMachine, now: UnixTime, random: Double = 0.5, retryAfter: Int64? = nil
) -> [AccountStateMachine.AutoLoginAction] {
    m.loginFailed(VaultError(.networkError, "HTTP 503"), retryAfter: retryAfter, random: random, now: now)
}

@Suite("AccountStateMachine: automatic login and login backoff", .timeLimit(.minutes(5)))
struct AutoLoginMachineTests {
    @Test("Should log an automatic account in at once at start, and a plain one not at all")
    func startLogsIn() {
        var auto = machine()
        #expect(auto.autoLoginStarted(now: t0) == [.login])
        #expect(auto.expectsLogin(by: t0))
        var plain = machine(autoLogin: false)
        #expect(plain.autoLoginStarted(now: t0) == [])
        #expect(!plain.expectsLogin(by: t0.adding(seconds: 3600)))
    }

    @Test("Should back off after a failed login between 1 s and the attempt's ceiling, growing to 5 min")
    func backoffGrows() {
        var m = machine()
        var now = t0
        var waits: [Int64] = []
        for _ in 0..<12 {
            #expect(m.loginRequested(asksProvider: true, now: now) == .startLogin)
            let actions = fail(&m, now: now, random: 0.999)
            guard case .schedule(let at)? = actions.first else {
                Issue.record("no retry scheduled: \(actions)")
                return
            }
            waits.append(at.seconds - now.seconds)
            #expect(m.backoff.nextRetryAt == at)
            // Not due before its time; due at it.
            #expect(m.autoLoginDue(now: at.adding(seconds: -1)) == [.schedule(at: at)])
            #expect(m.autoLoginDue(now: at) == [.login])
            now = at
        }
        // Full jitter with random near 1: the ceiling of each attempt, 2^n s, at most 300 s.
        #expect(waits == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300, 300, 300])
        #expect(m.backoff.consecutiveFailures == 12)
    }

    @Test("Should pick the wait with the injected randomness (full jitter), never under 1 s")
    func fullJitter() {
        var low = machine()
        _ = low.loginRequested(asksProvider: true, now: t0)
        #expect(fail(&low, now: t0, random: 0) == [.schedule(at: t0.adding(seconds: 1))])
        var mid = machine()
        for _ in 0..<5 {
            _ = mid.loginRequested(asksProvider: true, now: t0.adding(seconds: 10_000))
            _ = fail(&mid, now: t0, random: 0.5)
        }
        // Attempt 5: ceiling 32 s, half of it.
        #expect(mid.backoff.nextRetryAt == t0.adding(seconds: 16))
    }

    @Test("Should wait at least the server's Retry-After")
    func retryAfter() {
        var m = machine()
        _ = m.loginRequested(asksProvider: true, now: t0)
        let actions = fail(&m, now: t0, random: 0, retryAfter: 120)
        #expect(actions == [.schedule(at: t0.adding(seconds: 120))])
    }

    @Test("Should refuse any caller's provider login during the backoff, naming when, and let tokens brought along in")
    func sharedBackoff() {
        var m = machine(autoLogin: false)
        _ = m.loginRequested(asksProvider: true, now: t0)
        // Not automatic: only a deadline to forget the failures, 5 min after the wait.
        #expect(fail(&m, now: t0, random: 0.999) == [.schedule(at: t0.adding(seconds: 2 + 300))])
        guard case .backingOff(let backoff) = m.loginRequested(asksProvider: true, now: t0.adding(seconds: 1)) else {
            Issue.record("a login during the backoff was not refused")
            return
        }
        #expect(backoff.nextRetryAt == t0.adding(seconds: 2))
        #expect(backoff.lastErrorCode == "ERR_NETWORK_ERROR")
        #expect(backoff.lastError == "HTTP 503")
        #expect(m.state == .loggedOut)
        // A login with a ready token does not ask the provider: not held back.
        #expect(m.loginRequested(asksProvider: false, now: t0.adding(seconds: 1)) == .startLogin)
        m.loginFailed()
        // At nextRetryAt the next try may start.
        #expect(m.loginRequested(asksProvider: true, now: t0.adding(seconds: 2)) == .startLogin)
    }

    @Test("Should forget the failures of an account vaultd does not log in 5 min after their backoff")
    func forgetsPlainFailures() {
        var m = machine(autoLogin: false)
        _ = m.loginRequested(asksProvider: true, now: t0)
        let actions = fail(&m, now: t0, random: 0.999)
        #expect(actions == [.schedule(at: t0.adding(seconds: 302))])
        #expect(m.autoLoginDue(now: t0.adding(seconds: 301)) == [.schedule(at: t0.adding(seconds: 302))])
        #expect(m.autoLoginDue(now: t0.adding(seconds: 302)) == [.forget])
    }

    @Test("Should end the wait when the credentials change, logging an automatic account in at once")
    func credentialsChanged() {
        var auto = machine()
        _ = auto.loginRequested(asksProvider: true, now: t0)
        _ = fail(&auto, now: t0, random: 0.999)
        #expect(auto.credentialsChanged(now: t0) == [.login])
        #expect(auto.loginRequested(asksProvider: true, now: t0) == .startLogin)
        var plain = machine(autoLogin: false)
        _ = plain.loginRequested(asksProvider: true, now: t0)
        _ = fail(&plain, now: t0, random: 0.999)
        #expect(plain.credentialsChanged(now: t0) == [.forget])
        #expect(plain.loginRequested(asksProvider: true, now: t0) == .startLogin)
    }

    @Test("Should clear the backoff and the planned login once a login succeeds")
    func successResets() {
        var m = machine()
        _ = m.loginRequested(asksProvider: true, now: t0)
        _ = fail(&m, now: t0)
        _ = m.autoLoginDue(now: t0.adding(seconds: 10))
        _ = m.loginRequested(asksProvider: true, now: t0.adding(seconds: 10))
        m.loginSucceeded(Fixtures.record())
        #expect(m.backoff == LoginBackoff())
        #expect(m.autoLoginAt == nil)
    }

    @Test("Should log in again after tokenExpired and tokenInvalid, after a kick only with ReloginAfterKick")
    func reloginAfterEnd() {
        for (kind, kickToo, expected) in [
            (EventKind.tokenExpired, false, true), (.tokenInvalid, false, true), (.kickedOffline, false, false),
            (.kickedOffline, true, true), (.logoutSuccess, true, false),
        ] {
            var m = machine(reloginAfterKick: kickToo)
            _ = m.loginRequested()
            m.loginSucceeded(Fixtures.record())
            _ = m.logoutRequested()
            m.logoutFinished(succeeded: true)
            #expect(m.sessionEnded(kind, now: t0) == (expected ? [.login] : []), "\(kind) kick \(kickToo)")
            #expect(m.expectsLogin(by: t0) == expected)
        }
    }

    @Test("Should not log a plain account in again when its session ends")
    func plainAccountStaysOut() {
        var m = machine(autoLogin: false)
        _ = m.loginRequested()
        m.loginSucceeded(Fixtures.record())
        _ = m.logoutRequested()
        m.logoutFinished(succeeded: true)
        #expect(m.sessionEnded(.tokenInvalid, now: t0) == [])
    }

    @Test("Should wait out a backoff still running when the session ends or vaultd starts")
    func endDuringBackoff() {
        var m = machine()
        _ = m.loginRequested(asksProvider: true, now: t0)
        _ = fail(&m, now: t0, random: 0.999)
        #expect(m.autoLoginStarted(now: t0) == [.schedule(at: t0.adding(seconds: 2))])
        #expect(m.expectsLogin(by: t0.adding(seconds: 2)))
        #expect(!m.expectsLogin(by: t0.adding(seconds: 1)))
    }

    @Test("Should stop planning logins when AutoLogin is taken away")
    func stopped() {
        var m = machine()
        _ = m.autoLoginStarted(now: t0)
        m.autoLoginStopped()
        #expect(m.autoLoginDue(now: t0) == [])
        #expect(!m.expectsLogin(by: t0))
    }
}

@Suite("ConfigParser: AutoLogin", .timeLimit(.minutes(5)))
struct AutoLoginConfigTests {
    static let providers = """
        [Provider cc]
        Type=oauth2
        TokenURL=https://login.example.com/token
        ClientID=bot

        [Provider helper]
        Type=exec
        Command=/usr/libexec/vaultd-helper

        [Provider demo]
        Type=static
        """

    @Test("Should accept AutoLogin for oauth2 and exec providers, with ReloginAfterKick")
    func accepted() throws {
        let config = try ConfigParser.parse(
            Self.providers + """

                [Account cc bot]
                AutoLogin=yes
                ReloginAfterKick=yes

                [Account helper bot]
                AutoLogin=yes
                """, file: "/etc/vaultd/vaultd.conf")
        #expect(config.accounts[Account(provider: "cc", user: "bot")]?.autoLogin == true)
        #expect(config.accounts[Account(provider: "cc", user: "bot")]?.reloginAfterKick == true)
        #expect(config.accounts[Account(provider: "helper", user: "bot")]?.autoLogin == true)
        #expect(config.accounts[Account(provider: "helper", user: "bot")]?.reloginAfterKick == false)
    }

    @Test("Should refuse AutoLogin for a static provider, naming file, line and key")
    func refusedForStatic() throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse(
                Self.providers + "\n\n[Account demo alice]\nAutoLogin=yes\n", file: "/etc/vaultd/vaultd.conf")
        }
        #expect(error.code == .invalidConfig)
        #expect(error.message.hasPrefix("/etc/vaultd/vaultd.conf:14: key 'AutoLogin'"), "\(error.message)")
        #expect(error.message.contains("Type=static"))
    }

    @Test("Should refuse AutoLogin for a provider that is not configured, and ReloginAfterKick without AutoLogin")
    func refusedOthers() throws {
        let unknown = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Account nowhere bot]\nAutoLogin=yes\n", file: "a.conf")
        }
        #expect(unknown.message.hasPrefix("a.conf:2: key 'AutoLogin'"), "\(unknown.message)")
        let kick = try #require(throws: VaultError.self) {
            try ConfigParser.parse(Self.providers + "\n[Account cc bot]\nReloginAfterKick=yes\n", file: "a.conf")
        }
        #expect(kick.message.hasPrefix("a.conf:13: key 'ReloginAfterKick'"), "\(kick.message)")
        let bad = try #require(throws: VaultError.self) {
            try ConfigParser.parse(Self.providers + "\n[Account cc bot]\nAutoLogin=maybe\n", file: "a.conf")
        }
        #expect(bad.message == "a.conf:13: key 'AutoLogin': expected yes or no")
    }
}
