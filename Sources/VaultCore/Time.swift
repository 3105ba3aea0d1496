/// A point in wall-clock time, in whole seconds since the Unix epoch. Token
/// lifetimes (JWT `exp`, OAuth `expires_in`) are whole seconds, so is this.
public struct UnixTime: Sendable, Hashable, Comparable, CustomStringConvertible {
    /// Seconds since 1970-01-01T00:00:00Z.
    public var seconds: Int64

    /// Makes a time from seconds since the epoch.
    public init(seconds: Int64) { self.seconds = seconds }

    public static func < (lhs: UnixTime, rhs: UnixTime) -> Bool { lhs.seconds < rhs.seconds }

    /// This time moved by `delta` seconds.
    /// Saturates at the ends of the range instead of trapping: a time that far
    /// out means "never" either way.
    public func adding(seconds delta: Int64) -> UnixTime {
        let (sum, overflow) = seconds.addingReportingOverflow(delta)
        return UnixTime(seconds: overflow ? (delta > 0 ? .max : .min) : sum)
    }

    /// The latest time vaultd accepts as an expiry: 9999-12-31T23:59:59Z.
    public static let latestExpiry = UnixTime(seconds: 253_402_300_799)

    /// This time kept between the epoch and `latestExpiry`: for times read
    /// from storage, which a bug or another program may have written.
    public var clampedToSaneRange: UnixTime {
        UnixTime(seconds: min(max(seconds, 0), UnixTime.latestExpiry.seconds))
    }

    /// The longest a deadline timer sleeps at once: a day. A later deadline
    /// is armed again when the timer fires.
    public static let longestTimerMilliseconds: Int64 = 86_400_000

    /// The milliseconds a timer waits from `now` (seconds since the epoch,
    /// with a fraction) until `deadline`, rounded up and kept in
    /// 0...`longestTimerMilliseconds`, so that a deadline in year 9999 or at
    /// `Int64.max` seconds never overflows the conversion.
    public static func timerMilliseconds(until deadline: UnixTime, now: Double) -> Int64 {
        let delay = (Double(deadline.seconds) - now) * 1000
        guard delay > 0 else { return 0 }  // also NaN
        guard delay < Double(longestTimerMilliseconds) else { return longestTimerMilliseconds }
        return Int64(delay.rounded(.up))
    }

    public var description: String { "\(seconds)" }
}

/// The source of "now" for the domain. Injected so that tests can move time by hand.
public protocol WallClock: Sendable {
    /// The current time.
    func now() -> UnixTime
    /// The current time in seconds with a fraction, for timers that must not
    /// wake up to a second late.
    func preciseNow() -> Double
    /// Waits until `preciseNow()` reaches `deadline` (seconds since the epoch),
    /// or throws `CancellationError` when the waiting task is cancelled. A
    /// test clock returns when it is moved past the deadline.
    func sleep(until deadline: Double) async throws
}

extension WallClock {
    /// Whole seconds, for clocks that know no better.
    public func preciseNow() -> Double { Double(now().seconds) }

    /// Sleeps in real time, in steps of at most a day, until the deadline.
    public func sleep(until deadline: Double) async throws {
        for _ in 0..<4096 {
            let milliseconds = UnixTime.timerMilliseconds(
                until: UnixTime(seconds: Int64(min(max(deadline, 0), 1e15).rounded(.up))), now: preciseNow())
            if milliseconds == 0 { return }
            try await Task.sleep(for: .milliseconds(milliseconds))
        }
    }
}
