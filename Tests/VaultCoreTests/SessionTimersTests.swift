import Testing
import VaultCore

/// A clock moved by hand: the tests say what time it is, nothing waits.
private struct HandClock {
    var now = UnixTime(seconds: 1_700_000_000)

    mutating func advance(_ seconds: Int64) { now = now.adding(seconds: seconds) }
}

/// A one-hour token obtained at `at`, refreshable, with a day's `MaxSessionLifetime=`.
private func facts(
    at: UnixTime, lifetime: Int64? = 3600, canRefresh: Bool = true, maxLifetime: Int64? = 86_400,
    createdAt: UnixTime? = nil, jitter: Double = 0.5
) -> SessionTimers.Facts {
    SessionTimers.Facts(
        expiresAt: lifetime.map { at.adding(seconds: $0) }, refreshedAt: at, createdAt: createdAt ?? at,
        canRefresh: canRefresh, maxLifetimeSeconds: maxLifetime, jitter: jitter)
}

/// Timers for a session stored at `clock.now` with `facts`.
private func stored(_ facts: SessionTimers.Facts, _ clock: HandClock) -> SessionTimers {
    var timers = SessionTimers()
    _ = timers.handle(.stored(facts, now: clock.now))
    return timers
}

/// Where `actions` arm `timer`, if they do.
private func deadline(_ timer: SessionTimers.Timer, in actions: [SessionTimers.Action]) -> UnixTime? {
    for case .schedule(timer, let at) in actions { return at }
    return nil
}

/// A refresh that failed at `now` with a network error saying `message`.
private func networkFailure(
    _ message: String, now: UnixTime, expired: Bool = false, retryAfter: Int64? = nil, random: Double = 0
) -> SessionTimers.Event {
    .refreshFailed(
        VaultError(.networkError, message), retryAfter: retryAfter, random: random, now: now, expired: expired)
}

private let expiredEnd = SessionTimers.Action.end(reason: "tokenExpired", kind: .tokenExpired)

