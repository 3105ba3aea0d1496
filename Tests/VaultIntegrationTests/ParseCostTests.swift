import Foundation
import Synchronization
import Testing
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// What one call may take from the serving loop (issue 13: four connections
/// sending ~1 MiB messages of numbers or objects took another client's
/// GetToken from a p50 of 0.3 ms to a p99 of ~40 ms, each parse holding the
/// loop). Measured against the real vaultd: GetToken latency without, then
/// with, the attack, in the same test, on the same machine.
@Suite("Parse cost of large calls", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct ParseCostTests {
    /// About 1 MiB (under the 1 MiB cap) of `item`, comma-separated.
    static func filler(_ item: String, bytes: Int = 1_000_000) -> String {
        Array(repeating: item, count: bytes / (item.utf8.count + 1)).joined(separator: ",")
    }

    /// The attack's messages: numbers to a method that takes small
    /// parameters (named first, then last) and nested objects to Login.
    static let attacks: [[UInt8]] = {
        let numbers = filler("12345.678")
        let objects = filler(#"{"a":{}}"#)
        let texts = [
            #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"x","n":[\#(numbers)]}}"#,
            #"{"parameters":{"provider":"demo","user":"x","o":[\#(objects)]},"method":"io.vaultd.Vault.GetToken"}"#,
            #"{"method":"io.vaultd.Vault.Login","parameters":{"provider":"demo","user":"x","token":"t","profile":{"o":[\#(objects)]}}}"#,
        ]
        return texts.map { Array($0.utf8) + [0] }
    }()

    /// Milliseconds of `count` GetToken calls, one at a time on one connection.
    static func latencies(_ client: VaultConnection, user: String, count: Int) throws -> [Double] {
        var out: [Double] = []
        let clock = ContinuousClock()
        for _ in 0..<count {
            let start = clock.now
            _ = try client.token(provider: "demo", user: user)
            let elapsed = clock.now - start
            out.append(Double(elapsed.components.seconds) * 1e3 + Double(elapsed.components.attoseconds) / 1e15)
        }
        return out
    }

    static func p99(_ values: [Double]) -> Double {
        let sorted = values.sorted()
        return sorted[min(sorted.count - 1, Int(Double(sorted.count) * 0.99))]
    }

    @Test("Should keep another client's GetToken p99 near its unattacked value while 4 connections send ~1 MiB calls")
    func largeCallsDoNotHoldTheLoop() throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("parse")
        let client = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60)
        try client.login(provider: "demo", user: user, token: "tok_parse_cost_0123456789")
        _ = try ParseCostTests.latencies(client, user: user, count: 50)  // warm-up
        let calls = 400
        let baseline = ParseCostTests.p99(try ParseCostTests.latencies(client, user: user, count: calls))

        let state = AttackState()
        let group = DispatchGroup()
        // Two connections send numbers to GetToken, naming it first; one sends
        // objects naming it last; one sends objects to Login.
        for kind in [0, 0, 1, 2] {
            let path = fixture.socketPath
            DispatchQueue.global().async(group: group) {
                ParseCostTests.attack(path, message: ParseCostTests.attacks[kind], state: state)
            }
        }
        // Measured once the attack runs (its first replies came back), bounded in time.
        let deadline = ContinuousClock.now + .seconds(60)
        while state.answered.load(ordering: .relaxed) < 4, ContinuousClock.now < deadline { usleep(1000) }
        // At least as many calls as alone, and for as long as 20 large calls take.
        let before = state.answered.load(ordering: .relaxed)
        var attacked: [Double] = []
        let end = ContinuousClock.now + .seconds(60)
        while attacked.count < calls || state.answered.load(ordering: .relaxed) - before < 20,
            attacked.count < 200_000, ContinuousClock.now < end
        {
            attacked += try ParseCostTests.latencies(client, user: user, count: 50)
        }
        let during = state.answered.load(ordering: .relaxed) - before
        state.stop.store(true, ordering: .relaxed)
        #expect(group.wait(timeout: .now() + 60) == .success)

        let p99 = ParseCostTests.p99(attacked)
        let report =
            "GetToken p99 \(String(format: "%.2f", baseline)) ms alone, \(String(format: "%.2f", p99)) ms under attack (\(attacked.count) calls; \(during) large calls answered meanwhile)"
        print(report)
        // The attack ran throughout: several large calls were answered while measuring.
        #expect(during >= 20, "\(report)")
        // Each parse of ~1 MiB took ~40 ms of the loop before the limit (p99
        // 40-160 ms); a loaded 2-core machine adds some of its own.
        #expect(p99 <= 3 * baseline + 15, "\(report)")
        #expect(fixture.daemon?.process.isRunning == true)
    }

    /// Sends `message` again and again on a connection of its own, reading
    /// each answer, until `stop`; a connection vaultd closes is opened again.
    static func attack(_ path: String, message: [UInt8], state: AttackState) {
        var fd: Int32 = -1
        var rounds = 0
        while !state.stop.load(ordering: .relaxed), rounds < 10_000 {
            rounds += 1
            if fd < 0 { fd = (try? UnixSocket.connect(to: path)) ?? -1 }
            if fd < 0 { return }
            guard sendAll(fd, message), readReply(fd) else {
                close(fd)
                fd = -1
                continue
            }
            state.answered.add(1, ordering: .relaxed)
        }
        if fd >= 0 { close(fd) }
    }

    static func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { send(fd, $0.baseAddress! + offset, $0.count - offset, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            offset += n
        }
        return true
    }

    /// Reads up to the reply's NUL; false when the connection ends first.
    static func readReply(_ fd: Int32) -> Bool {
        var buffer = [UInt8](repeating: 0, count: 4096)
        for _ in 0..<1024 {
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return false }
            if buffer[0..<n].contains(0) { return true }
        }
        return false
    }
}

/// Shared by the attacking threads and the test.
final class AttackState: Sendable {
    /// The attack is over.
    let stop = Atomic<Bool>(false)
    /// Large calls answered so far.
    let answered = Atomic<Int>(0)
}
