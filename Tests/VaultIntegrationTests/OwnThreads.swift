import Foundation
import Testing

/// A task executor whose jobs run on threads of its own, with one more
/// thread whenever every thread it has is busy.
///
/// Process tests wait by blocking: on a child's exit, a socket's answer, a
/// pipe's next line (the harness's waits, `VarlinkClient`'s reads). Swift's
/// cooperative pool has one thread per core (two on the CI machine) and runs
/// every test of the test process, so two such waits there stopped every
/// other suite, the unit tests and the simulations too, for as long as they
/// lasted (a manual-clock test that needs a few milliseconds of CPU ran into
/// its 5-minute limit). A test under `.ownThreads` runs here instead, with its
/// child tasks and the actors it calls: a blocked test holds a thread of its
/// own, and the pool stays free for the rest.
final class ElasticExecutor: TaskExecutor, @unchecked Sendable {
    /// The one executor of the test process; its idle threads wait for work.
    static let shared = ElasticExecutor()

    private let condition = NSCondition()
    private var jobs: [UnownedJob] = []
    private var first = 0
    private var idle = 0
    private var threads = 0

    /// Threads made so far (the most tests and child tasks that ran at once).
    var threadCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return threads
    }

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        condition.lock()
        jobs.append(job)
        // A thread that was signalled but has not taken its job yet still
        // counts as idle: more jobs than idle threads need a new thread.
        if jobs.count - first > idle {
            threads += 1
            let name = "vaultd-test-\(threads)"
            Thread { [self] in work(name: name) }.start()
        } else {
            condition.signal()
        }
        condition.unlock()
    }

    private func work(name: String) {
        // The system's name of the thread (a new thread has its creator's):
        // what ps, a debugger and OwnThreadsTests see.
        try? name.write(toFile: "/proc/thread-self/comm", atomically: false, encoding: .utf8)
        let executor = asUnownedTaskExecutor()
        condition.lock()
        while true {
            guard first < jobs.count else {
                idle += 1
                condition.wait()
                idle -= 1
                continue
            }
            let job = jobs[first]
            first += 1
            if first == jobs.count {
                jobs.removeAll(keepingCapacity: true)
                first = 0
            }
            condition.unlock()
            job.runSynchronously(on: executor)
            condition.lock()
        }
    }
}

/// Runs a test (every test of a suite) on `ElasticExecutor.shared`, off the
/// cooperative pool: see `ElasticExecutor`. Every process suite carries it.
struct OwnThreadsTrait: SuiteTrait, TestTrait, TestScoping {
    var isRecursive: Bool { true }

    func provideScope(
        for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void
    ) async throws {
        try await withTaskExecutorPreference(ElasticExecutor.shared) { try await function() }
    }
}

extension Trait where Self == OwnThreadsTrait {
    /// The test's waits block a thread of its own, never one of Swift's
    /// cooperative pool (`ElasticExecutor`).
    static var ownThreads: Self { OwnThreadsTrait() }
}
