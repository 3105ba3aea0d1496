import Testing
import VaultCore

private let now = UnixTime(seconds: 1_700_000_000)

/// A one-hour token issued at `issuedAt`, refreshable, with a 60 s `MinRefreshInterval=`.
private func facts(
    issuedAt: UnixTime = now.adding(seconds: -3000), lifetime: Int64? = 3600, lastRefreshAt: UnixTime? = nil,
    canRefresh: Bool = true
) -> TokenHandout.Facts {
    TokenHandout.Facts(
        account: Fixtures.account, expiresAt: lifetime.map { issuedAt.adding(seconds: $0) }, issuedAt: issuedAt,
        lastRefreshAt: lastRefreshAt, canRefresh: canRefresh, minRefreshIntervalSeconds: 60)
}

/// The error of a refusal, or nil.
private func refusal(_ decision: TokenHandout.Decision) -> VaultError? {
    if case .refuse(let error) = decision { return error }
    return nil
}

@Suite("TokenHandout", .timeLimit(.minutes(5)))
struct TokenHandoutTests {
    @Test("Should serve a token valid longer than asked for, or one without an expiry")
    func serve_whenValidLongEnough() {
        // 600 s left.
        #expect(TokenHandout.decide(facts(), minValidSeconds: 0, now: now) == .serve)
        #expect(TokenHandout.decide(facts(), minValidSeconds: 599, now: now) == .serve)
        #expect(TokenHandout.decide(facts(lifetime: nil), minValidSeconds: 1_000_000, now: now) == .serve)
        // Even when the provider could not refresh it.
        #expect(TokenHandout.decide(facts(canRefresh: false), minValidSeconds: 30, now: now) == .serve)
    }

    @Test("Should refresh first a token that expires within the time asked for")
    func refreshFirst_whenTooShort() {
        #expect(TokenHandout.decide(facts(), minValidSeconds: 600, now: now) == .refreshFirst, "exactly at the edge")
        #expect(TokenHandout.decide(facts(), minValidSeconds: 900, now: now) == .refreshFirst)
        let expired = facts(issuedAt: now.adding(seconds: -4000))
        #expect(TokenHandout.decide(expired, minValidSeconds: 0, now: now) == .refreshFirst)
    }

    @Test("Should refuse without a request when the provider cannot refresh")
    func refuse_whenCannotRefresh() throws {
        let soon = try #require(refusal(TokenHandout.decide(facts(canRefresh: false), minValidSeconds: 900, now: now)))
        #expect(soon.code == .tokenExpired)
        #expect(soon.message.contains("before the 900s asked for"))
        #expect(soon.message.contains("log in again"))

        let gone = facts(issuedAt: now.adding(seconds: -4000), canRefresh: false)
        let expired = try #require(refusal(TokenHandout.decide(gone, minValidSeconds: 0, now: now)))
        #expect(expired.code == .tokenExpired)
        #expect(expired.message.contains("expired at \(now.adding(seconds: -400))"))
    }

    @Test("Should refresh first when more than the lifetime is asked for and no refresh told the lifetime yet")
    func refreshFirst_whenLifetimeUnknown() {
        #expect(TokenHandout.decide(facts(), minValidSeconds: 3600, now: now) == .refreshFirst)
        #expect(TokenHandout.decide(facts(), minValidSeconds: 100_000, now: now) == .refreshFirst)
    }

    @Test("Should refuse without a request when at least the known lifetime is asked for")
    func refuse_whenAskingForTheLifetime() throws {
        // Refreshed long ago: MinRefreshInterval= is no obstacle, the lifetime is.
        let known = facts(lastRefreshAt: now.adding(seconds: -3000))
        for asked: Int64 in [3600, 7200] {
            let error = try #require(refusal(TokenHandout.decide(known, minValidSeconds: asked, now: now)))
            #expect(error.code == .tokenExpired)
            #expect(error.message.contains("lives 3600s, and \(asked)s were asked for"))
        }
        #expect(TokenHandout.decide(known, minValidSeconds: 3599, now: now) == .refreshFirst)
        // Even once the token expired: no refresh can give what is asked.
        let expired = facts(issuedAt: now.adding(seconds: -4000), lastRefreshAt: now.adding(seconds: -4000))
        let error = try #require(refusal(TokenHandout.decide(expired, minValidSeconds: 3600, now: now)))
        #expect(error.message.contains("lives 3600s"))
    }

    @Test("Should refuse within MinRefreshInterval= of the last refresh while the token is valid")
    func refuse_withinMinRefreshInterval() throws {
        // A 100 s token refreshed 30 s ago; 90 s asked for, 70 s left.
        let recent = facts(issuedAt: now.adding(seconds: -30), lifetime: 100, lastRefreshAt: now.adding(seconds: -30))
        let error = try #require(refusal(TokenHandout.decide(recent, minValidSeconds: 90, now: now)))
        #expect(error.code == .tokenExpired)
        #expect(error.message.contains("MinRefreshInterval="))
        #expect(error.message.contains("refreshed at \(now.adding(seconds: -30))"))
        // The interval over (exactly 60 s later), the refresh may go ahead.
        let later = now.adding(seconds: 30)
        #expect(TokenHandout.decide(recent, minValidSeconds: 50, now: later) == .refreshFirst)
    }

    @Test("Should refresh first an expired token even within MinRefreshInterval=")
    func refreshFirst_whenExpiredWithinInterval() {
        // A 10 s token refreshed 20 s ago has expired; the interval does not hold it back.
        let expired = facts(issuedAt: now.adding(seconds: -20), lifetime: 10, lastRefreshAt: now.adding(seconds: -20))
        #expect(TokenHandout.decide(expired, minValidSeconds: 0, now: now) == .refreshFirst)
        // At the very second of expiry it counts as expired.
        let edge = facts(issuedAt: now.adding(seconds: -10), lifetime: 10, lastRefreshAt: now.adding(seconds: -10))
        #expect(TokenHandout.decide(edge, minValidSeconds: 0, now: now) == .refreshFirst)
    }
}
