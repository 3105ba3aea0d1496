import Glibc

/// A lock around a value whose waiters sleep at once: glibc's default
/// mutex, without spinning and without priority inheritance. For state
/// that every serving loop reads at every call (the session table, the
/// access policy, the audit counts): with more loops than CPUs, a holder
/// is often preempted, and `Synchronization.Mutex`, which spins before it
/// sleeps on a priority-inheriting futex, then burns the waiter's CPU
/// (measured: 8 loops on 2 CPUs spent 70% of vaultd's CPU spinning).
/// GetToken's targets at 32 connections need it: with `Mutex` in its place
/// vaultd answered 0.14x the C floor's req/s at 5.5x its CPU per call, p99
/// 7.5 ms (docs/BENCHMARKS.md, "GetToken at 32 connections").
///
/// The value is reached only through `withLock`; its storage never moves.
public final class SleepingMutex<Value>: @unchecked Sendable {
    private let mutex: UnsafeMutablePointer<pthread_mutex_t>
    @exclusivity(unchecked) private var value: Value

    /// A lock holding `value`.
    public init(_ value: Value) {
        mutex = .allocate(capacity: 1)
        pthread_mutex_init(mutex, nil)
        self.value = value
    }

    deinit {
        pthread_mutex_destroy(mutex)
        mutex.deallocate()
    }

    /// Runs `body` with the value, the lock held; `body` must not take this
    /// lock again.
    @inline(__always)
    public func withLock<Result, Failure: Error>(_ body: (inout Value) throws(Failure) -> Result) throws(Failure)
        -> Result
    {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return try body(&value)
    }
}