@Suite("SessionTimers: stored", .timeLimit(.minutes(5)))
struct SessionTimersStoredTests {
    @Test(
        "Should arm the expiry, a refresh 80-90% into the lifetime and the maximum lifetime",
        arguments: [0.0, 0.3, 0.5, 0.999])
    func stored_schedulesExpireRefreshAndMaxLifetime(jitter: Double) throws {
        let clock = HandClock()
        var timers = SessionTimers()
        let actions = timers.handle(.stored(facts(at: clock.now, jitter: jitter), now: clock.now))
        let refreshAt = try #require(deadline(.refresh, in: actions))
        #expect(
            actions == [
                .schedule(.expire, at: clock.now.adding(seconds: 3600)), .schedule(.refresh, at: refreshAt),
                .schedule(.maxLifetime, at: clock.now.adding(seconds: 86_400)),
            ])
        #expect(refreshAt >= clock.now.adding(seconds: 2880))
        #expect(refreshAt <= clock.now.adding(seconds: 3240))
        #expect(timers.status.refreshAt == refreshAt)
        #expect(timers.canRefresh)
        #expect(!timers.refreshing)
    }

    @Test("Should count the maximum lifetime from the session's creation, not from the tokens")
    func stored_maxLifetimeFromCreation() {
        var clock = HandClock()
        let created = clock.now
        clock.advance(10_000)
        var timers = SessionTimers()
        let actions = timers.handle(.stored(facts(at: clock.now, createdAt: created), now: clock.now))
        #expect(deadline(.maxLifetime, in: actions) == created.adding(seconds: 86_400))
    }

    @Test("Should refresh no sooner than a second from now when the window already passed")
    func stored_refreshAtLeastOneSecondAhead() {
        var clock = HandClock()
        let issued = clock.now
        clock.advance(3500)  // restored past 90% of the lifetime, still valid
        var timers = SessionTimers()
        // The account whose jitter is 0 comes first in the spread of overdue refreshes.
        let late = timers.handle(.stored(facts(at: issued, jitter: 0), now: clock.now))
        #expect(deadline(.refresh, in: late) == clock.now.adding(seconds: 1))

        // A token living a second: 80% of it rounds down to its issue time.
        let short = timers.handle(.stored(facts(at: clock.now, lifetime: 1), now: clock.now))
        #expect(deadline(.refresh, in: short) == clock.now.adding(seconds: 1))
        #expect(deadline(.expire, in: short) == clock.now.adding(seconds: 1))
    }

    @Test(
        "Should spread overdue refreshes by the account's jitter over at most 30 s, before the token expires",
        arguments: [0.0, 0.25, 0.5, 0.999])
    func stored_overdueRefreshesSpread(jitter: Double) throws {
        var clock = HandClock()
        let issued = clock.now
        clock.advance(3300)  // restored after a stop: the refresh point (80-90%) has passed, 300 s left
        var timers = SessionTimers()
        let actions = timers.handle(.stored(facts(at: issued, jitter: jitter), now: clock.now))
        let at = try #require(deadline(.refresh, in: actions))
        #expect(at == clock.now.adding(seconds: 1 + Int64((30 * jitter).rounded(.down))))
        #expect(deadline(.expire, in: actions) == issued.adding(seconds: 3600), "a valid token keeps its expiry")

        // Little left of the token: the spread is half of what is left, so every refresh comes before it expires.
        clock.advance(280)  // 20 s left
        let tight = timers.handle(.stored(facts(at: issued, jitter: jitter), now: clock.now))
        let tightAt = try #require(deadline(.refresh, in: tight))
        #expect(tightAt == clock.now.adding(seconds: 1 + Int64((9 * jitter).rounded(.down))))
        #expect(tightAt < issued.adding(seconds: 3600))
    }

    @Test("Should spread the refreshes of tokens that expired while vaultd was stopped, their expiry due with them")
    func stored_expiredRefreshableSpread() throws {
        var clock = HandClock()
        let issued = clock.now
        clock.advance(7200)  // an hour past the expiry
        var timers = SessionTimers()
        let actions = timers.handle(.stored(facts(at: issued, jitter: 0.5), now: clock.now))
        let at = try #require(deadline(.refresh, in: actions))
        #expect(at == clock.now.adding(seconds: 16))
        #expect(deadline(.expire, in: actions) == at, "the expiry comes due with the refresh, not at once")
        // One that cannot be refreshed ends at once, as before.
        var fixed = SessionTimers()
        let cannot = fixed.handle(.stored(facts(at: issued, canRefresh: false, maxLifetime: nil), now: clock.now))
        #expect(cannot == [.schedule(.expire, at: issued.adding(seconds: 3600)), .cancel(.refresh)])
    }

    @Test("Should spread 60 sessions overdue at once over the window instead of one second")
    func stored_manyOverdueSpread() {
        var clock = HandClock()
        let issued = clock.now
        clock.advance(3400)
        var seconds: [Int64] = []
        for index in 0..<60 {
            var timers = SessionTimers()
            let account = Account(provider: "oauth", user: "user\(index)")
            let jitter = RefreshPolicy.jitter(for: account)
            let at = deadline(.refresh, in: timers.handle(.stored(facts(at: issued, jitter: jitter), now: clock.now)))
            seconds.append((at ?? clock.now).seconds - clock.now.seconds)
        }
        let perSecond = Dictionary(seconds.map { ($0, 1) }, uniquingKeysWith: +)
        #expect(seconds.allSatisfy { (1...31).contains($0) })
        #expect(perSecond.count >= 15, "spread over many seconds: \(perSecond.sorted { $0.key < $1.key })")
        #expect(perSecond.values.max() ?? 0 <= 10, "no second takes most of them: \(perSecond)")
    }

    @Test("Should arm no expiry and no refresh for a token without an expiry")
    func stored_withoutExpiry() {
        let clock = HandClock()
        var timers = SessionTimers()
        let actions = timers.handle(.stored(facts(at: clock.now, lifetime: nil, maxLifetime: nil), now: clock.now))
        #expect(actions == [.cancel(.expire), .cancel(.refresh)])
        #expect(timers.status.refreshAt == nil)
    }

    @Test("Should arm only the expiry when the provider cannot refresh")
    func stored_whenCannotRefresh() {
        let clock = HandClock()
        var timers = SessionTimers()
        let actions = timers.handle(
            .stored(facts(at: clock.now, canRefresh: false, maxLifetime: nil), now: clock.now))
        #expect(actions == [.schedule(.expire, at: clock.now.adding(seconds: 3600)), .cancel(.refresh)])
        #expect(timers.status.refreshAt == nil)
        #expect(!timers.canRefresh)
    }
}

