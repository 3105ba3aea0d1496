import Glibc
import Synchronization
import Testing

@testable import VaultDaemon

@Suite("The engine thread's alarm")
struct EngineThreadTests {
    /// Whether the engine has something to run within `milliseconds`.
    func ready(_ engine: EngineThread, within milliseconds: Int32) -> Bool {
        var fd = pollfd(fd: engine.pollFD, events: Int16(POLLIN), revents: 0)
        return poll(&fd, 1, milliseconds) == 1
    }

    func now() -> Double { Double(time(nil)) }

    @Test("Should run the alarm's action, once, when its time has passed")
    func runsWhenDue() {
        let engine = EngineThread()
        let runs = Mutex(0)
        engine.setAlarm(at: now() - 1) { runs.withLock { $0 += 1 } }
        #expect(ready(engine, within: 2_000), "a deadline past expires at once")
        engine.runQueued()
        #expect(runs.withLock { $0 } == 1)
        #expect(!ready(engine, within: 0), "a one-shot alarm, cleared once run")
        engine.runQueued()
        #expect(runs.withLock { $0 } == 1)
    }

    @Test("Should not run an alarm cleared or set later before it expired")
    func clearedAlarmDoesNotRun() {
        let engine = EngineThread()
        let runs = Mutex(0)
        engine.setAlarm(at: now() - 1) { runs.withLock { $0 += 1 } }
        engine.setAlarm(at: nil) { runs.withLock { $0 += 1 } }
        #expect(!ready(engine, within: 100))
        engine.setAlarm(at: now() + 3_600.5) { runs.withLock { $0 += 1 } }
        #expect(!ready(engine, within: 100))
        engine.runQueued()
        #expect(runs.withLock { $0 } == 0)
    }

    @Test(
        "Should take a deadline past any year, infinite or not a number without trapping",
        arguments: [
            Double.infinity, 1e300, Double(Int64.max), Double.nan, -Double.infinity,
        ])
    func farDeadlines(_ seconds: Double) {
        let engine = EngineThread()
        let runs = Mutex(0)
        engine.setAlarm(at: seconds) { runs.withLock { $0 += 1 } }
        // Kept to the year 9999; one below the epoch is past and expires at once.
        if seconds > 0 { #expect(!ready(engine, within: 50)) }
        engine.setAlarm(at: nil) { runs.withLock { $0 += 1 } }
        engine.runQueued()
        #expect(runs.withLock { $0 } == 0)
    }
}
