import Testing
import Varlink
import VaultCore
import VaultDaemon

/// The counting behind the audit trail's coalesced token handouts, driven by
/// hand-given times (the daemon's timer and lines are in AuditTests).
@Suite("Handout counts", .timeLimit(.minutes(5)))
struct HandoutCountsTests {
    static let demo = SessionKey(owner: 1000, account: Account(provider: "demo", user: "alice"))
    static let other = SessionKey(owner: 1000, account: Account(provider: "demo", user: "bob"))
    static let alice = Caller(uid: 1000, gid: 1000, pid: 42, executable: "/usr/bin/app")

    func record(_ counts: inout HandoutCounts, _ key: SessionKey = demo, caller: Caller = alice, at now: UInt64)
        -> Bool
    {
        counts.record("GetToken", key, caller: caller, result: "ok", now: now)
    }

    /// The counts due at `now`, as (user, pid, count), sorted.
    func due(_ counts: inout HandoutCounts, at now: UInt64) -> [String] {
        counts.tick(now: now).map { "\($0.kind.user) \($0.kind.pid) \($0.count)" }.sorted()
    }

    @Test("Should write the first handout of a kind at once and count the repeats until the tick")
    func firstWrittenRepeatsCounted() {
        var counts = HandoutCounts()
        #expect(record(&counts, at: 0))
        for t in 1...99 { #expect(!record(&counts, at: UInt64(t))) }
        #expect(counts.nextTick == HandoutCounts.interval)
        #expect(due(&counts, at: HandoutCounts.interval) == ["alice 42 99"])
    }

    @Test("Should give a different pid, uid, account or result a line of its own")
    func kindsApart() {
        var counts = HandoutCounts()
        #expect(record(&counts, at: 0))
        #expect(record(&counts, caller: Caller(uid: 1000, gid: 1000, pid: 43, executable: "/usr/bin/app"), at: 1))
        #expect(record(&counts, caller: Caller(uid: 1001, gid: 1001, pid: 42, executable: "/usr/bin/app"), at: 2))
        #expect(record(&counts, HandoutCountsTests.other, at: 3))
        let refused = counts.record(
            "GetToken", HandoutCountsTests.demo, caller: HandoutCountsTests.alice, result: "ERR_X", now: 4)
        #expect(refused)
        // Repeats of the first kind, interleaved with the others, still add up.
        #expect(!record(&counts, at: 5))
        #expect(!record(&counts, HandoutCountsTests.other, at: 6))
        #expect(!record(&counts, at: 7))
        #expect(due(&counts, at: HandoutCounts.interval) == ["alice 42 2", "bob 42 1"])
    }

    @Test("Should forget a kind after a whole interval without a handout, so its next one is written at once")
    func quietKindForgotten() {
        var counts = HandoutCounts()
        #expect(record(&counts, at: 0))
        #expect(!record(&counts, at: 10))
        let interval = HandoutCounts.interval
        #expect(due(&counts, at: interval) == ["alice 42 1"])
        // Counted again in the next interval, written at its end.
        #expect(!record(&counts, at: interval + 5))
        #expect(due(&counts, at: 2 * interval) == ["alice 42 1"])
        // A quiet interval: nothing to write, the kind is forgotten and no tick is due.
        #expect(due(&counts, at: 3 * interval) == [])
        #expect(counts.nextTick == nil)
        #expect(record(&counts, at: 3 * interval + 1))
        #expect(counts.nextTick == 4 * interval + 1)
    }

    @Test("Should hand over every pending count when drained, and track nothing after")
    func drainAtExit() {
        var counts = HandoutCounts()
        #expect(record(&counts, at: 0))
        #expect(record(&counts, HandoutCountsTests.other, at: 0))
        for _ in 0..<5 { #expect(!record(&counts, at: 1)) }
        #expect(!record(&counts, HandoutCountsTests.other, at: 2))
        let drained = counts.drain().map { "\($0.kind.user) \($0.count)" }.sorted()
        #expect(drained == ["alice 5", "bob 1"])
        #expect(counts.drain().isEmpty)
        #expect(counts.nextTick == nil)
        #expect(record(&counts, at: 3))
    }

    @Test("Should write every handout of kinds past the table's bound rather than grow it")
    func boundedTable() {
        var counts = HandoutCounts()
        for pid in 0..<Int32(HandoutCounts.maximumKinds) {
            #expect(record(&counts, caller: Caller(uid: 1, gid: 1, pid: pid), at: 0))
        }
        let extra = Caller(uid: 1, gid: 1, pid: -1)
        #expect(record(&counts, caller: extra, at: 0))
        #expect(record(&counts, caller: extra, at: 0))
    }
}
