import Testing
import VaultCore

/// The pure parts of bounding provider traffic (issue 28): each user's token
/// bucket, the revocation queue's pacing and cap, and when a client-asked
/// refresh may go. Time is an input throughout.
@Suite("Provider traffic", .timeLimit(.minutes(1)))
struct ProviderTrafficTests {
    func t(_ seconds: Int64) -> UnixTime { UnixTime(seconds: seconds) }
    let account = Account(provider: "oauth", user: "alice")

    // MARK: ProviderBudget

    @Test("Should let a uid make a burst of requests, then one each refill, and say when the next may go")
    func bucketBurstThenRate() {
        var budget = ProviderBudget(.init(perMinute: 30, burst: 10))
        for _ in 0..<10 { #expect(budget.take(1000, now: 100) == nil) }
        let retryAt = budget.take(1000, now: 100)
        #expect(retryAt == 102, "one request every 2 s at 30 a minute")
        #expect(budget.take(1000, now: 101.9) != nil)
        #expect(budget.take(1000, now: 102) == nil)
        #expect(budget.take(1000, now: 102) == 104)
    }

    @Test("Should keep each uid's bucket apart, and refill a bucket to its burst only")
    func bucketsPerUid() {
        var budget = ProviderBudget(.init(perMinute: 60, burst: 2))
        #expect(budget.take(1, now: 0) == nil)
        #expect(budget.take(1, now: 0) == nil)
        #expect(budget.take(1, now: 0) != nil)
        #expect(budget.take(2, now: 0) == nil, "another user is not held to the first one's spending")
        // An hour idle refills two, not 3600.
        #expect(budget.take(1, now: 3600) == nil)
        #expect(budget.take(1, now: 3600) == nil)
        #expect(budget.take(1, now: 3600) != nil)
    }

    @Test("Should bound what a whole minute of asking gets to the burst plus the rate")
    func bucketOverAMinute() {
        var budget = ProviderBudget()
        var granted = 0
        for step in 0..<6000 where budget.take(7, now: Double(step) / 100) == nil { granted += 1 }
        #expect(granted <= 10 + 30, "\(granted) in 60 s")
        #expect(granted >= 10 + 29)
    }

    @Test("Should not limit at ProviderRequestsPerMinute=0, and cut a bucket to a smaller burst on reload")
    func bucketSettings() {
        var budget = ProviderBudget(.init(perMinute: 0, burst: 1))
        for _ in 0..<1000 { #expect(budget.take(1, now: 0) == nil) }
        budget = ProviderBudget(.init(perMinute: 60, burst: 10))
        #expect(budget.take(1, now: 0) == nil)
        budget.configure(.init(perMinute: 60, burst: 2))
        #expect(budget.take(1, now: 0) == nil)
        #expect(budget.take(1, now: 0) == nil)
        #expect(budget.take(1, now: 0) != nil)
    }

    @Test("Should forget buckets that refilled, so that the table holds recent users only")
    func bucketsForgotten() {
        var budget = ProviderBudget(.init(perMinute: 60, burst: 1))
        for uid in 0..<1000 { _ = budget.take(UInt32(uid), now: 0) }
        _ = budget.take(5000, now: 10)
        #expect(budget.tracked <= 1)
    }

    @Test("Should name the limits and the retry time in a refusal")
    func bucketRefusal() {
        let error = ProviderBudget().refusal("the refresh of alice @ oauth", retryAt: 1_800_000_000.2)
        #expect(error.code == .tooManyProviderRequests)
        #expect(error.retryAt == t(1_800_000_001))
        #expect(error.message.contains("ProviderRequestsPerMinute=30"))
        #expect(error.message.contains("ProviderRequestBurst=10"))
    }

    // MARK: RevocationQueue

    @Test("Should send queued revocations one at a time, at most four a second in all")
    func queueSpacing() {
        var queue = RevocationQueue()
        for i in 0..<100 { queue.add("r\(i)", owner: 1000, bytes: 100, now: 0) }
        var now = 0.0
        var sent = 0
        // Every attempt fails: the whole queue's requests in 10 s.
        for _ in 0..<10_000 {
            guard let (id, at) = queue.next() else { break }
            now = max(now, at)
            guard now < 10 else { break }
            queue.sent(id, now: now)
            queue.failed(id, random: 0.5, now: now)
            sent += 1
        }
        #expect(sent <= 41, "\(sent) requests in 10 s")
        #expect(sent >= 39)
    }

    @Test("Should retry a failed revocation after the refreshes' backoff, growing with its failures")
    func queueBackoff() {
        var queue = RevocationQueue()
        queue.add("r", owner: 1000, bytes: 10, now: 0)
        var now = 0.0
        var times: [Double] = []
        for _ in 0..<6 {
            let (id, at) = queue.next()!
            now = at
            times.append(now)
            queue.sent(id, now: now)
            queue.failed(id, random: 0.99, now: now)
        }
        let waits = zip(times.dropFirst(), times).map { $0 - $1 }
        #expect(waits == [2, 4, 8, 16, 32].map(Double.init), "\(waits)")
        queue.remove("r")
        #expect(queue.next() == nil)
    }

    @Test("Should hold a revocation back until its owner's budget allows, without counting a failure")
    func queuePostpone() {
        var queue = RevocationQueue()
        queue.add("r", owner: 1000, bytes: 10, now: 0)
        queue.postpone("r", until: 7)
        #expect(queue.next()?.at == 7)
        #expect(queue["r"]?.failures == 0)
    }

    @Test("Should count queued revocations with the owner's sessions, refuse the login past the cap, not root's")
    func queueCap() {
        var limits = UserLimits()
        limits.sessionsPerUser = 5
        limits.sessionBytes = 1000
        var queue = RevocationQueue()
        #expect(queue.refusal(owner: 1000, sessions: 4, limits: limits) == nil, "no revocation queued")
        for i in 0..<3 { queue.add("r\(i)", owner: 1000, bytes: 500, now: 0) }
        queue.add("other", owner: 2000, bytes: 500, now: 0)
        #expect(queue.queued(by: 1000) == (3, 1500))
        #expect(queue.refusal(owner: 1000, sessions: 1, limits: limits) == nil, "1 + 3 + 1 = 5")
        let refusal = queue.refusal(owner: 1000, sessions: 2, limits: limits)
        #expect(refusal?.code == .tooManyRevocations)
        #expect(refusal?.message.contains("MaxSessionsPerUser=") == true)
        #expect(queue.refusal(owner: 2000, sessions: 3, limits: limits) == nil)
        #expect(queue.refusal(owner: 0, sessions: 100, limits: limits) == nil, "root is not limited")
        // Bytes: three revocations of 1500 bytes each leave no room for a 1000-byte session.
        var big = RevocationQueue()
        for i in 0..<3 { big.add("b\(i)", owner: 1000, bytes: 1500, now: 0) }
        #expect(big.refusal(owner: 1000, sessions: 0, limits: limits)?.code == .tooManyRevocations)
    }

    // MARK: ClientRefresh

    func status(lastAttemptAt: Int64?, nextRetryAt: Int64? = nil) -> RefreshStatus {
        var status = RefreshStatus()
        status.lastAttemptAt = lastAttemptAt.map(t)
        status.nextRetryAt = nextRetryAt.map(t)
        status.consecutiveFailures = nextRetryAt == nil ? 0 : 1
        return status
    }

    @Test("Should refuse a client's refresh during the backoff, expired or not, with the backoff's end")
    func clientRefreshBackoff() {
        for expired in [false, true] {
            let refusal = ClientRefresh.refusal(
                account, status: status(lastAttemptAt: 100, nextRetryAt: 220), expired: expired,
                minIntervalSeconds: 0, now: t(150))
            #expect(refusal?.code == .refreshBackingOff)
            #expect(refusal?.retryAt == t(220))
        }
        #expect(
            ClientRefresh.refusal(
                account, status: status(lastAttemptAt: 100, nextRetryAt: 220), expired: false, minIntervalSeconds: 0,
                now: t(220)) == nil)
    }

    @Test("Should count a failed attempt toward MinRefreshInterval=, and waive it for an expired token")
    func clientRefreshInterval() {
        let failed = status(lastAttemptAt: 100, nextRetryAt: 102)
        let refusal = ClientRefresh.refusal(
            account, status: failed, expired: false, minIntervalSeconds: 60, now: t(101))
        #expect(refusal?.code == .refreshTooSoon, "the later of the two ends decides")
        #expect(refusal?.retryAt == t(160))
        #expect(
            ClientRefresh.refusal(account, status: failed, expired: false, minIntervalSeconds: 60, now: t(160)) == nil)
        #expect(
            ClientRefresh.refusal(account, status: failed, expired: true, minIntervalSeconds: 60, now: t(130)) == nil)
        #expect(
            ClientRefresh.refusal(
                account, status: status(lastAttemptAt: nil), expired: false, minIntervalSeconds: 60, now: t(0)) == nil)
    }

    @Test("Should keep a backoff after a failed refresh of a token that does not expire, with no timer")
    func noExpiryBackoff() {
        var timers = SessionTimers()
        let facts = SessionTimers.Facts(
            expiresAt: nil, refreshedAt: t(0), createdAt: t(0), canRefresh: true, maxLifetimeSeconds: nil, jitter: 0)
        _ = timers.handle(.stored(facts, now: t(0)))
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(
            .refreshFailed(
                VaultError(.networkError, "HTTP 500"), retryAfter: 120, random: 0, now: t(10), expired: false))
        #expect(!actions.contains { if case .schedule = $0 { true } else { false } }, "no scheduled retry")
        #expect(timers.status.nextRetryAt == t(130))
        #expect(timers.status.lastAttemptAt == t(10))
    }
}
