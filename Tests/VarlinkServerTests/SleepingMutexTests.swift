import Dispatch
import Testing
import VaultSystem

@Suite("SleepingMutex")
struct SleepingMutexTests {
    @Test("Should let one thread at a time change the value: no increment of many threads is lost")
    func mutualExclusion() {
        let counter = SleepingMutex((count: 0, inside: 0, overlaps: 0))
        let threads = 8
        let rounds = 20_000
        DispatchQueue.concurrentPerform(iterations: threads) { _ in
            for _ in 0..<rounds {
                counter.withLock { state in
                    state.inside += 1
                    if state.inside > 1 { state.overlaps += 1 }
                    // A read, then a write: two threads inside at once would lose increments.
                    let seen = state.count
                    state.count = seen + 1
                    state.inside -= 1
                }
            }
        }
        let final = counter.withLock { $0 }
        #expect(final.count == threads * rounds)
        #expect(final.overlaps == 0)
    }

    @Test("Should hand back what the body returns and pass on what it throws, the lock released")
    func resultsAndErrors() throws {
        struct Refused: Error {}
        let lock = SleepingMutex([1, 2, 3])
        #expect(lock.withLock { $0.count } == 3)
        #expect(throws: Refused.self) {
            try lock.withLock { (_: inout [Int]) throws(Refused) -> Int in throw Refused() }
        }
        // Released after the throw: taken again at once.
        lock.withLock { $0.append(4) }
        #expect(lock.withLock { $0 } == [1, 2, 3, 4])
    }
}
