import CShim
import Glibc
import Synchronization
import VaultCore

/// The thread that owns the session manager: vaultd's main thread, which
/// also serves the socket. The manager (an actor) runs every job of its own
/// here: a job is queued, the eventfd `wakeFD` becomes readable, and the main
/// thread runs the queue, from the serving loop (`pollFD` is one of its
/// epoll sources) or, before and after serving, from `run(until:)`. So the
/// sessions' state has one owner thread, the same as the connections', and
/// none of its work runs on the cooperative pool. Blocking calls never run
/// here: they go to `WorkerPool`, and their completions come back as jobs.
/// Other threads hand the manager a step with `post` (a reload read off
/// this thread, the store's health recorded by a failing call).
///
/// The engine's alarm is a timerfd on the real-time clock, set to the
/// manager's nearest deadline: when it expires, the owner thread runs the
/// alarm's action (`runDueWork`), as it runs the queued jobs.
final class EngineThread: SerialExecutor, @unchecked Sendable {
    /// What waits to run: the actor's jobs, and steps posted from other threads.
    private enum Work {
        case job(UnownedJob)
        case step(@Sendable () -> Void)
    }
    private let jobs = Mutex<[Work]>([])
    /// Readable while jobs wait to run.
    private let wakeFD: Int32
    /// Readable when the alarm expired or the clock was set.
    private let alarmFD: Int32
    /// An epoll set of the two: readable while there is something to run.
    let pollFD: Int32
    /// What the alarm runs; changed and run on the owner thread only.
    private var alarmAction: (() -> Void)?
    /// The thread running this engine's jobs now (0: none), for `checkIsolated`.
    private let runningThread = Atomic<UInt>(0)

    init() {
        wakeFD = vaultd_eventfd()
        alarmFD = vaultd_timerfd()
        pollFD = vaultd_epoll_create()
        precondition(wakeFD >= 0 && alarmFD >= 0 && pollFD >= 0, "eventfd, timerfd or epoll failed: errno \(errno)")
        _ = vaultd_epoll_add(pollFD, wakeFD, VAULTD_EPOLLIN, 0)
        _ = vaultd_epoll_add(pollFD, alarmFD, VAULTD_EPOLLIN, 1)
    }

    deinit {
        close(pollFD)
        close(alarmFD)
        close(wakeFD)
    }

    func enqueue(_ job: consuming ExecutorJob) { queue(.job(UnownedJob(job))) }

    /// Runs `step` on the owner thread, after the jobs and steps queued
    /// before it. Thread-safe.
    func post(_ step: @escaping @Sendable () -> Void) { queue(.step(step)) }

    private func queue(_ work: Work) {
        let first = jobs.withLock { jobs -> Bool in
            jobs.append(work)
            return jobs.count == 1
        }
        if first { wake() }
    }

    /// Traps unless the calling thread is running this engine's jobs: what
    /// `assumeIsolated` asks of an executor outside a task.
    func checkIsolated() {
        precondition(runningThread.load(ordering: .relaxed) == UInt(pthread_self()), "not on the engine's thread")
    }

    /// Makes `run(until:)` look at its condition again.
    func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    /// Sets the alarm to run `action` on the owner thread at `seconds` since
    /// the epoch (at once when that is past), or clears it (nil). Called on
    /// the owner thread.
    func setAlarm(at seconds: Double?, _ action: @escaping () -> Void) {
        guard let seconds else { return clearAlarm() }
        alarmAction = action
        // Kept to the years vaultd keeps times in: Int64 takes no infinity.
        let kept = max(0, min(seconds, Double(UnixTime.latestExpiry.seconds)))
        let whole = kept.rounded(.down)
        _ = vaultd_timerfd_at(alarmFD, Int64(whole), min(999_999_999, Int64((kept - whole) * 1e9)))
    }

    private func clearAlarm() {
        alarmAction = nil
        _ = vaultd_timerfd_at(alarmFD, -1, 0)
    }

    /// Runs the jobs queued now, in their order, then the alarm's action if
    /// it expired; on the owner thread only.
    func runQueued() {
        runningThread.store(UInt(pthread_self()), ordering: .relaxed)
        defer { runningThread.store(0, ordering: .relaxed) }
        var count: UInt64 = 0
        _ = read(wakeFD, &count, 8)
        var batch: [Work] = []
        jobs.withLock { swap(&$0, &batch) }
        let executor = asUnownedSerialExecutor()
        for work in batch {
            switch work {
            case .job(let job): job.runSynchronously(on: executor)
            case .step(let step): step()
            }
        }
        // A cleared timerfd is never readable: no read while no alarm is set.
        // Expired (8 bytes) or cancelled by a change of the clock (ECANCELED):
        // either way the alarm is cleared (a cancelled timerfd stays readable
        // until it is set again) and the action looks at what is due now.
        guard let action = alarmAction else { return }
        let expired = read(alarmFD, &count, 8)
        guard expired == 8 || (expired < 0 && errno == ECANCELED) else { return }
        clearAlarm()
        action()
    }

    /// Runs jobs as they come until `done()` holds (whoever makes it hold
    /// calls `wake()`); on the owner thread, while it does not serve.
    func run(until done: () -> Bool) {
        var ready = pollfd(fd: pollFD, events: Int16(POLLIN), revents: 0)
        while true {
            runQueued()
            if done() { return }
            _ = poll(&ready, 1, -1)
        }
    }
}