@Suite("SessionTimers: deadlines", .timeLimit(.minutes(5)))
struct SessionTimersDueTests {
    @Test("Should start a refresh when it is due, and none while one is in flight")
    func dueRefresh_startsOnlyWhenNoneInFlight() throws {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3000)
        #expect(timers.handle(.due(.refresh, now: clock.now, expired: false)) == [.startRefresh])
        #expect(timers.handle(.refreshStarted) == [.connection(.connecting)])
        #expect(timers.refreshing)
        #expect(timers.status.connection == .connecting)
        #expect(timers.handle(.due(.refresh, now: clock.now, expired: false)).isEmpty)
    }

    @Test("Should do nothing when the expiry deadline passes and the token is still valid")
    func dueExpire_notExpired() {
        let clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        #expect(timers.handle(.due(.expire, now: clock.now, expired: false)).isEmpty)
        #expect(!timers.expiredWhileRefreshing)
    }

    @Test("Should end the session at once when the token expired and the provider cannot refresh")
    func dueExpire_cannotRefresh_ends() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now, canRefresh: false), clock)
        clock.advance(3600)
        #expect(timers.handle(.due(.expire, now: clock.now, expired: true)) == [expiredEnd])
    }

    @Test("Should refresh an expired token that can be refreshed, and end only if that refresh fails")
    func dueExpire_canRefresh_refreshesThenEndsOnFailure() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3600)
        #expect(timers.handle(.due(.expire, now: clock.now, expired: true)) == [.startRefresh])
        #expect(timers.expiredWhileRefreshing)
        _ = timers.handle(.refreshStarted)
        clock.advance(2)
        let actions = timers.handle(networkFailure("timeout", now: clock.now, expired: true))
        #expect(actions == [.connection(.connectFailed, failure: VaultError(.networkError, "timeout")), expiredEnd])
        #expect(!timers.expiredWhileRefreshing)
        #expect(!timers.refreshing)
    }

    @Test("Should join the refresh in flight when the token expires, and end if it fails")
    func dueExpire_whileRefreshing_joins() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3500)
        #expect(timers.handle(.due(.refresh, now: clock.now, expired: false)) == [.startRefresh])
        _ = timers.handle(.refreshStarted)
        clock.advance(100)
        #expect(timers.handle(.due(.expire, now: clock.now, expired: true)).isEmpty)
        #expect(timers.expiredWhileRefreshing)
        let actions = timers.handle(networkFailure("HTTP 503", now: clock.now, expired: true))
        #expect(actions.last == expiredEnd)
    }

    @Test("Should keep the session when the refresh after the expiry succeeds")
    func dueExpire_refreshSucceeds_keepsSession() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3600)
        _ = timers.handle(.due(.expire, now: clock.now, expired: true))
        _ = timers.handle(.refreshStarted)
        clock.advance(1)
        let actions = timers.handle(.refreshed(facts(at: clock.now), saved: true, now: clock.now))
        #expect(!actions.contains(expiredEnd))
        #expect(!timers.expiredWhileRefreshing)
        // A later failure is retried, not an end: the expiry that started it was answered.
        _ = timers.handle(.refreshStarted)
        let failed = timers.handle(networkFailure("timeout", now: clock.now, expired: true))
        #expect(!failed.contains(expiredEnd))
        #expect(deadline(.refresh, in: failed) != nil)
    }

    @Test("Should retry, not end, when a refresh fails on an expired token before the expiry deadline ran")
    func refreshFailed_expiredWithoutExpiryDeadline_retries() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3600)
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(networkFailure("timeout", now: clock.now, expired: true))
        #expect(
            actions == [
                .schedule(.refresh, at: clock.now.adding(seconds: 1)),
                .connection(.connectFailed, failure: VaultError(.networkError, "timeout")),
            ])
        // The expiry deadline then comes and starts the next attempt, which decides.
        #expect(timers.handle(.due(.expire, now: clock.now, expired: true)) == [.startRefresh])
    }

    @Test("Should end the session when the maximum lifetime passes")
    func dueMaxLifetime_ends() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(86_400)
        #expect(
            timers.handle(.due(.maxLifetime, now: clock.now, expired: false)) == [
                .end(reason: "maxSessionLifetime", kind: .tokenInvalid)
            ])
    }
}

