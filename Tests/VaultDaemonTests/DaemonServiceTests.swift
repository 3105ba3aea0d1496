import Synchronization
import Testing
import VaultCore

@testable import VaultDaemon

/// The order in which the daemon's parts start and stop (the parts
/// themselves are tested through the daemon, in the process tests).
@Suite("Daemon services", .timeLimit(.minutes(5)))
struct DaemonServiceTests {
    /// A part that writes what it does to `trace`, and fails to start when told to.
    final class Part: DaemonService {
        let name: String
        let fails: Bool
        let trace: Trace

        init(_ name: String, fails: Bool = false, trace: Trace) {
            (self.name, self.fails, self.trace) = (name, fails, trace)
        }

        func start() throws(VaultError) {
            trace.add("start \(name)")
            if fails { throw VaultError(.internalError, "\(name) failed") }
        }

        func stop() { trace.add("stop \(name)") }
    }

    final class Trace: Sendable {
        private let lines = Mutex<[String]>([])
        func add(_ line: String) { lines.withLock { $0.append(line) } }
        var all: [String] { lines.withLock { $0 } }
    }

    @Test("Should start the parts in order and stop them in reverse")
    func startInOrderStopInReverse() throws {
        let trace = Trace()
        let services: [any DaemonService] = ["a", "b", "c"].map { Part($0, trace: trace) }
        try services.start()
        services.stop()
        #expect(trace.all == ["start a", "start b", "start c", "stop c", "stop b", "stop a"])
    }

    @Test("Should stop the parts already started, in reverse, when one fails to start, and throw its error")
    func failedStartStopsThoseBefore() {
        let trace = Trace()
        let services: [any DaemonService] = [
            Part("a", trace: trace), Part("b", trace: trace), Part("c", fails: true, trace: trace),
            Part("d", trace: trace),
        ]
        #expect(throws: VaultError(.internalError, "c failed")) { try services.start() }
        #expect(trace.all == ["start a", "start b", "start c", "stop b", "stop a"])
    }
}
