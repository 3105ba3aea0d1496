import Glibc
import VaultCore

/// How a subscription outlives a restart of vaultd: when its connection ends,
/// it connects again after `firstDelaySeconds`, then twice as long after each
/// failed attempt, at most `maxDelaySeconds` apart, and subscribes again with
/// the same filters. One schedule for the client library's streams and for
/// `vaultctl watch` and `vaultctl exec`.
public struct ReconnectPolicy: Sendable, Equatable {
    /// The wait before the first attempt, in seconds.
    public var firstDelaySeconds: Double
    /// The longest wait between two attempts, in seconds.
    public var maxDelaySeconds: Double
    /// How many attempts in a row may fail before the stream gives up and
    /// ends; nil keeps trying for as long as the stream is read.
    public var maxAttempts: Int?

    /// 1 s, doubling to 30 s, without end: what vaultctl does.
    public static let standard = ReconnectPolicy()

    /// A policy; the defaults are `standard`'s.
    public init(firstDelaySeconds: Double = 1, maxDelaySeconds: Double = 30, maxAttempts: Int? = nil) {
        self.firstDelaySeconds = max(0, firstDelaySeconds)
        self.maxDelaySeconds = max(self.firstDelaySeconds, maxDelaySeconds)
        self.maxAttempts = maxAttempts
    }

    /// The wait before attempt `attempt` (1 for the first after the loss), in seconds.
    public func delaySeconds(beforeAttempt attempt: Int) -> Double {
        var delay = firstDelaySeconds
        // Bounded: at most `attempt` doublings, and it stops at the cap.
        for _ in 1..<max(1, attempt) where delay < maxDelaySeconds { delay *= 2 }
        return min(delay, maxDelaySeconds)
    }

    /// Whether a failed (re)subscription is worth another attempt: vaultd
    /// was away, starting, stopping or busy. An error that another attempt
    /// would meet again (access denied, a bad filter, a socket someone else
    /// serves) is not.
    public static func isWorthRetrying(_ error: VaultClientError) -> Bool {
        switch error {
        case .client(.untrustedPeer): return false
        case .client: return true
        case .unexpectedReply: return false
        case .reply(let reply):
            guard let code = reply.vaultCode else { return false }
            return retriedCodes.contains(code)
        }
    }

    /// The error codes that say "not now" rather than "not this".
    static let retriedCodes: Set<VaultError.Code> = [
        .internalError, .subscriberTooSlow, .tooManySubscriptions, .tooManyConnections, .storeUnavailable,
        .storeLocked,
    ]
}

/// Attempts to reconnect on `policy`'s schedule, with time as an input: the
/// caller says when the connection was lost and when an attempt failed, and
/// asks when the next one is due. `vaultctl exec` polls on it alongside its
/// child; the client library's streams wait on it.
public struct ReconnectSchedule: Sendable, Equatable {
    /// The schedule's policy.
    public let policy: ReconnectPolicy
    /// Attempts made since the connection was lost.
    public private(set) var failedAttempts = 0
    /// When the next attempt is due (milliseconds of `CLOCK_MONOTONIC`); nil when connected.
    public private(set) var nextAttemptAt: UInt64?

    /// A schedule on `policy`, connected.
    public init(policy: ReconnectPolicy = .standard) { self.policy = policy }

    /// The connection was lost at `now`: the first attempt is due after the first delay.
    public mutating func lost(now: UInt64) {
        failedAttempts = 0
        nextAttemptAt = now + Self.milliseconds(policy.delaySeconds(beforeAttempt: 1))
    }

    /// An attempt failed at `now`: the next is due after a longer delay. False
    /// when the policy allows no more attempts.
    @discardableResult
    public mutating func failed(now: UInt64) -> Bool {
        failedAttempts += 1
        if let most = policy.maxAttempts, failedAttempts >= most {
            nextAttemptAt = nil
            return false
        }
        nextAttemptAt = now + Self.milliseconds(policy.delaySeconds(beforeAttempt: failedAttempts + 1))
        return true
    }

    /// An attempt succeeded: connected again.
    public mutating func connected() {
        failedAttempts = 0
        nextAttemptAt = nil
    }

    /// How long to wait at `now` before the next attempt, in milliseconds
    /// (a poll timeout): -1 when none is due.
    public func waitMilliseconds(now: UInt64) -> Int32 {
        guard let at = nextAttemptAt else { return -1 }
        return at > now ? Int32(min(at - now, 60_000)) : 0
    }

    /// Whether an attempt is due at `now`.
    public func isDue(now: UInt64) -> Bool {
        guard let at = nextAttemptAt else { return false }
        return now >= at
    }

    static func milliseconds(_ seconds: Double) -> UInt64 { UInt64((seconds * 1000).rounded()) }

    /// Now, in milliseconds of `CLOCK_MONOTONIC`: the clock the schedule's times are on.
    public static func now() -> UInt64 {
        var now = timespec()
        clock_gettime(CLOCK_MONOTONIC, &now)
        return UInt64(now.tv_sec) * 1000 + UInt64(now.tv_nsec) / 1_000_000
    }
}