@Suite("SessionTimers: refresh outcomes", .timeLimit(.minutes(5)))
struct SessionTimersRefreshTests {
    @Test("Should back off after a failure, count failures and report connectFailed")
    func refreshFailed_schedulesBackoffAndCounts() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3000)
        for attempt in 1...4 {
            _ = timers.handle(.refreshStarted)
            let actions = timers.handle(networkFailure("HTTP 502", now: clock.now, random: 0.999))
            let wait = RefreshPolicy.backoff(attempt: attempt, random: 0.999)
            #expect(
                actions == [
                    .schedule(.refresh, at: clock.now.adding(seconds: wait)),
                    .connection(.connectFailed, failure: VaultError(.networkError, "HTTP 502")),
                ])
            #expect(timers.status.consecutiveFailures == attempt)
            #expect(timers.status.nextRetryAt == clock.now.adding(seconds: wait))
            #expect(timers.status.lastError == "HTTP 502")
            #expect(timers.status.connection == .connectFailed)
            #expect(!timers.refreshing)
            clock.advance(wait)
            #expect(timers.handle(.due(.refresh, now: clock.now, expired: false)) == [.startRefresh])
        }
        #expect(RefreshPolicy.backoff(attempt: 4, random: 0.999) == 16, "the backoff grows")
    }

    @Test("Should cap the backoff at five minutes however often the refresh fails")
    func refreshFailed_backoffCapped() {
        let clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        var last: [SessionTimers.Action] = []
        for _ in 1...20 {
            _ = timers.handle(.refreshStarted)
            last = timers.handle(networkFailure("down", now: clock.now, random: 0.999))
        }
        #expect(timers.status.consecutiveFailures == 20)
        #expect(deadline(.refresh, in: last) == clock.now.adding(seconds: 300))
    }

    @Test("Should wait at least the server's Retry-After, itself capped at an hour")
    func refreshFailed_honoursRetryAfter() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3000)
        _ = timers.handle(.refreshStarted)
        let polite = timers.handle(networkFailure("HTTP 429", now: clock.now, retryAfter: 120))
        #expect(deadline(.refresh, in: polite) == clock.now.adding(seconds: 120))
        #expect(timers.status.nextRetryAt == clock.now.adding(seconds: 120))

        _ = timers.handle(.refreshStarted)
        let greedy = timers.handle(networkFailure("HTTP 429", now: clock.now, retryAfter: 86_400))
        #expect(deadline(.refresh, in: greedy) == clock.now.adding(seconds: RefreshPolicy.longestRetryAfter))
    }

    @Test("Should reset the failures and schedule anew after a refresh that was saved")
    func refreshed_saved_resetsAndReschedules() throws {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3000)
        _ = timers.handle(.refreshStarted)
        _ = timers.handle(networkFailure("HTTP 500", now: clock.now))
        clock.advance(1)
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(.refreshed(facts(at: clock.now), saved: true, now: clock.now))
        let refreshAt = try #require(deadline(.refresh, in: actions))
        #expect(
            actions == [
                .schedule(.expire, at: clock.now.adding(seconds: 3600)), .schedule(.refresh, at: refreshAt),
                .schedule(.maxLifetime, at: clock.now.adding(seconds: 86_400)), .cancel(.saveRetry),
                .connection(.connected),
            ])
        #expect(refreshAt >= clock.now.adding(seconds: 2880) && refreshAt <= clock.now.adding(seconds: 3240))
        #expect(timers.status.consecutiveFailures == 0)
        #expect(timers.status.lastError == nil)
        #expect(timers.status.nextRetryAt == nil)
        #expect(timers.status.lastRefreshAt == clock.now)
        #expect(timers.status.refreshAt == refreshAt)
        #expect(timers.status.connection == .connected)
        #expect(!timers.status.unsaved)
        #expect(!timers.refreshing)
    }

    @Test(
        "Should tell of a change of connection state only: a connected session's refresh says nothing, a failure says connectFailed with its code and message once"
    )
    func connectionEvents_onChangeOnly() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        func told(_ actions: [SessionTimers.Action]) -> [SessionTimers.Action] {
            actions.filter { if case .connection = $0 { true } else { false } }
        }
        clock.advance(3000)
        #expect(told(timers.handle(.refreshStarted)) == [.connection(.connecting)])
        #expect(
            told(timers.handle(.refreshed(facts(at: clock.now), saved: true, now: clock.now)))
                == [.connection(.connected)])
        // Connected: the next refresh, and its success, are no news.
        clock.advance(3000)
        #expect(told(timers.handle(.refreshStarted)).isEmpty)
        #expect(timers.status.connection == .connected)
        #expect(told(timers.handle(.refreshed(facts(at: clock.now), saved: true, now: clock.now))).isEmpty)
        // A failure is: with vaultd's code and the provider's message.
        clock.advance(3000)
        #expect(told(timers.handle(.refreshStarted)).isEmpty)
        let failed = timers.handle(networkFailure("HTTP 503: down for maintenance", now: clock.now))
        #expect(
            told(failed) == [
                .connection(.connectFailed, failure: VaultError(.networkError, "HTTP 503: down for maintenance"))
            ])
        #expect(timers.status.lastErrorCode == "ERR_NETWORK_ERROR")
        // The retry connects again, and its success is news.
        #expect(told(timers.handle(.refreshStarted)) == [.connection(.connecting)])
        #expect(
            told(timers.handle(.refreshed(facts(at: clock.now), saved: true, now: clock.now)))
                == [.connection(.connected)])
        #expect(timers.status.lastErrorCode == nil)
    }

    @Test("Should schedule a save retry after a refresh whose tokens could not be written")
    func refreshed_unsaved_schedulesSaveRetry() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3000)
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(.refreshed(facts(at: clock.now), saved: false, now: clock.now))
        #expect(deadline(.saveRetry, in: actions) == clock.now.adding(seconds: SessionTimers.saveRetrySeconds))
        #expect(!actions.contains(.cancel(.saveRetry)))
        #expect(actions.last == .connection(.connected))
        #expect(timers.status.unsaved)
    }

    @Test("Should end the session as tokenInvalid when the provider refuses the refresh")
    func refreshRefused_endsTokenInvalid() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3000)
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(.refreshRefused(code: "invalid_grant", reason: "refresh token revoked"))
        #expect(actions == [.end(reason: "tokenInvalid", kind: .tokenInvalid)])
        #expect(timers.status.lastError == "refresh token revoked")
        #expect(!timers.refreshing)
    }

    @Test("Should forget a refresh that found its session gone")
    func refreshAbandoned_clearsInFlight() {
        var clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        clock.advance(3600)
        _ = timers.handle(.due(.expire, now: clock.now, expired: true))
        _ = timers.handle(.refreshStarted)
        #expect(timers.handle(.refreshAbandoned).isEmpty)
        #expect(!timers.refreshing)
        #expect(!timers.expiredWhileRefreshing)
        #expect(timers.handle(.due(.refresh, now: clock.now, expired: true)) == [.startRefresh])
    }
}

