import Testing
import VaultCore

@Suite("DeadlineQueue", .timeLimit(.minutes(5)))
struct DeadlineQueueTests {
    func t(_ seconds: Int64) -> UnixTime { UnixTime(seconds: seconds) }

    @Test("Should give the nearest deadline first and pop every due key in order")
    func ordering() {
        var queue = DeadlineQueue<String>()
        queue.schedule("c", at: t(30))
        queue.schedule("a", at: t(10))
        queue.schedule("b", at: t(20))
        #expect(queue.next?.key == "a")
        #expect(queue.popDue(at: t(5)).isEmpty)
        #expect(queue.popDue(at: t(20)) == ["a", "b"])
        #expect(queue.count == 1)
        #expect(queue.next?.deadline == t(30))
    }

    @Test("Should move a rescheduled key and forget a cancelled one")
    func rescheduleAndCancel() {
        var queue = DeadlineQueue<String>()
        queue.schedule("a", at: t(10))
        queue.schedule("b", at: t(20))
        queue.schedule("a", at: t(40))
        #expect(queue.next?.key == "b")
        #expect(queue.deadline(of: "a") == t(40))
        queue.cancel("b")
        queue.cancel("missing")
        #expect(queue.next?.key == "a")
        #expect(queue.count == 1)
    }

    @Test("Should agree with a sorted reference over many random operations")
    func randomized() {
        var generator = SystemRandomNumberGenerator()
        var queue = DeadlineQueue<Int>()
        var reference: [Int: Int64] = [:]
        for _ in 0..<5000 {
            let key = Int.random(in: 0..<200, using: &generator)
            switch Int.random(in: 0..<3, using: &generator) {
            case 0, 1:
                let deadline = Int64.random(in: 0..<1000, using: &generator)
                queue.schedule(key, at: t(deadline))
                reference[key] = deadline
            default:
                queue.cancel(key)
                reference[key] = nil
            }
            #expect(queue.count == reference.count)
            if let nearest = reference.values.min() { #expect(queue.next?.deadline == t(nearest)) }
        }
        let now = t(500)
        let due = queue.popDue(at: now)
        let expected = reference.filter { $0.value <= 500 }
        #expect(Set(due) == Set(expected.keys))
        #expect(due.map { reference[$0]! } == due.map { reference[$0]! }.sorted())
        #expect(queue.count == reference.count - expected.count)
    }
}
