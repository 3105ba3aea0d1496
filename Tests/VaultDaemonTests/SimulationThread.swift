import Foundation
import Glibc
import Synchronization

/// The one thread a simulation runs on, so that a seed is one schedule.
///
/// On the cooperative pool two threads decide the order of concurrent work
/// (and an ordinary actor's queue orders its jobs differently from run to
/// run even on one thread). Here every job of the process (every task's,
/// through the runtime's global-enqueue hook, and the session managers', as
/// their executor) waits in one FIFO queue that one thread runs in order:
/// the same seed gives the same trace, run after run.
///
/// The hook takes the whole test process, so it is installed only when
/// `VAULTD_SIM_ONE_THREAD=1` says the process runs simulations alone
/// (`scripts/test` runs them in a step of their own); elsewhere `shared` is
/// nil and the simulations run on the cooperative pool as any test.
final class SimulationThread: SerialExecutor, @unchecked Sendable {
    /// The process's one simulation thread, started with the hook on first
    /// use; nil unless `VAULTD_SIM_ONE_THREAD=1`.
    static let shared: SimulationThread? = {
        guard ProcessInfo.processInfo.environment["VAULTD_SIM_ONE_THREAD"] == "1" else { return nil }
        let thread = SimulationThread()
        hookTarget = thread
        installHook()
        return thread
    }()

    /// Where the hook sends jobs; set once, before the hook is installed.
    nonisolated(unsafe) private static var hookTarget: SimulationThread?

    /// Whether this process's simulations run on one thread.
    static var isOn: Bool { shared != nil }

    private struct Queue {
        var jobs: [UnownedJob] = []
        var head = 0
    }
    private let queue = Mutex(Queue())
    private let wake = NSCondition()

    private init() {
        let thread = Thread { [self] in runForever() }
        thread.name = "simulation"
        thread.start()
    }

    func enqueue(_ job: consuming ExecutorJob) { push(UnownedJob(job)) }

    private func push(_ job: UnownedJob) {
        queue.withLock { $0.jobs.append(job) }
        wake.lock()
        wake.signal()
        wake.unlock()
    }

    private func next() -> UnownedJob? {
        queue.withLock { queue in
            guard queue.head < queue.jobs.count else { return nil }
            let job = queue.jobs[queue.head]
            queue.head += 1
            if queue.head >= 4096 {
                queue.jobs.removeFirst(queue.head)
                queue.head = 0
            }
            return job
        }
    }

    private func runForever() {
        let executor = asUnownedSerialExecutor()
        while true {
            if let job = next() {
                job.runSynchronously(on: executor)
                continue
            }
            wake.lock()
            while queue.withLock({ $0.head == $0.jobs.count }) { wake.wait() }
            wake.unlock()
        }
    }

    /// Sends every job the runtime would give the cooperative pool here.
    private static func installHook() {
        typealias Original = @convention(thin) (UnownedJob) -> Void
        typealias Hook = @convention(thin) (UnownedJob, Original) -> Void
        guard let symbol = dlsym(dlopen(nil, RTLD_NOW), "swift_task_enqueueGlobal_hook") else {
            fatalError("the Swift runtime has no swift_task_enqueueGlobal_hook")
        }
        symbol.assumingMemoryBound(to: Hook?.self).pointee = { job, _ in SimulationThread.hookTarget!.push(job) }
    }
}

/// What the simulations read from the environment: which seeds, and where
/// to write one seed's whole trace.
enum SimulationRun {
    static let environment = ProcessInfo.processInfo.environment

    /// `VAULTD_SIM_SEED=N`: that one seed; else `VAULTD_SIM_SEEDS` of them
    /// (default `short`, `long` under `VAULTD_SOAK=1`), from `salt`.
    static func seeds(short: Int, long: Int, salt: UInt64) -> [UInt64] {
        if let one = environment["VAULTD_SIM_SEED"].flatMap(UInt64.init) { return [one] }
        let soak = environment["VAULTD_SOAK"] == "1"
        let count = environment["VAULTD_SIM_SEEDS"].flatMap(Int.init) ?? (soak ? long : short)
        return (0..<UInt64(count)).map { $0 &* 0x9E37_79B9 &+ salt }
    }

    /// The 200 seeds the replay tests run twice each.
    static let replaySeeds: [UInt64] = (0..<200).map { $0 &* 0x2545_F491 &+ 12345 }

    /// The command that runs `seed` again, the same way: on one thread, with
    /// the hashing of sets and dictionaries fixed across processes.
    static func replay(_ seed: UInt64, suite: String) -> String {
        "replay: VAULTD_SIM_ONE_THREAD=1 SWIFT_DETERMINISTIC_HASHING=1 VAULTD_SIM_SEED=\(seed) swift test --filter \(suite)"
    }

    /// Writes `trace` whole to `VAULTD_SIM_TRACE`, when one seed is replayed;
    /// appends its digest to `VAULTD_SIM_DIGESTS`, one line a seed, so that
    /// a change meant to keep the behaviour can be checked against every seed
    /// of a run before it.
    static func keep(_ trace: [String]) {
        if let path = environment["VAULTD_SIM_DIGESTS"],
            let file = FileHandle(forWritingAtPath: path)
                ?? (FileManager.default.createFile(atPath: path, contents: nil)
                    ? FileHandle(forWritingAtPath: path) : nil)
        {
            file.seekToEndOfFile()
            file.write(Data((String(digest(trace), radix: 16) + "\n").utf8))
            file.closeFile()
        }
        guard environment["VAULTD_SIM_SEED"] != nil, let path = environment["VAULTD_SIM_TRACE"] else { return }
        try? (trace.joined(separator: "\n") + "\n").write(toFile: path, atomically: false, encoding: .utf8)
    }

    /// A digest of a trace (FNV-1a over its lines), the same in every process.
    static func digest(_ trace: [String]) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for line in trace {
            for byte in line.utf8 {
                hash = (hash ^ UInt64(byte)) &* 0x100_0000_01b3
            }
            hash = (hash ^ 0x0a) &* 0x100_0000_01b3
        }
        return hash
    }
}
