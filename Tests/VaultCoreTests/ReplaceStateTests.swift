import Testing
import VaultCore

/// A machine for the fixture account in `state`.
private func machine(_ state: AccountStateMachine.State = .loggedOut) -> AccountStateMachine {
    AccountStateMachine(account: Fixtures.account, state: state)
}

private let old = Fixtures.record(owner: 1000, token: "tok_old_abcdefghijklmnop")
private let new = Fixtures.record(owner: 1000, token: "tok_new_abcdefghijklmnop")

@Suite("AccountStateMachine: replace", .timeLimit(.minutes(5)))
struct AccountStateMachineReplaceTests {
    @Test("Should start a replace of a logged-in session, still shown as logged in meanwhile")
    func replaceWhenLoggedIn() {
        var m = machine(.loggedIn(old))
        #expect(m.replaceRequested() == .startReplace(old))
        #expect(m.state == .replacing(old))
        #expect(m.state.loginState == .logged)
    }

    @Test("Should log a logged-out account in when asked to replace")
    func replaceWhenLoggedOut() {
        var m = machine()
        #expect(m.replaceRequested() == .startLogin)
        #expect(m.state == .loggingIn)
    }

    @Test(
        "Should make a replace wait for a login, a logout or another replace in flight, changing nothing",
        arguments: [
            AccountStateMachine.State.loggingIn, .loggingOut(old), .replacing(old),
        ])
    func replaceWaits(state: AccountStateMachine.State) {
        var m = machine(state)
        #expect(m.replaceRequested() == .waitThenRetry)
        #expect(m.state == state)
    }

    @Test("Should serve the new record once the replace is stored")
    func replaceSucceeds() {
        var m = machine(.loggedIn(old))
        _ = m.replaceRequested()
        m.replaceFinished(new)
        #expect(m.state == .loggedIn(new))
        #expect(m.loginRequested() == .returnExisting(new))
    }

    @Test("Should keep the old record when the replace fails")
    func replaceFails() {
        var m = machine(.loggedIn(old))
        _ = m.replaceRequested()
        m.replaceFinished(nil)
        #expect(m.state == .loggedIn(old))
    }

    @Test("Should make a plain login and a logout wait while a replace is in flight")
    func othersWaitForReplace() {
        var m = machine(.replacing(old))
        #expect(m.loginRequested() == .waitThenRetry)
        #expect(m.logoutRequested() == .waitThenRetry)
        #expect(m.state == .replacing(old))
    }

    @Test("Should ignore a refresh that finishes while a replace is in flight")
    func refreshDuringReplaceIgnored() {
        var m = machine(.replacing(old))
        m.refreshed(Fixtures.record(owner: 1000, token: "tok_refreshed_abcdefgh"))
        #expect(m.state == .replacing(old))
        m.replaceFinished(new)
        #expect(m.state == .loggedIn(new))
    }

    @Test("Should answer a plain login of a logged-in session as before: the existing session")
    func plainLoginUnchanged() {
        var m = machine(.loggedIn(old))
        #expect(m.loginRequested() == .returnExisting(old))
        #expect(m.state == .loggedIn(old))
    }
}

@Suite("SessionTimers: replaced", .timeLimit(.minutes(5)))
struct SessionTimersReplacedTests {
    let now = UnixTime(seconds: 1_700_000_000)

    func facts(canRefresh: Bool = true) -> SessionTimers.Facts {
        SessionTimers.Facts(
            expiresAt: now.adding(seconds: 3600), refreshedAt: now, createdAt: now, canRefresh: canRefresh,
            maxLifetimeSeconds: nil, jitter: 0.5)
    }

    @Test("Should forget a refused grant, failures and an end still to do, and schedule the new tokens")
    func replacedResets() {
        var timers = SessionTimers()
        _ = timers.handle(.stored(facts(), now: now))
        _ = timers.handle(.refreshStarted)
        _ = timers.handle(
            .refreshFailed(VaultError(.networkError, "503"), retryAfter: nil, random: 0.5, now: now, expired: false))
        _ = timers.handle(.refreshStarted)
        _ = timers.handle(.refreshRefused(code: "invalid_grant", reason: "refused"))
        _ = timers.handle(.endFailed(reason: "tokenInvalid", kind: .tokenInvalid, now: now))
        #expect(timers.refused && timers.pendingEnd != nil && timers.status.consecutiveFailures == 1)

        let later = now.adding(seconds: 10)
        let actions = timers.handle(.replaced(facts(), now: later))
        #expect(!timers.refused)
        #expect(timers.pendingEnd == nil)
        #expect(timers.status.consecutiveFailures == 0 && timers.status.lastError == nil)
        #expect(actions.contains(.schedule(.expire, at: now.adding(seconds: 3600))))
        #expect(actions.contains { if case .schedule(.refresh, _) = $0 { return true } else { return false } })
        #expect(actions.contains(.cancel(.saveRetry)))
        // The refresh it armed starts a refresh, not the old end.
        #expect(timers.handle(.due(.refresh, now: later, expired: false)) == [.startRefresh])
    }

    @Test("Should clear unsaved tokens: the replace wrote the session")
    func replacedIsSaved() {
        var timers = SessionTimers()
        _ = timers.handle(.stored(facts(), now: now))
        _ = timers.handle(.storeStale(now: now))
        #expect(timers.status.unsaved)
        _ = timers.handle(.replaced(facts(canRefresh: false), now: now))
        #expect(!timers.status.unsaved)
        #expect(timers.handle(.due(.saveRetry, now: now, expired: false)).isEmpty)
    }
}
