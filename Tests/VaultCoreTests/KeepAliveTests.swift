import Testing
import VaultCore

/// Accounts vaultd keeps logged in (`AutoLogin=yes`) whose provider mints
/// (client credentials) and that hold no refresh token: the next token is
/// minted ahead of expiry like a refresh (`Renewal.mint`), so the session
/// never lapses; only a mint that fails through the expiry ends it.
@Suite("Keep-alive renewal", .timeLimit(.minutes(5)))
struct KeepAliveTests {
    let start = UnixTime(seconds: 1_700_000_000)

    /// A token of `lifetime` seconds obtained at `at`, renewed as `renewal` says.
    func facts(at: UnixTime, lifetime: Int64 = 3, renewal: Renewal, jitter: Double = 0.5) -> SessionTimers.Facts {
        SessionTimers.Facts(
            expiresAt: at.adding(seconds: lifetime), refreshedAt: at, createdAt: start, canRefresh: renewal.renews,
            maxLifetimeSeconds: nil, jitter: jitter)
    }

    /// Where `actions` arm `timer`, if they do.
    func deadline(_ timer: SessionTimers.Timer, in actions: [SessionTimers.Action]) -> UnixTime? {
        for case .schedule(timer, let at) in actions { return at }
        return nil
    }

    func ends(_ actions: [SessionTimers.Action]) -> Bool {
        actions.contains { if case .end = $0 { true } else { false } }
    }

    @Test("Should refresh what the provider refreshes, mint only for a kept-alive account, else nothing")
    func renewalDecision() {
        #expect(Renewal.of(refreshes: true, mints: true, keptAlive: true) == .refresh)
        #expect(Renewal.of(refreshes: true, mints: false, keptAlive: false) == .refresh)
        #expect(Renewal.of(refreshes: false, mints: true, keptAlive: true) == .mint)
        // A client's own token with no refresh token is not replaced by a minted one.
        #expect(Renewal.of(refreshes: false, mints: true, keptAlive: false) == .none)
        // A static provider mints nothing, kept alive or not.
        #expect(Renewal.of(refreshes: false, mints: false, keptAlive: true) == .none)
        #expect(Renewal.mint.renews && Renewal.refresh.renews && !Renewal.none.renews)
    }

    @Test(
        "Should mint each 3 s token ahead of its expiry for a minute, never ending the session",
        arguments: [0.0, 0.5, 0.999])
    func mintsAheadForAMinute(jitter: Double) throws {
        let renewal = Renewal.of(refreshes: false, mints: true, keptAlive: true)
        var now = start
        var timers = SessionTimers()
        var actions = timers.handle(.stored(facts(at: now, renewal: renewal, jitter: jitter), now: now))
        var mints = 0
        // Bounded: a minute of 3 s tokens is 30 at most.
        for _ in 0..<60 where now < start.adding(seconds: 60) {
            let expireAt = try #require(deadline(.expire, in: actions))
            let refreshAt = try #require(deadline(.refresh, in: actions), "a refresh deadline for a minted session")
            #expect(refreshAt < expireAt, "the next token comes before this one expires")
            #expect(refreshAt > now)
            now = refreshAt
            #expect(timers.handle(.due(.refresh, now: now, expired: false)) == [.startRefresh])
            _ = timers.handle(.refreshStarted)
            actions = timers.handle(.refreshed(facts(at: now, renewal: renewal, jitter: jitter), saved: true, now: now))
            #expect(!ends(actions))
            #expect(timers.status.connection == .connected)
            mints += 1
        }
        #expect(mints >= 20, "\(mints) tokens in a minute")
        #expect(timers.status.consecutiveFailures == 0)
    }

    @Test("Should let an account that is not kept alive expire, as before")
    func notKeptAliveExpires() {
        let renewal = Renewal.of(refreshes: false, mints: true, keptAlive: false)
        var timers = SessionTimers()
        let actions = timers.handle(.stored(facts(at: start, renewal: renewal), now: start))
        #expect(actions == [.schedule(.expire, at: start.adding(seconds: 3)), .cancel(.refresh)])
        #expect(
            timers.handle(.due(.expire, now: start.adding(seconds: 3), expired: true)) == [
                .end(reason: "tokenExpired", kind: .tokenExpired)
            ])
    }

    @Test(
        "Should retry a failed mint while the token is valid, and expire the session only when it fails through expiry")
    func failedMintExpires() throws {
        let renewal = Renewal.mint
        var timers = SessionTimers()
        let stored = timers.handle(.stored(facts(at: start, renewal: renewal), now: start))
        let refreshAt = try #require(deadline(.refresh, in: stored))
        #expect(timers.handle(.due(.refresh, now: refreshAt, expired: false)) == [.startRefresh])
        _ = timers.handle(.refreshStarted)
        let failed = timers.handle(
            .refreshFailed(
                VaultError(.networkError, "HTTP 503"), retryAfter: nil, random: 0, now: refreshAt,
                expired: false))
        #expect(!ends(failed))
        #expect(deadline(.refresh, in: failed) != nil, "retried")
        // The expiry comes before the retry succeeds: one more try, and its failure ends the session.
        let expiry = start.adding(seconds: 3)
        #expect(timers.handle(.due(.expire, now: expiry, expired: true)) == [.startRefresh])
        _ = timers.handle(.refreshStarted)
        let last = timers.handle(
            .refreshFailed(
                VaultError(.networkError, "HTTP 503"), retryAfter: nil, random: 0, now: expiry, expired: true))
        #expect(last.last == .end(reason: "tokenExpired", kind: .tokenExpired))
    }
}
