import CShim
import Glibc
import VaultCore
import VaultSystem

/// The one way vaultd runs blocking C calls (libsecret over D-Bus, SQLite,
/// libcurl, fork/exec/waitpid of helpers, token-file writes): one pool of
/// threads of vaultd's own (never the cooperative pool, never libdispatch's
/// global queues, which add a thread a second without a cap while calls
/// hang), admitted by a `WorkAdmission`. Each `Kind` of work has workers of
/// its own, so that neither hanging helpers nor hanging token endpoints ever
/// hold the thread the store needs; within a kind, at most `cap` runs of one
/// lane at once, the others waiting in that lane's FIFO queue until their
/// deadline, which a timer thread enforces. A run that waited past its
/// deadline never starts.
///
/// Threads start as runs need them, up to the workers of all kinds, and the
/// timer thread when a run has to wait; each ends after 10 s with nothing to
/// do, so an idle vaultd has none.
///
/// A run submitted inside `urgent(_:)` goes ahead of every waiting run of its
/// kind but the urgent ones before it: the write of tokens a refresh got (the
/// server has rotated the refresh token; until the write lands a crash loses
/// it) waits for the store call in progress only.
package final class WorkerPool: @unchecked Sendable {
    /// What a run does; each kind has workers of its own.
    package enum Kind: Hashable, Sendable {
        /// Exec helper runs, a lane per provider (`MaxConcurrentHelpers=`).
        case helper
        /// HTTP requests (token endpoints, etcd), a lane per host.
        case http
        /// Secret store calls, one at a time.
        case store
        /// Token-file writes, one at a time.
        case file
    }

    /// vaultd's pool: 8 helper workers, 4 for HTTP, 1 for the store, 1 for token files.
    package static let shared = WorkerPool(workers: [.helper: 8, .http: 4, .store: 1, .file: 1])

    /// Set by `urgent(_:)` for the runs its body submits.
    @TaskLocal private static var isUrgent = false

    /// Runs `body`, whose runs go ahead of the waiting ones of their kind
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
    private var admission: WorkAdmission<UInt64, Kind>
    private var jobs: [UInt64: Job] = [:]
    private var ready: [UInt64] = []
    private var lastTicket: UInt64 = 0
    /// Worker threads alive, and those of them running a job.
    private var threads = 0
    private var busy = 0
    private var timerStarted = false

    private let name: String
    /// How long a thread with nothing to do waits before it ends.
    private let lingerMilliseconds: UInt64
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    /// Signalled when a run is ready for a worker.
    private let readyCondition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    /// Signalled when a run starts waiting (the timer's nearest deadline may be earlier).
    private let timerCondition = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    /// A pool with `workers` threads of each kind at most; `comm` shows them
    /// as `name` with the worker's number, and `name-timer`.
    init(workers: [Kind: Int], name: String = "pool", lingerMilliseconds: UInt64 = 10_000) {
        admission = WorkAdmission(workers: workers)
        self.name = name
        self.lingerMilliseconds = lingerMilliseconds
        pthread_mutex_init(mutex, nil)
        var attributes = pthread_condattr_t()
        pthread_condattr_init(&attributes)
        // Deadlines are CLOCK_MONOTONIC milliseconds, as `Monotonic` reads them.
        pthread_condattr_setclock(&attributes, CLOCK_MONOTONIC)
        pthread_cond_init(readyCondition, &attributes)
        pthread_cond_init(timerCondition, &attributes)
        pthread_condattr_destroy(&attributes)
    }

    /// The threads alive: workers, and the timer when it runs.
    var threadsAlive: Int {
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
        return threads + (timerStarted ? 1 : 0)
    }

    /// Runs `work` on a worker of `kind` once `lane` has fewer than `cap`
    /// runs going and a worker of `kind` is free; nil when `deadline`
    /// (CLOCK_MONOTONIC milliseconds) passed first, the run never started.
    package func run<T: Sendable>(
        _ kind: Kind, lane: String, cap: Int, deadline: UInt64, _ work: @escaping @Sendable () -> T
    ) async -> T? {
        let urgent = WorkerPool.isUrgent
        return await withCheckedContinuation { (continuation: CheckedContinuation<T?, Never>) in
            submit(
                kind, lane: lane, cap: cap, deadline: deadline, urgent: urgent,
                Job(start: { continuation.resume(returning: work()) }, expire: { continuation.resume(returning: nil) }))
        }
    }

    /// Runs `work` as `run(_:lane:cap:deadline:_:)` does, without waiting
    /// for it: for a caller that must not wait (the session manager
    /// publishing a change). `expired` is called instead when `deadline`
    /// passed while the run waited.
    func enqueue(
        _ kind: Kind, lane: String, cap: Int, deadline: UInt64, _ work: @escaping @Sendable () -> Void,
        expired: @escaping @Sendable () -> Void
    ) {
        submit(kind, lane: lane, cap: cap, deadline: deadline, urgent: false, Job(start: work, expire: expired))
    }

    private func submit(_ kind: Kind, lane: String, cap: Int, deadline: UInt64, urgent: Bool, _ job: Job) {
        pthread_mutex_lock(mutex)
        lastTicket += 1
        let ticket = lastTicket
        jobs[ticket] = job
        let started = admission.arrive(ticket, kind: kind, lane: lane, cap: cap, deadline: deadline, urgent: urgent)
        makeReady(started)
        if started.isEmpty {
            if !timerStarted {
                timerStarted = true
                WorkerPool.startThread("\(name)-timer") { [self] in timerLoop() }
            }
            pthread_cond_signal(timerCondition)
        }
        pthread_mutex_unlock(mutex)
    }

    /// With the mutex held: hands `tickets` to the workers, starting threads
    /// while fewer are free than runs are ready (never more than the
    /// admission's workers: it starts no more runs than that).
    private func makeReady(_ tickets: [UInt64]) {
        guard !tickets.isEmpty else { return }
        ready.append(contentsOf: tickets)
        while threads - busy < ready.count, threads < admission.totalWorkers {
            threads += 1
            WorkerPool.startThread("\(name)\(threads - 1)") { [self] in workerLoop() }
        }
        pthread_cond_broadcast(readyCondition)
    }

    private func workerLoop() {
        pthread_mutex_lock(mutex)
        while true {
            while ready.isEmpty {
                // A run made ready as the wait timed out counted this worker
                // as free: it is taken, not left without a thread.
                if !waitLingering(on: readyCondition), ready.isEmpty {
                    threads -= 1
                    pthread_mutex_unlock(mutex)
                    return
                }
            }
            let ticket = ready.removeFirst()
            let job = jobs.removeValue(forKey: ticket)
            busy += 1
            pthread_mutex_unlock(mutex)
            job?.start()
            pthread_mutex_lock(mutex)
            busy -= 1
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
                if !waitLingering(on: timerCondition), admission.nextDeadline == nil {
                    timerStarted = false
                    pthread_mutex_unlock(mutex)
                    return
                }
                continue
            }
            var until = WorkerPool.time(deadline)
            _ = pthread_cond_timedwait(timerCondition, mutex, &until)
        }
    }

    /// With the mutex held: waits on `condition` for at most
    /// `lingerMilliseconds`; false when that time passed without a signal.
    private func waitLingering(on condition: UnsafeMutablePointer<pthread_cond_t>) -> Bool {
        var until = WorkerPool.time(Monotonic.milliseconds() + lingerMilliseconds)
        return pthread_cond_timedwait(condition, mutex, &until) != ETIMEDOUT
    }

    /// CLOCK_MONOTONIC `milliseconds` as the conditions' timed waits take them.
    private static func time(_ milliseconds: UInt64) -> timespec {
        timespec(tv_sec: Int(milliseconds / 1000), tv_nsec: Int(milliseconds % 1000) * 1_000_000)
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
