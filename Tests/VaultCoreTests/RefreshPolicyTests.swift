import Testing
import VaultCore

@Suite("RefreshPolicy", .timeLimit(.minutes(5)))
struct RefreshPolicyTests {
    func t(_ seconds: Int64) -> UnixTime { UnixTime(seconds: seconds) }

    @Test("Should refresh between 80% and 90% of the lifetime", arguments: [0.0, 0.25, 0.5, 0.999, 1.5, -1])
    func refreshWindow(jitter: Double) {
        let at = RefreshPolicy.refreshAt(issuedAt: t(1000), expiresAt: t(4600), jitter: jitter)
        #expect(at >= t(1000 + 2880))
        #expect(at <= t(1000 + 3240))
    }

    @Test("Should spread accounts issued together over the window, the same way every time")
    func jitterSpreads() {
        let accounts = (0..<1000).map { Account(provider: "p", user: "u\($0)") }
        let times = accounts.map {
            RefreshPolicy.refreshAt(issuedAt: t(0), expiresAt: t(3600), jitter: RefreshPolicy.jitter(for: $0)).seconds
        }
        #expect(Set(times).count > 200, "not one burst")
        #expect(RefreshPolicy.jitter(for: accounts[0]) == RefreshPolicy.jitter(for: accounts[0]))
    }

    @Test("Should back off with full jitter from 1 s up to 5 min, and honour Retry-After")
    func backoff() {
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0) == 1)
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0.99) == 2)
        #expect(RefreshPolicy.backoff(attempt: 3, random: 0.99) == 8)
        #expect((297...300).contains(RefreshPolicy.backoff(attempt: 30, random: 0.99)), "capped at 5 min")
        #expect(RefreshPolicy.backoff(attempt: 30, random: 0) == 1)
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0, retryAfter: 17) == 17)
    }

    @Test("Should spread the retries after one Retry-After over a quarter more, never before it")
    func retryAfterSpread() {
        let waits = (0..<100).map { RefreshPolicy.backoff(attempt: 1, random: Double($0) / 100, retryAfter: 40) }
        #expect(waits.allSatisfy { (40...50).contains($0) }, "\(waits)")
        #expect(Set(waits).count >= 10, "a thousand sessions turned away together come back over ten seconds")
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0.999, retryAfter: 3) == 3, "3 s leaves no whole second")
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0.999, retryAfter: .max) <= 4500)
    }
}
