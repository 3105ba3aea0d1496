import CShim
import Glibc
import VaultCore
import VaultSystem

/// The one way vaultd runs blocking C calls (libsecret over D-Bus, libcurl,
/// fork/exec/waitpid of helpers): a fixed number of threads of vaultd's own
/// (never the cooperative pool, never libdispatch's global queues, which add
/// a thread a second without a cap while calls hang), admitted by a
/// `HelperAdmission`: at most `cap` runs of one lane at once, the others
/// waiting in that lane's FIFO queue until their deadline, which a timer
/// thread enforces. A run that waited past its deadline never starts.
///
/// Three executors of this kind: `helpers` for exec helper runs (one lane
/// per provider, `MaxConcurrentHelpers=`), `io` for HTTP requests (one lane
/// per host), and `store` for the secret store (one lane, one call at a
/// time), so that neither hanging helpers nor hanging token endpoints ever
/// hold the thread the store needs.
///
/// A run submitted inside `urgent(_:)` goes ahead of every waiting run but
/// the urgent ones before it: the write of tokens a refresh got (the server
/// has rotated the refresh token; until the write lands a crash loses it)
/// waits for the store call in progress only.
package final class BlockingExecutor: @unchecked Sendable {
    /// The executor exec helpers run on, started on first use.
    static let helpers = BlockingExecutor(workers: 8, name: "helpers")
    /// The executor HTTP requests run on, started on first use.
    package static let io = BlockingExecutor(workers: 4, name: "io")
    /// The executor the secret store runs on (one call at a time), started on first use.
    static let store = BlockingExecutor(workers: 1, name: "store")
    /// The executor token files are written on (one write at a time), started on first use.
    static let files = BlockingExecutor(workers: 1, name: "files")

    /// Set by `urgent(_:)` for the runs its body submits.
    @TaskLocal private static var isUrgent = false

    /// Runs `body`, whose runs on any executor go ahead of the waiting ones
    /// (behind earlier urgent ones). For a write that must not wait behind
    /// others; the caller makes sure no earlier write it must follow is queued.
    static func urgent<T: Sendable>(_ body: () async -> T) async -> T {
        await $isUrgent.withValue(true) { await body() }
    }

    /// One run: `start` runs it on a worker, `expire` reports that its
    /// deadline passed while it waited. Exactly one of them is called.
    private struct Job {
        var start: @Sendable () -> Void
        var expire: @Sendable () -> Void
    }

    // Guarded by `mutex`.
    private var admission: HelperAdmission<UInt64>
    private var jobs: [UInt64: Job] = [:]
    private var ready: [UInt64] = []
    private var lastTicket: UInt64 = 0

    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    /// Signalled when a run is ready for a worker.
    private let readyCondition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    /// Signalled when a run starts waiting (the timer's nearest deadline may be earlier).
    private let timerCondition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    /// A pool of `workers` threads and a timer thread, started now; `comm`
    /// shows them as `name` with the worker's number, and `name-timer`.
    init(workers: Int, name: String = "blocking") {
        admission = HelperAdmission(workers: workers)
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        // Deadlines are CLOCK_MONOTONIC milliseconds, as `Monotonic` reads them.
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(readyCondition, &attributes)
        pthread_cond_init(timerCondition, &attributes)
        pthread_condattr_destroy(&attributes)
        for index in 0..<admission.workers {
            BlockingExecutor.startThread("\(name)\(index)") { [self] in workerLoop() }
        }
        BlockingExecutor.startThread("\(name)-timer") { [self] in timerLoop() }
    }

    /// Runs `work` on a worker once `lane` has fewer than `cap` runs going
    /// and a worker is free; nil when `deadline` (CLOCK_MONOTONIC
    /// milliseconds) passed first, the run never started.
    package func run<T: Sendable>(lane: String, cap: Int, deadline: UInt64, _ work: @escaping @Sendable () -> T) async
        -> T?
    {
        let urgent = BlockingExecutor.isUrgent
        return await withCheckedContinuation { (continuation: CheckedContinuation<T?, Never>) in
            submit(
                lane: lane, cap: cap, deadline: deadline, urgent: urgent,
                Job(start: { continuation.resume(returning: work()) }, expire: { continuation.resume(returning: nil) }))
        }
    }

    /// Runs `work` on a worker as `run(lane:cap:deadline:_:)` does, without
    /// waiting for it: for a caller that must not wait (the session manager
    /// publishing a change). `expired` is called instead when `deadline`
    /// passed while the run waited.
    func enqueue(
        lane: String, cap: Int, deadline: UInt64, _ work: @escaping @Sendable () -> Void,
        expired: @escaping @Sendable () -> Void
    ) {
        submit(lane: lane, cap: cap, deadline: deadline, urgent: false, Job(start: work, expire: expired))
    }

    private func submit(lane: String, cap: Int, deadline: UInt64, urgent: Bool, _ job: Job) {
        pthread_mutex_lock(mutex)
        lastTicket += 1
        let ticket = lastTicket
        jobs[ticket] = job
        makeReady(admission.arrive(ticket, provider: lane, cap: cap, deadline: deadline, urgent: urgent))
        pthread_cond_signal(timerCondition)
        pthread_mutex_unlock(mutex)
    }

    /// With the mutex held.
    private func makeReady(_ tickets: [UInt64]) {
        guard !tickets.isEmpty else { return }
        ready.append(contentsOf: tickets)
        pthread_cond_broadcast(readyCondition)
    }

    private func workerLoop() {
        pthread_mutex_lock(mutex)
        while true {
            while ready.isEmpty { pthread_cond_wait(readyCondition, mutex) }
            let ticket = ready.removeFirst()
            let job = jobs.removeValue(forKey: ticket)
            pthread_mutex_unlock(mutex)
            job?.start()
            pthread_mutex_lock(mutex)
            makeReady(admission.finished(ticket))
        }
    }

    private func timerLoop() {
        pthread_mutex_lock(mutex)
        while true {
            let expired = admission.expire(now: Monotonic.milliseconds()).compactMap { jobs.removeValue(forKey: $0) }
            if !expired.isEmpty {
                pthread_mutex_unlock(mutex)
                for job in expired { job.expire() }
                pthread_mutex_lock(mutex)
                continue
            }
            guard let deadline = admission.nextDeadline else {
                pthread_cond_wait(timerCondition, mutex)
                continue
            }
            var until = timespec(tv_sec: Int(deadline / 1000), tv_nsec: Int(deadline % 1000) * 1_000_000)
            _ = pthread_cond_timedwait(timerCondition, mutex, &until)
        }
    }

    /// Starts a detached thread named `name` (at most 15 bytes) running `body`.
    private static func startThread(_ name: String, _ body: @escaping @Sendable () -> Void) {
        final class Box {
            let name: String
            let body: @Sendable () -> Void
            init(_ name: String, _ body: @escaping @Sendable () -> Void) {
                self.name = name
                self.body = body
            }
        }
        let context = Unmanaged.passRetained(Box(name, body)).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(
            &thread, nil,
            { context in
                let box = Unmanaged<Box>.fromOpaque(context!).takeRetainedValue()
                vaultd_set_thread_name(box.name)
                box.body()
                return nil
            }, context)
        precondition(status == 0, "pthread_create failed for \(name): errno \(status)")
        pthread_detach(thread)
    }
}
