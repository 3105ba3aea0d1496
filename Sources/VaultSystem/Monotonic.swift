import Glibc

/// Milliseconds of CLOCK_MONOTONIC, for deadlines that wall-clock jumps cannot move.
public enum Monotonic {
    /// The monotonic clock now, in milliseconds.
    @inlinable public static func milliseconds() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1000 + UInt64(ts.tv_nsec) / 1_000_000
    }
}
