import Testing
import VaultCore

/// Where `actions` schedule the next probe, if they do.
private func probeAt(_ actions: [StoreHealth.Action]) -> Double? {
    for case .probe(let at) in actions { return at }
    return nil
}

@Suite("Store health: availability of the secret store as a state machine", .timeLimit(.minutes(5)))
struct StoreHealthTests {
    @Test("Should go unavailable on a StoreUnavailable failure, report it once and schedule a probe")
    func unavailableOnce() {
        var health = StoreHealth()
        let actions = health.handle(.failed(.storeUnavailable, reason: "gone", now: 100))
        #expect(health.state == .unavailable)
        #expect(actions.first == .report(.unavailable, reason: "gone"))
        #expect(probeAt(actions).map { $0 > 100 && $0 <= 100 + StoreHealth.longestProbeSeconds } == true)
        #expect(health.refusal?.code == .storeUnavailable)
        // A second failure while probing changes nothing.
        #expect(health.handle(.failed(.storeUnavailable, reason: "gone", now: 101)).isEmpty)
    }

    @Test("Should end the refusal with the store's own remedy, the Secret Service's by default")
    func refusalNamesTheRemedy() throws {
        var keyring = StoreHealth()
        _ = keyring.handle(.failed(.storeUnavailable, reason: "gone", now: 1))
        #expect(try #require(keyring.refusal).message.hasSuffix(StoreHealth.secretServiceRemedy))
        var etcd = StoreHealth(remedy: "check the etcd members")
        _ = etcd.handle(.failed(.storeUnavailable, reason: "no quorum", now: 1))
        let refusal = try #require(etcd.refusal)
        #expect(refusal.message.hasSuffix("check the etcd members"))
        #expect(!refusal.message.contains("gnome-keyring"))
    }

    @Test("Should ignore a failure of one call (StoreFailed) and keep the store available")
    func storeFailedIsOneCall() {
        var health = StoreHealth()
        #expect(health.handle(.failed(.storeFailed, reason: "refused item", now: 1)).isEmpty)
        #expect(health.handle(.failed(.networkError, reason: "x", now: 1)).isEmpty)
        #expect(health.state == .available)
        #expect(health.refusal == nil)
    }

    @Test("Should report a locked store as locked and refuse with StoreLocked, never as unavailable")
    func lockedIsLocked() {
        var health = StoreHealth()
        let actions = health.handle(.failed(.storeLocked, reason: "locked", now: 5))
        #expect(actions.first == .report(.locked, reason: "locked"))
        #expect(health.refusal?.code == .storeLocked)
        // A probe that still finds it locked reports nothing new and probes again.
        let again = health.handle(.probed(.locked("still"), now: 6, random: 0.5))
        #expect(!again.contains { if case .report = $0 { return true } else { return false } })
        #expect(probeAt(again) != nil)
        #expect(health.state == .locked)
        // Unreachable while locked: reported as such.
        let gone = health.handle(.probed(.unavailable("bus gone"), now: 7, random: 0.5))
        #expect(gone.first == .report(.unavailable, reason: "bus gone"))
    }

    @Test("Should back off between failed probes, doubling up to the cap, and never past it")
    func backoffIsBounded() {
        var health = StoreHealth()
        _ = health.handle(.failed(.storeUnavailable, reason: "gone", now: 0))
        var now = 0.0
        var waits: [Double] = []
        for _ in 0..<20 {
            let actions = health.handle(.probed(.unavailable("gone"), now: now, random: 0.5))
            guard let at = probeAt(actions) else {
                Issue.record("a failed probe scheduled no next probe")
                return
            }
            waits.append(at - now)
            now = at
        }
        #expect(waits.allSatisfy { $0 > 0 && $0 <= StoreHealth.longestProbeSeconds })
        #expect(waits.first! < waits[3])
        #expect(waits.last! == StoreHealth.longestProbeSeconds)
        for random in [0.0, 0.3, 0.999, 1.5, -1] {
            for attempt in 0..<40 {
                let delay = StoreHealth.probeDelay(attempt: attempt, random: random)
                #expect(delay > 0 && delay <= StoreHealth.longestProbeSeconds)
            }
        }
    }

    @Test("Should come back on a probe that finds the store available, and ask for the write-through once")
    func backAndWriteThrough() {
        var health = StoreHealth()
        _ = health.handle(.failed(.storeUnavailable, reason: "gone", now: 0))
        _ = health.handle(.probed(.unavailable("gone"), now: 1, random: 0.5))
        let back = health.handle(.probed(.available, now: 2, random: 0.5))
        #expect(back == [.report(.available, reason: nil), .writeThrough])
        #expect(health.state == .available)
        #expect(health.since == nil && health.failedProbes == 0 && health.refusal == nil)
        // A late probe that also finds it available does nothing more.
        #expect(health.handle(.probed(.available, now: 3, random: 0.5)).isEmpty)
    }
}
