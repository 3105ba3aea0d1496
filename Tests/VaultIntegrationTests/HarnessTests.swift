import Foundation
import Testing

/// The harness that runs the real binaries for every process suite.
@Suite("The process harness", .ownThreads, .timeLimit(.minutes(1)))
struct HarnessTests {
    @Test("Should report a child that ends before it reads its input, not trap on the broken pipe")
    func childEndsBeforeItsInput() throws {
        // More than a pipe holds, so the write waits for a reader that never
        // comes and meets EPIPE when `true` exits, whatever the scheduling.
        let input = String(repeating: "x", count: 1 << 20)
        let result = try runCommand(URL(fileURLWithPath: "/bin/true"), [], input: input, seconds: 10)
        #expect(result.status == 0)
        #expect(result.stdout.isEmpty)
    }
}
