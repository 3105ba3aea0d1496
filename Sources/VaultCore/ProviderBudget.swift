/// How many provider requests (logins that present or mint tokens,
/// refreshes a client asked for, revocations) each local user may cause: a
/// token bucket per uid, refilled at `perMinute` a minute up to `burst`. One
/// user must not be able to get vaultd's shared client credentials
/// rate-limited or banned at the provider, for every user of the host. Time
/// is an input (`now`, in seconds); nothing here reads a clock.
public struct ProviderBudget: Sendable, Equatable {
    /// `[Vault] ProviderRequestsPerMinute=` and `ProviderRequestBurst=`.
    public struct Settings: Sendable, Equatable {
        /// Requests a minute one uid's bucket refills with; 0: no limit.
        public var perMinute: Int
        /// The most requests one uid may make at once (the bucket's size).
        public var burst: Int

        /// The settings.
        public init(perMinute: Int = 30, burst: Int = 10) {
            self.perMinute = perMinute
            self.burst = burst
        }
    }

    /// One uid's bucket: the requests it may make, as of `at`.
    struct Bucket: Sendable, Equatable {
        var tokens: Double
        var at: Double
    }

    /// The limits.
    public private(set) var settings: Settings
    private var buckets: [UInt32: Bucket] = [:]

    /// Full buckets for everyone.
    public init(_ settings: Settings = Settings()) { self.settings = settings }

    /// New limits (a reload); a bucket holds at most the new burst.
    public mutating func configure(_ settings: Settings) {
        self.settings = settings
        for uid in buckets.keys { buckets[uid]!.tokens = min(buckets[uid]!.tokens, Double(settings.burst)) }
    }

    /// Takes one request from `uid`'s bucket at `now`: nil when it may go,
    /// else when the next one may (the bucket is left as it was).
    public mutating func take(_ uid: UInt32, now: Double) -> Double? {
        guard settings.perMinute > 0 else { return nil }
        let rate = Double(settings.perMinute) / 60
        let burst = Double(max(settings.burst, 1))
        var bucket = buckets[uid] ?? Bucket(tokens: burst, at: now)
        bucket.tokens = min(burst, bucket.tokens + max(0, now - bucket.at) * rate)
        bucket.at = max(bucket.at, now)
        guard bucket.tokens >= 1 else {
            buckets[uid] = bucket
            return bucket.at + (1 - bucket.tokens) / rate
        }
        bucket.tokens -= 1
        buckets[uid] = bucket
        forgetFull(now: now)
        return nil
    }

    /// Uids whose buckets are tracked (full ones are forgotten).
    public var tracked: Int { buckets.count }

    /// Drops buckets that have refilled by `now`: a full bucket is the same
    /// as none, and the table stays as small as the users recently active.
    private mutating func forgetFull(now: Double) {
        guard buckets.count > 64 else { return }
        let rate = Double(settings.perMinute) / 60
        let burst = Double(max(settings.burst, 1))
        buckets = buckets.filter { $0.value.tokens + max(0, now - $0.value.at) * rate < burst }
    }

    /// The refusal of a request `uid` may not make before `retryAt`.
    public func refusal(_ what: String, retryAt: Double) -> VaultError {
        let at = UnixTime(seconds: Int64(retryAt.rounded(.up)))
        var error = VaultError(
            .tooManyProviderRequests,
            "\(what) was not sent: this user made as many provider requests as one user may (ProviderRequestsPerMinute=\(settings.perMinute), ProviderRequestBurst=\(settings.burst)); try again from \(at) on"
        )
        error.retryAt = at
        return error
    }
}
