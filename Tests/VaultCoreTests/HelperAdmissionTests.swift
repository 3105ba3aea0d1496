import Testing
import VaultCore

/// The admission of exec helper runs: fixed workers, a cap per provider, a
/// FIFO queue per provider with deadlines. Time is a plain number here.
@Suite("HelperAdmission", .timeLimit(.minutes(5)))
struct HelperAdmissionTests {
    @Test("Should start runs up to the provider's cap and queue the rest first come first served")
    func capAndFIFO() {
        var admission = HelperAdmission<Int>(workers: 8)
        #expect(admission.arrive(1, provider: "slow", cap: 2, deadline: 100) == [1])
        #expect(admission.arrive(2, provider: "slow", cap: 2, deadline: 100) == [2])
        #expect(admission.arrive(3, provider: "slow", cap: 2, deadline: 100) == [])
        #expect(admission.arrive(4, provider: "slow", cap: 2, deadline: 100) == [])
        #expect(admission.running("slow") == 2 && admission.waiting("slow") == 2)
        #expect(admission.finished(2) == [3])
        #expect(admission.finished(1) == [4])
        #expect(admission.finished(3) == [] && admission.finished(4) == [])
        #expect(admission.runningCount == 0)
    }

    @Test("Should start another provider's run at once while a slow provider is at its cap with a queue")
    func slowProviderDoesNotDelayAnother() {
        var admission = HelperAdmission<Int>(workers: 8)
        for ticket in 1...100 { _ = admission.arrive(ticket, provider: "slow", cap: 4, deadline: 1_000) }
        #expect(admission.running("slow") == 4 && admission.waiting("slow") == 96)
        #expect(admission.arrive(101, provider: "fast", cap: 4, deadline: 1_000) == [101])
    }

    @Test("Should expire the runs that waited past their deadline, and only those")
    func expiry() {
        var admission = HelperAdmission<Int>(workers: 8)
        _ = admission.arrive(1, provider: "p", cap: 1, deadline: 10)
        _ = admission.arrive(2, provider: "p", cap: 1, deadline: 20)
        _ = admission.arrive(3, provider: "p", cap: 1, deadline: 30)
        #expect(admission.nextDeadline == 20)
        #expect(admission.expire(now: 19) == [])
        #expect(admission.expire(now: 20) == [2])
        #expect(admission.nextDeadline == 30)
        #expect(admission.finished(1) == [3])
        #expect(admission.nextDeadline == nil)
        #expect(admission.expire(now: 1_000) == [], "a started run does not expire in the queue")
        #expect(admission.finished(2) == [], "an expired run never started")
    }

    @Test("Should start an urgent run before every waiting run but the urgent ones that came first")
    func urgentGoesAhead() {
        var admission = HelperAdmission<Int>(workers: 1)
        #expect(admission.arrive(1, provider: "store", cap: 1, deadline: 100) == [1])
        _ = admission.arrive(2, provider: "store", cap: 1, deadline: 100)
        _ = admission.arrive(3, provider: "store", cap: 1, deadline: 100)
        #expect(admission.arrive(4, provider: "store", cap: 1, deadline: 100, urgent: true) == [])
        #expect(admission.arrive(5, provider: "store", cap: 1, deadline: 100, urgent: true) == [])
        #expect(admission.finished(1) == [4], "the running call is not cut short; the urgent one is next")
        #expect(admission.finished(4) == [5], "urgent ones keep their order")
        #expect(admission.finished(5) == [2])
        #expect(admission.finished(2) == [3])
        // Across providers: the next free worker goes to an urgent head first.
        var shared = HelperAdmission<Int>(workers: 1)
        _ = shared.arrive(1, provider: "http", cap: 2, deadline: 100)
        _ = shared.arrive(2, provider: "http", cap: 2, deadline: 100)
        _ = shared.arrive(3, provider: "store", cap: 1, deadline: 100, urgent: true)
        #expect(shared.finished(1) == [3])
        // An urgent run expires at its deadline like any.
        var expiring = HelperAdmission<Int>(workers: 1)
        _ = expiring.arrive(1, provider: "p", cap: 1, deadline: 100)
        _ = expiring.arrive(2, provider: "p", cap: 1, deadline: 10, urgent: true)
        #expect(expiring.expire(now: 10) == [2])
    }

    @Test("Should share the workers first come first served among providers under their cap")
    func workersShared() {
        var admission = HelperAdmission<Int>(workers: 2)
        #expect(admission.arrive(1, provider: "a", cap: 4, deadline: 100) == [1])
        #expect(admission.arrive(2, provider: "a", cap: 4, deadline: 100) == [2])
        #expect(admission.arrive(3, provider: "a", cap: 4, deadline: 100) == [])
        #expect(admission.arrive(4, provider: "b", cap: 4, deadline: 100) == [])
        #expect(admission.finished(1) == [3], "a's run arrived first")
        #expect(admission.finished(2) == [4])
    }

    @Test("Should pass over a provider at its cap when a worker frees")
    func capBeforeOrder() {
        var admission = HelperAdmission<Int>(workers: 2)
        _ = admission.arrive(1, provider: "a", cap: 1, deadline: 100)
        _ = admission.arrive(2, provider: "b", cap: 1, deadline: 100)
        _ = admission.arrive(3, provider: "a", cap: 1, deadline: 100)
        _ = admission.arrive(4, provider: "c", cap: 1, deadline: 100)
        #expect(admission.finished(2) == [4], "a is still at its cap of 1")
        #expect(admission.finished(1) == [3])
    }

    @Test("Should take the newest cap of a provider, at least one")
    func capChanges() {
        var admission = HelperAdmission<Int>(workers: 8)
        #expect(admission.arrive(1, provider: "p", cap: 0, deadline: 100) == [1])
        #expect(admission.arrive(2, provider: "p", cap: 0, deadline: 100) == [])
        #expect(admission.arrive(3, provider: "p", cap: 3, deadline: 100) == [2, 3])
    }
}
