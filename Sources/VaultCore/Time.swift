import Varlink

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

    /// The time as messages show it: ISO 8601 in UTC (`2026-11-30T19:02:37Z`),
    /// or `@SECONDS` outside years 1970 to 9999.
    public var description: String { iso8601 ?? "@\(seconds)" }

    /// ISO 8601 in UTC, for times from the epoch to `latestExpiry`; nil outside.
    public var iso8601: String? {
        guard seconds >= 0, seconds <= UnixTime.latestExpiry.seconds else { return nil }
        let days = seconds / 86400
        let secondOfDay = seconds % 86400
        // Days since the epoch to a civil date (proleptic Gregorian calendar),
        // counting from 0000-03-01 so that the leap day ends each year.
        let shifted = days + 719_468
        let era = shifted / 146_097
        let dayOfEra = shifted - era * 146_097
        let yearOfEra = (dayOfEra - dayOfEra / 1460 + dayOfEra / 36524 - dayOfEra / 146_096) / 365
        let dayOfYear = dayOfEra - (365 * yearOfEra + yearOfEra / 4 - yearOfEra / 100)
        let monthIndex = (5 * dayOfYear + 2) / 153
        let day = dayOfYear - (153 * monthIndex + 2) / 5 + 1
        let month = monthIndex < 10 ? monthIndex + 3 : monthIndex - 9
        let year = yearOfEra + era * 400 + (month <= 2 ? 1 : 0)
        func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let hour = secondOfDay / 3600
        let minute = secondOfDay / 60 % 60
        let second = secondOfDay % 60
        let paddedYear = String(repeating: "0", count: max(0, 4 - String(year).count)) + String(year)
        return "\(paddedYear)-\(two(month))-\(two(day))T\(two(hour)):\(two(minute)):\(two(second))Z"
    }
}

/// Deadlines in wall-clock seconds, at most one per key: the session
/// manager's timers.
public typealias DeadlineQueue<Key: Hashable & Sendable> = DeadlineHeap<Key, UnixTime>

/// The source of "now" for the domain. Injected so that tests can move time by hand.
public protocol WallClock: Sendable {
    /// The current time.
    func now() -> UnixTime
    /// The current time in seconds with a fraction, for timers that must not
    /// wake up to a second late.
    func preciseNow() -> Double
}

extension WallClock {
    /// Whole seconds, for clocks that know no better.
    public func preciseNow() -> Double { Double(now().seconds) }

    /// Now rounded up to a whole second: the start of a wait that must last
    /// at least its seconds. Deadlines count whole seconds, so one counted
    /// from `now()`, rounded down, could come up to a second early.
    public func nextSecond() -> UnixTime { UnixTime(seconds: Int64(preciseNow().rounded(.up))) }
}