@Suite("SessionTimers: save retry", .timeLimit(.minutes(5)))
struct SessionTimersSaveTests {
    /// Timers whose last refresh could not be written, at `clock.now`.
    private func unsaved(_ clock: HandClock) -> SessionTimers {
        var timers = stored(facts(at: clock.now), clock)
        _ = timers.handle(.refreshStarted)
        _ = timers.handle(.refreshed(facts(at: clock.now), saved: false, now: clock.now))
        return timers
    }

    @Test("Should write again while the tokens are unsaved, and retry after a failed write")
    func saveRetry_persistsWhileUnsaved() {
        var clock = HandClock()
        var timers = unsaved(clock)
        clock.advance(SessionTimers.saveRetrySeconds)
        #expect(timers.handle(.due(.saveRetry, now: clock.now, expired: false)) == [.persist])
        #expect(
            timers.handle(.saveFailed(now: clock.now)) == [
                .schedule(.saveRetry, at: clock.now.adding(seconds: SessionTimers.saveRetrySeconds))
            ])
        #expect(timers.status.unsaved)
        clock.advance(SessionTimers.saveRetrySeconds)
        #expect(timers.handle(.due(.saveRetry, now: clock.now, expired: false)) == [.persist])
    }

    @Test("Should stop retrying once the write succeeded")
    func saved_cancelsSaveRetry() {
        var clock = HandClock()
        var timers = unsaved(clock)
        clock.advance(SessionTimers.saveRetrySeconds)
        _ = timers.handle(.due(.saveRetry, now: clock.now, expired: false))
        #expect(timers.handle(.saved) == [.cancel(.saveRetry)])
        #expect(!timers.status.unsaved)
        #expect(timers.handle(.due(.saveRetry, now: clock.now, expired: false)).isEmpty)
    }

    @Test("Should not write when a save retry comes due and nothing is unsaved")
    func saveRetry_whenSaved_doesNothing() {
        let clock = HandClock()
        var timers = stored(facts(at: clock.now), clock)
        #expect(timers.handle(.due(.saveRetry, now: clock.now, expired: false)).isEmpty)
    }

    @Test("Should drop a pending save retry when a later refresh was written")
    func refreshedSaved_afterUnsaved_cancelsRetry() {
        var clock = HandClock()
        var timers = unsaved(clock)
        clock.advance(3000)
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(.refreshed(facts(at: clock.now), saved: true, now: clock.now))
        #expect(actions.contains(.cancel(.saveRetry)))
        #expect(!timers.status.unsaved)
        #expect(timers.handle(.due(.saveRetry, now: clock.now, expired: false)).isEmpty)
    }
}
