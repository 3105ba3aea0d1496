import Testing
import VaultCore

private let root = Fixtures.caller(uid: 0)

/// A machine for the fixture account in `state`.
private func machine(_ state: AccountStateMachine.State = .loggedOut) -> AccountStateMachine {
    AccountStateMachine(account: Fixtures.account, state: state)
}

/// The error of a `.fail` logout action, or nil.
private func failure(_ action: AccountStateMachine.LogoutAction) -> VaultError? {
    if case .fail(let error) = action { return error }
    return nil
}

@Suite("AccountStateMachine: login", .timeLimit(.minutes(5)))
struct AccountStateMachineLoginTests {
    @Test func newMachine_isLoggedOut() {
        let m = AccountStateMachine(account: Fixtures.account)
        #expect(m.state == .loggedOut)
        #expect(m.state.loginState == .logout)
        #expect(m.account == Fixtures.account)
    }

    @Test func loginRequested_whenLoggedOut_startsLoginAndIsLoggingIn() {
        var m = machine()
        #expect(m.loginRequested() == .startLogin)
        #expect(m.state == .loggingIn)
        #expect(m.state.loginState == .logging)
    }

    @Test func loginRequested_whileLoggingIn_joinsInFlight() {
        var m = machine()
        _ = m.loginRequested()
        #expect(m.loginRequested() == .joinInFlight)
        #expect(m.state == .loggingIn)
    }

    @Test func loginSucceeded_isLoggedInWithTheRecord() {
        var m = machine()
        _ = m.loginRequested()
        let record = Fixtures.record(owner: 1000)
        m.loginSucceeded(record)
        #expect(m.state == .loggedIn(record))
        #expect(m.state.loginState == .logged)
    }

    @Test func loginFailed_isLoggedOutAndMayStartAgain() {
        var m = machine()
        _ = m.loginRequested()
        m.loginFailed()
        #expect(m.state == .loggedOut)
        #expect(m.loginRequested() == .startLogin)
    }

    @Test func loginRequested_whenLoggedIn_returnsExisting() {
        let record = Fixtures.record(owner: 1000)
        var m = machine(.loggedIn(record))
        #expect(m.loginRequested() == .returnExisting(record))
        #expect(m.state == .loggedIn(record))
    }

    @Test func loginRequested_whileLoggingOut_waitsThenRetries() {
        let record = Fixtures.record(owner: 1000)
        var m = machine(.loggingOut(record))
        #expect(m.loginRequested() == .waitThenRetry)
        #expect(m.state == .loggingOut(record))
    }

    @Test func loginSucceeded_whenNotLoggingIn_traps() async {
        await #expect(processExitsWith: .failure) {
            var m = AccountStateMachine(account: Account(provider: "p", user: "u"))
            m.loginSucceeded(
                SessionRecord(
                    account: m.account, user: UserProfile(uid: "u"), tokens: TokenSet(accessToken: Secret("t")),
                    createdAt: UnixTime(seconds: 0), expiresAt: nil, ownerUID: 0))
        }
    }
}

@Suite("AccountStateMachine: logout", .timeLimit(.minutes(5)))
struct AccountStateMachineLogoutTests {
    @Test func logoutRequested_whenLoggedOut_failsNotLoggedIn() throws {
        var m = machine()
        let error = try #require(failure(m.logoutRequested()))
        #expect(error.code == .notLoggedIn)
        #expect(error.code.seedCode == "ERR_NOT_LOGGED_IN")
        #expect(error.message.contains("alice @ demo"))
        #expect(m.state == .loggedOut)
    }

    @Test func logoutRequested_whileLoggingIn_waitsThenRetries() {
        var m = machine(.loggingIn)
        #expect(m.logoutRequested() == .waitThenRetry)
        #expect(m.state == .loggingIn)
    }

    @Test func logoutRequested_whenLoggedIn_startsLogoutAndIsLoggingOut() {
        let record = Fixtures.record(owner: 1000)
        var m = machine(.loggedIn(record))
        #expect(m.logoutRequested() == .startLogout(record))
        #expect(m.state == .loggingOut(record))
        #expect(m.state.loginState == .logged)
    }

    @Test func logoutRequested_whileLoggingOut_joinsInFlight() {
        let record = Fixtures.record(owner: 1000)
        var m = machine(.loggedIn(record))
        _ = m.logoutRequested()
        #expect(m.logoutRequested() == .joinInFlight)
        #expect(m.state == .loggingOut(record))
    }

    @Test func logoutFinished_succeeded_isLoggedOut() {
        var m = machine(.loggedIn(Fixtures.record()))
        _ = m.logoutRequested()
        m.logoutFinished(succeeded: true)
        #expect(m.state == .loggedOut)
        #expect(m.state.loginState == .logout)
    }

    @Test func logoutFinished_failed_returnsToLoggedInWithTheSameRecord() {
        let record = Fixtures.record(owner: 1000)
        var m = machine(.loggedIn(record))
        _ = m.logoutRequested()
        m.logoutFinished(succeeded: false)
        #expect(m.state == .loggedIn(record))
        #expect(m.loginRequested() == .returnExisting(record))
    }

    @Test func logoutFinished_whenNotLoggingOut_traps() async {
        await #expect(processExitsWith: .failure) {
            var m = AccountStateMachine(account: Account(provider: "p", user: "u"))
            m.logoutFinished(succeeded: true)
        }
    }
}

@Suite("AccountStateMachine: a whole life", .timeLimit(.minutes(5)))
struct AccountStateMachineLifecycleTests {
    @Test func loginThenLogoutThenLoginAgain_followsTheStates() {
        var m = machine()
        var states: [LoginState] = [m.state.loginState]
        #expect(m.loginRequested() == .startLogin)
        states.append(m.state.loginState)
        let record = Fixtures.record(owner: 1000)
        m.loginSucceeded(record)
        states.append(m.state.loginState)
        #expect(m.logoutRequested() == .startLogout(record))
        states.append(m.state.loginState)
        m.logoutFinished(succeeded: true)
        states.append(m.state.loginState)
        #expect(m.loginRequested() == .startLogin)
        states.append(m.state.loginState)
        #expect(states == [.logout, .logging, .logged, .logged, .logout, .logging])
    }
}

@Suite("Caller", .timeLimit(.minutes(5)))
struct CallerTests {
    @Test func isRoot_onlyForUidZero() {
        #expect(root.isRoot)
        #expect(!Fixtures.caller(uid: 1000).isRoot)
    }
}
