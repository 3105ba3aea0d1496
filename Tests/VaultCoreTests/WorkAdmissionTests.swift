import Testing
import VaultCore

/// The admission of blocking runs: workers per kind, a cap per lane, a FIFO
/// queue per lane with deadlines. Time is a plain number here.
@Suite("WorkAdmission", .timeLimit(.minutes(5)))
struct WorkAdmissionTests {
    enum Kind { case helper, http, store }
    typealias Admission = WorkAdmission<Int, Kind>

    @Test("Should start runs up to the lane's cap and queue the rest first come first served")
    func capAndFIFO() {
        var admission = Admission(workers: [.helper: 8])
        #expect(admission.arrive(1, kind: .helper, lane: "slow", cap: 2, deadline: 100) == [1])
        #expect(admission.arrive(2, kind: .helper, lane: "slow", cap: 2, deadline: 100) == [2])
        #expect(admission.arrive(3, kind: .helper, lane: "slow", cap: 2, deadline: 100) == [])
        #expect(admission.arrive(4, kind: .helper, lane: "slow", cap: 2, deadline: 100) == [])
        #expect(admission.running(.helper, "slow") == 2 && admission.waiting(.helper, "slow") == 2)
        #expect(admission.finished(2) == [3])
        #expect(admission.finished(1) == [4])
        #expect(admission.finished(3) == [] && admission.finished(4) == [])
        #expect(admission.runningCount == 0)
    }

    @Test("Should start another lane's run at once while a slow lane is at its cap with a queue")
    func slowProviderDoesNotDelayAnother() {
        var admission = Admission(workers: [.helper: 8])
        for ticket in 1...100 { _ = admission.arrive(ticket, kind: .helper, lane: "slow", cap: 4, deadline: 1_000) }
        #expect(admission.running(.helper, "slow") == 4 && admission.waiting(.helper, "slow") == 96)
        #expect(admission.arrive(101, kind: .helper, lane: "fast", cap: 4, deadline: 1_000) == [101])
    }

    @Test("Should expire the runs that waited past their deadline, and only those")
    func expiry() {
        var admission = Admission(workers: [.helper: 8])
        _ = admission.arrive(1, kind: .helper, lane: "p", cap: 1, deadline: 10)
        _ = admission.arrive(2, kind: .helper, lane: "p", cap: 1, deadline: 20)
        _ = admission.arrive(3, kind: .helper, lane: "p", cap: 1, deadline: 30)
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
        var admission = Admission(workers: [.helper: 1])
        #expect(admission.arrive(1, kind: .helper, lane: "store", cap: 1, deadline: 100) == [1])
        _ = admission.arrive(2, kind: .helper, lane: "store", cap: 1, deadline: 100)
        _ = admission.arrive(3, kind: .helper, lane: "store", cap: 1, deadline: 100)
        #expect(admission.arrive(4, kind: .helper, lane: "store", cap: 1, deadline: 100, urgent: true) == [])
        #expect(admission.arrive(5, kind: .helper, lane: "store", cap: 1, deadline: 100, urgent: true) == [])
        #expect(admission.finished(1) == [4], "the running call is not cut short; the urgent one is next")
        #expect(admission.finished(4) == [5], "urgent ones keep their order")
        #expect(admission.finished(5) == [2])
        #expect(admission.finished(2) == [3])
        // Across lanes of a kind: its next free worker goes to an urgent head first.
        var shared = Admission(workers: [.helper: 1])
        _ = shared.arrive(1, kind: .helper, lane: "http", cap: 2, deadline: 100)
        _ = shared.arrive(2, kind: .helper, lane: "http", cap: 2, deadline: 100)
        _ = shared.arrive(3, kind: .helper, lane: "store", cap: 1, deadline: 100, urgent: true)
        #expect(shared.finished(1) == [3])
        // An urgent run expires at its deadline like any.
        var expiring = Admission(workers: [.helper: 1])
        _ = expiring.arrive(1, kind: .helper, lane: "p", cap: 1, deadline: 100)
        _ = expiring.arrive(2, kind: .helper, lane: "p", cap: 1, deadline: 10, urgent: true)
        #expect(expiring.expire(now: 10) == [2])
    }

    @Test("Should share the workers first come first served among the lanes of a kind under their cap")
    func workersShared() {
        var admission = Admission(workers: [.helper: 2])
        #expect(admission.arrive(1, kind: .helper, lane: "a", cap: 4, deadline: 100) == [1])
        #expect(admission.arrive(2, kind: .helper, lane: "a", cap: 4, deadline: 100) == [2])
        #expect(admission.arrive(3, kind: .helper, lane: "a", cap: 4, deadline: 100) == [])
        #expect(admission.arrive(4, kind: .helper, lane: "b", cap: 4, deadline: 100) == [])
        #expect(admission.finished(1) == [3], "a's run arrived first")
        #expect(admission.finished(2) == [4])
    }

    @Test("Should pass over a lane at its cap when a worker frees")
    func capBeforeOrder() {
        var admission = Admission(workers: [.helper: 2])
        _ = admission.arrive(1, kind: .helper, lane: "a", cap: 1, deadline: 100)
        _ = admission.arrive(2, kind: .helper, lane: "b", cap: 1, deadline: 100)
        _ = admission.arrive(3, kind: .helper, lane: "a", cap: 1, deadline: 100)
        _ = admission.arrive(4, kind: .helper, lane: "c", cap: 1, deadline: 100)
        #expect(admission.finished(2) == [4], "a is still at its cap of 1")
        #expect(admission.finished(1) == [3])
    }

    @Test("Should take the newest cap of a lane, at least one")
    func capChanges() {
        var admission = Admission(workers: [.helper: 8])
        #expect(admission.arrive(1, kind: .helper, lane: "p", cap: 0, deadline: 100) == [1])
        #expect(admission.arrive(2, kind: .helper, lane: "p", cap: 0, deadline: 100) == [])
        #expect(admission.arrive(3, kind: .helper, lane: "p", cap: 3, deadline: 100) == [2, 3])
    }

    @Test("Should start a store call at once while every helper and HTTP worker hangs")
    func kindsDoNotShareWorkers() {
        var admission = Admission(workers: [.helper: 2, .http: 1, .store: 1])
        #expect(admission.totalWorkers == 4)
        for ticket in 1...10 { _ = admission.arrive(ticket, kind: .helper, lane: "p\(ticket)", cap: 4, deadline: 100) }
        _ = admission.arrive(11, kind: .http, lane: "idp", cap: 2, deadline: 100)
        #expect(admission.arrive(12, kind: .http, lane: "other", cap: 2, deadline: 100) == [], "http has one worker")
        #expect(admission.runningCount == 3)
        #expect(admission.arrive(13, kind: .store, lane: "secret-store", cap: 1, deadline: 100) == [13])
        #expect(admission.finished(13) == [], "a freed store worker starts no run of another kind")
        #expect(admission.finished(1) == [3], "a freed helper worker starts the next helper run")
        #expect(admission.finished(11) == [12])
    }
}
