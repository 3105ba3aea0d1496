import Foundation
import Synchronization
import Testing

/// Children counted as they arrive.
final class Arrivals: Sendable {
    private let count = Mutex(0)
    /// Counts one more arrival; returns how many arrived so far.
    func arrive() -> Int {
        count.withLock {
            $0 += 1
            return $0
        }
    }
}

/// The process suites' threads (`OwnThreads.swift`): a test that blocks
/// holds a thread of its own, and so do its child tasks.
@Suite("Process tests on threads of their own", .ownThreads, .timeLimit(.minutes(5)))
struct OwnThreadsTests {
    /// The name the system knows this thread by (at most 15 bytes; Dispatch
    /// keeps the end of its queue's name: "qos.cooperative" on the pool).
    static func threadName() -> String {
        let comm = try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8)
        return comm?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "unknown"
    }

    @Test("Should run an async process test on a thread of its own, not one of the cooperative pool")
    func asyncTestThread() async {
        let name = Self.threadName()
        #expect(name.hasPrefix("vaultd-test-"), "\(name)")
    }

    @Test("Should run a synchronous process test on a thread of its own, not one of the cooperative pool")
    func syncTestThread() {
        let name = Self.threadName()
        #expect(name.hasPrefix("vaultd-test-"), "\(name)")
    }

    @Test("Should run eight blocked child tasks at once, where the pool has one thread per core")
    func blockedChildren() async {
        // Each child blocks until all eight are blocked: on threads the pool
        // shares, the eighth never starts, and every wait ends at its bound.
        let count = 8
        let arrived = Arrivals()
        let all = DispatchSemaphore(value: 0)
        let met = await withTaskGroup(of: Bool.self) { group in
            for _ in 0..<count {
                group.addTask {
                    if arrived.arrive() == count {
                        for _ in 0..<count { all.signal() }
                    }
                    return all.wait(timeout: .now() + 10) == .success
                }
            }
            var met = 0
            for await one in group where one { met += 1 }
            return met
        }
        #expect(met == count, "\(count - met) of \(count) blocked children never met the others")
    }

    @Test("Should find .ownThreads on every suite of the process tests")
    func everySuiteHasOwnThreads() throws {
        let directory = Binaries.packageRoot.appendingPathComponent("Tests/VaultIntegrationTests")
        var missing: [String] = []
        for file in try FileManager.default.contentsOfDirectory(atPath: directory.path) where file.hasSuffix(".swift") {
            let text = try String(contentsOf: directory.appendingPathComponent(file), encoding: .utf8)
            var rest = Substring(text)
            while let start = rest.range(of: "@" + "Suite(") {
                // The attribute's arguments, to the parenthesis that closes them.
                var depth = 0
                var end = start.upperBound
                for index in rest[start.lowerBound...].indices {
                    if rest[index] == "(" { depth += 1 }
                    if rest[index] == ")" {
                        depth -= 1
                        if depth == 0 {
                            end = index
                            break
                        }
                    }
                }
                if !rest[start.lowerBound..<end].contains(".ownThreads") {
                    missing.append("\(file): \(rest[start.lowerBound..<end].prefix(80))")
                }
                rest = rest[end...]
            }
        }
        #expect(
            missing.isEmpty,
            "suites without .ownThreads (add it beside .timeLimit: a blocked test must hold a thread of its own): \(missing)"
        )
    }
}
