import CShim
import Glibc
import Synchronization

/// The thread that owns the session manager: vaultd's main thread, which
/// also serves the socket. The manager (an actor) runs every job of its own
/// here: a job is queued, the eventfd `wakeFD` becomes readable, and the main
/// thread runs the queue, from the serving loop (the eventfd is one of its
/// epoll sources) or, before and after serving, from `run(until:)`. So the
/// sessions' state has one owner thread, the same as the connections', and
/// none of its work runs on the cooperative pool. Blocking calls never run
/// here: they go to `WorkerPool`, and their completions come back as jobs.
final class EngineThread: SerialExecutor, @unchecked Sendable {
    private let jobs = Mutex<[UnownedJob]>([])
    /// Readable while jobs wait to run.
    let wakeFD: Int32

    init() {
        wakeFD = vaultd_eventfd()
        precondition(wakeFD >= 0, "eventfd failed: errno \(errno)")
    }

    deinit { close(wakeFD) }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let first = jobs.withLock { jobs -> Bool in
            jobs.append(job)
            return jobs.count == 1
        }
        if first { wake() }
    }

    /// Makes `run(until:)` look at its condition again.
    func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    /// Runs the jobs queued now, in their order; on the owner thread only.
    func runQueued() {
        var count: UInt64 = 0
        _ = read(wakeFD, &count, 8)
        var batch: [UnownedJob] = []
        jobs.withLock { swap(&$0, &batch) }
        let executor = asUnownedSerialExecutor()
        for job in batch { job.runSynchronously(on: executor) }
    }

    /// Runs jobs as they come until `done()` holds (whoever makes it hold
    /// calls `wake()`); on the owner thread, while it does not serve.
    func run(until done: () -> Bool) {
        var ready = pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0)
        while true {
            runQueued()
            if done() { return }
            _ = poll(&ready, 1, -1)
        }
    }
}
