import Glibc
import Synchronization
import Testing
import VaultCore
import VaultSystem

@testable import VaultDaemon

/// The one pool blocking calls run on: threads start as runs need them and
/// end once idle, and kinds never share workers.
@Suite("WorkerPool", .timeLimit(.minutes(1)))
struct WorkerPoolTests {
    /// A deadline no run here may reach: a queued run past its deadline never
    /// starts, and a loaded machine (CI runs every suite at once on 2 cores)
    /// once took more than 10 s to get the helper runs going. The suite's
    /// time limit ends a hung test first.
    static let noExpiry: UInt64 = 3_600_000

    /// Polls `condition` every 10 ms for at most `seconds`, without holding
    /// a thread of the cooperative pool meanwhile.
    func eventually(seconds: Double, _ condition: () -> Bool) async -> Bool {
        for _ in 0..<Int(seconds * 100) {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return condition()
    }

    @Test("Should start no thread before a run, end its threads when idle, and start them again")
    func threadsComeAndGo() async {
        let pool = WorkerPool(workers: [.store: 1, .file: 1], name: "test-pool", lingerMilliseconds: 50)
        #expect(pool.threadsAlive == 0)
        let far = Monotonic.milliseconds() + WorkerPoolTests.noExpiry
        #expect(await pool.run(.store, lane: "s", cap: 1, deadline: far) { 1 } == 1)
        #expect(await eventually(seconds: 5) { pool.threadsAlive == 0 }, "\(pool.threadsAlive) threads left")
        #expect(await pool.run(.file, lane: "f", cap: 1, deadline: far) { 2 } == 2, "runs after the threads ended")
    }

    @Test("Should run a store call while every helper worker hangs")
    func kindsKeepTheirWorkers() async {
        let pool = WorkerPool(workers: [.helper: 2, .store: 1], name: "test-pool", lingerMilliseconds: 50)
        // Each hanging run reads until the pipe's write end is closed.
        var pipeFDs: [Int32] = [-1, -1]
        #expect(pipe(&pipeFDs) == 0)
        let (readEnd, writeEnd) = (pipeFDs[0], pipeFDs[1])
        let far = Monotonic.milliseconds() + WorkerPoolTests.noExpiry
        // Submitted as the session manager does, without a task that would
        // need a thread of the cooperative pool to start.
        final class Count: Sendable { let value = Mutex(0) }
        let (finished, expired) = (Count(), Count())
        for index in 0..<4 {
            pool.enqueue(
                .helper, lane: "p\(index)", cap: 4, deadline: far,
                {
                    var byte: UInt8 = 0
                    _ = read(readEnd, &byte, 1)
                    finished.value.withLock { $0 += 1 }
                }, expired: { expired.value.withLock { $0 += 1 } })
        }
        #expect(await eventually(seconds: 5) { pool.threadsAlive >= 2 })
        #expect(await pool.run(.store, lane: "s", cap: 1, deadline: far) { 3 } == 3)
        close(writeEnd)
        #expect(await eventually(seconds: 5) { finished.value.withLock { $0 } == 4 })
        #expect(expired.value.withLock { $0 } == 0, "a queued helper run waited past its deadline")
        close(readEnd)
    }
}
