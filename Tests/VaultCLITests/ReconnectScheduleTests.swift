import Testing
import Varlink
import VaultCLI
import VaultClient
import VaultCore

/// The schedule `vaultctl watch`, `vaultctl exec` and the client library
/// reconnect on, with time as an input.
@Suite("Reconnect schedule")
struct ReconnectScheduleTests {
    @Test("Should wait 1 s before the first attempt, then twice as long after each failure, at most 30 s")
    func standardDelays() {
        var schedule = ReconnectSchedule()
        #expect(schedule.waitMilliseconds(now: 0) == -1 && !schedule.isDue(now: 0))
        schedule.lost(now: 10_000)
        var waits = [schedule.waitMilliseconds(now: 10_000)]
        var now: UInt64 = 10_000
        for _ in 0..<7 {
            now = schedule.nextAttemptAt ?? now
            #expect(schedule.isDue(now: now))
            let again = schedule.failed(now: now)
            #expect(again)
            waits.append(schedule.waitMilliseconds(now: now))
        }
        #expect(waits == [1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000])
        schedule.connected()
        #expect(schedule.nextAttemptAt == nil && schedule.failedAttempts == 0)
        // A later loss starts again at 1 s.
        schedule.lost(now: now)
        #expect(schedule.waitMilliseconds(now: now) == 1000)
    }

    @Test("Should give up after the policy's attempts, and wait 0 ms for an attempt already due")
    func maxAttempts() {
        var schedule = ReconnectSchedule(policy: ReconnectPolicy(firstDelaySeconds: 0.5, maxAttempts: 2))
        schedule.lost(now: 0)
        #expect(schedule.waitMilliseconds(now: 0) == 500)
        #expect(schedule.waitMilliseconds(now: 900) == 0)
        let second = schedule.failed(now: 900)
        let third = schedule.failed(now: 2000)
        #expect(second && !third)
        #expect(schedule.nextAttemptAt == nil && !schedule.isDue(now: 10_000))
    }

    @Test("Should retry an unreachable or stopping vaultd, and not a refusal or an untrusted socket")
    func worthRetrying() {
        func reply(_ name: String) -> VaultClientError {
            .reply(VarlinkErrorReply(VarlinkReply(error: "io.vaultd.Vault." + name, parameters: ["message": "x"]))!)
        }
        #expect(ReconnectPolicy.isWorthRetrying(.client(.unreachable(path: "/s", reason: "ENOENT"))))
        #expect(ReconnectPolicy.isWorthRetrying(.client(.connection("reset"))))
        #expect(ReconnectPolicy.isWorthRetrying(reply("InternalError")))
        #expect(ReconnectPolicy.isWorthRetrying(reply("TooManySubscriptions")))
        #expect(!ReconnectPolicy.isWorthRetrying(reply("AccessDenied")))
        #expect(!ReconnectPolicy.isWorthRetrying(reply("InvalidParameter")))
        #expect(!ReconnectPolicy.isWorthRetrying(.client(.untrustedPeer(path: "/s", uid: 65534))))
    }
}
