import Foundation
import Glibc
import Synchronization
import Testing

/// A small seeded generator (SplitMix64), so that a mutant is named by its
/// seed and number and made again exactly.
struct SeededGenerator: RandomNumberGenerator {
    var state: UInt64

    init(seed: UInt64) { state = seed }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// Mutations of a configuration file, as a careless edit, a bad disk or a
/// hostile file would make them.
enum ConfigMutator {
    /// A value an error must never quote; put only after a `Key=`.
    static let marker = "zq9Xmarker"

    /// The mutant number `index` of `original` under `seed`: one to three
    /// mutations, then, every fourth time, the marker as a value. Returns the
    /// bytes and what was done.
    static func mutant(of original: [UInt8], seed: UInt64, index: Int) -> (
        bytes: [UInt8], steps: [String], marked: Bool
    ) {
        var random = SeededGenerator(seed: seed &+ UInt64(index) &* 0x1_0000_0001)
        var bytes = original
        var steps: [String] = []
        for _ in 0..<Int.random(in: 1...3, using: &random) {
            steps.append(mutate(&bytes, &random))
        }
        let marked = index % 4 == 0
        if marked { steps.append(markValue(&bytes, &random)) }
        return (bytes, steps, marked)
    }

    /// The lines of `bytes` (split on LF, kept without it).
    static func lines(_ bytes: [UInt8]) -> [[UInt8]] {
        bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).map(Array.init)
    }

    static func joined(_ lines: [[UInt8]]) -> [UInt8] { Array(lines.joined(separator: [UInt8(ascii: "\n")])) }

    static let interesting: [UInt8] = [
        0x00, 0x0A, 0x0D, 0x0C, 0x09, 0x20, 0x3D, 0x5B, 0x5D, 0x23, 0x7F, 0x80, 0xC3, 0xFF,
    ]
    static let keys = [
        "Type", "Command", "TokenURL", "ClientID", "Timeout", "MaxConcurrentHelpers", "StoreTimeout", "SocketMode",
        "MaxConnections", "MaxConnectionsPerUser", "MaxOutputPerConnection", "Owner", "TokenReadUsers",
        "DefaultLifetime", "MinRefreshInterval", "MaxSessionSize", "SingleAccount", "StoreScope",
    ]
    static let hugeValues = [
        String(repeating: "9", count: 400), "1e999999", String(repeating: "1h ", count: 20000),
        String(repeating: "x", count: 200_000), "-" + String(repeating: "1", count: 30), "9223372036854775807s",
        "18446744073709551616", "0x10", "\u{FEFF}30", "３０", "1min" + String(repeating: " 1s", count: 5000),
        "https://" + String(repeating: "a", count: 70000), "/" + String(repeating: "a/", count: 50000),
    ]
    static let weirdLines = [
        "=", "=value", " = ", "Type", "[", "]", "[]", "[Vault", "[Provider]", "[Provider ]", "[Provider a b]",
        "[Account]", "[Account a]", "[Account a b c]", "[Account \u{1F600} \u{1F600}]", "[Provider \u{0301}]",
        "[provider demo]", "[VAULT]", "Ｔｙｐｅ=static", "Type\u{00A0}=static",
        String(repeating: "K", count: 100_000) + "=1",
        "Type=static=exec", "#" + String(repeating: "#", count: 100_000),
        "[Provider " + String(repeating: "p", count: 300) + "]",
        "\u{FEFF}[Vault]", "Type==", "; comment", "  [Vault]  ", "[Vault]x",
    ]

    static func mutate(_ bytes: inout [UInt8], _ random: inout SeededGenerator) -> String {
        var lines = Self.lines(bytes)
        switch Int.random(in: 0..<10, using: &random) {
        case 0 where !bytes.isEmpty:
            let at = Int.random(in: 0..<bytes.count, using: &random)
            let bit = UInt8(1) << UInt8.random(in: 0..<8, using: &random)
            bytes[at] ^= bit
            return "flip bit \(bit) of byte \(at)"
        case 1 where !bytes.isEmpty:
            let at = Int.random(in: 0..<bytes.count, using: &random)
            let value = interesting.randomElement(using: &random)!
            bytes[at] = value
            return "byte \(at) := \(value)"
        case 2 where lines.count > 1:
            let at = Int.random(in: 0..<lines.count, using: &random)
            lines.remove(at: at)
            bytes = joined(lines)
            return "delete line \(at + 1)"
        case 3 where !lines.isEmpty:
            let at = Int.random(in: 0..<lines.count, using: &random)
            let to = Int.random(in: 0...lines.count, using: &random)
            lines.insert(lines[at], at: to)
            bytes = joined(lines)
            return "copy line \(at + 1) to \(to + 1)"
        case 4 where !bytes.isEmpty:
            let at = Int.random(in: 0..<bytes.count, using: &random)
            bytes.removeSubrange(at...)
            return "truncate at \(at)"
        case 5:
            let candidates = lines.indices.filter { lines[$0].contains(UInt8(ascii: "=")) && lines[$0].first != 0x23 }
            guard let at = candidates.randomElement(using: &random) else { return "no value to enlarge" }
            let key = lines[at].prefix { $0 != UInt8(ascii: "=") }
            let value = hugeValues.randomElement(using: &random)!
            lines[at] = Array(key) + [UInt8(ascii: "=")] + Array(value.utf8)
            bytes = joined(lines)
            return "line \(at + 1): a value of \(value.utf8.count) bytes"
        case 6:
            let at = Int.random(in: 0...lines.count, using: &random)
            let line = weirdLines.randomElement(using: &random)!
            lines.insert(Array(line.utf8), at: at)
            bytes = joined(lines)
            return "insert a weird line of \(line.utf8.count) bytes at \(at + 1)"
        case 7:
            let at = Int.random(in: 0...lines.count, using: &random)
            let key = keys.randomElement(using: &random)!
            let value = hugeValues.randomElement(using: &random)!
            lines.insert(Array("\(key)=\(value)".utf8), at: at)
            bytes = joined(lines)
            return "insert \(key)= with \(value.utf8.count) bytes at \(at + 1)"
        case 8:
            let at = Int.random(in: 0...bytes.count, using: &random)
            let junk = (0..<Int.random(in: 1...16, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random)
            }
            bytes.insert(contentsOf: junk, at: at)
            return "insert \(junk.count) random bytes at \(at)"
        default:
            guard lines.count > 1 else { return "nothing to swap" }
            let a = Int.random(in: 0..<lines.count, using: &random)
            let b = Int.random(in: 0..<lines.count, using: &random)
            lines.swapAt(a, b)
            bytes = joined(lines)
            return "swap lines \(a + 1) and \(b + 1)"
        }
    }

    /// Puts the marker in the value of a known key's line (or a new one).
    static func markValue(_ bytes: inout [UInt8], _ random: inout SeededGenerator) -> String {
        var lines = Self.lines(bytes)
        let key = keys.randomElement(using: &random)!
        let value = ["\(marker)", "1h \(marker)", "/bin/\(marker)", "http://\(marker)", "\(marker) x"]
            .randomElement(using: &random)!
        let at = Int.random(in: 0...lines.count, using: &random)
        lines.insert(Array("\(key)=\(value)".utf8), at: at)
        bytes = joined(lines)
        return "insert \(key)=<marker value> at \(at + 1)"
    }
}

/// Mutations of every shipped configuration through the real
/// `vaultd --check-config` (issue 13): it never dies of a signal or hangs,
/// and it either accepts the file or names the file and line at fault,
/// never quoting a value.
@Suite("Config fuzz against vaultd --check-config", .ownThreads, .timeLimit(.minutes(5)))
struct ConfigFuzzTests {
    static let configs = [
        "config/vaultd.conf", "config/examples/cometchat.conf", "config/examples/openim.conf",
        "config/examples/salesforce.conf",
    ]

    /// A shipped configuration as installed: its helpers' `Command=` point at
    /// the examples' helpers (--check-config refuses a helper that is missing).
    static func installed(_ name: String) throws -> [UInt8] {
        let text = try String(contentsOf: Binaries.packageRoot.appendingPathComponent(name), encoding: .utf8)
        let helpers = Binaries.packageRoot.appendingPathComponent("config/examples").path + "/"
        return Array(text.replacingOccurrences(of: "/usr/local/libexec/vaultd/", with: helpers).utf8)
    }

    @Test("Should accept every shipped configuration as it is (its helpers installed)")
    func originalsPass() throws {
        let directory = try TemporaryDirectory()
        for (index, name) in Self.configs.enumerated() {
            let path = directory.path("shipped-\(index).conf")
            try Data(try Self.installed(name)).write(to: URL(fileURLWithPath: path))
            let result = try runCommand(Binaries.vaultd, ["--config", path, "--check-config"])
            #expect(result.status == 0, "\(name): \(result.stderr)")
        }
    }

    @Test("Should answer each mutant with success or a FILE:LINE error, never a signal, a hang or a quoted value")
    func mutants() throws {
        let seed = UInt64(ProcessInfo.processInfo.environment["VAULTD_CONFIG_FUZZ_SEED"] ?? "") ?? 0x5EED_C0F1
        let perFile = Soak.size(short: 60, long: 1500)
        let budget = Soak.size(short: 90.0, long: 1200.0)
        let directory = try TemporaryDirectory()
        let base = directory.url.path
        let originals = try Self.configs.map { name in try Self.installed(name) }
        let total = originals.count * perFile
        let started = Date()
        let outcome = Mutex<(ran: Int, passed: Int, failures: [String], statuses: [Int32: Int])>((0, 0, [], [:]))
        DispatchQueue.concurrentPerform(iterations: total) { n in
            guard Date().timeIntervalSince(started) < budget else { return }
            let (fileIndex, index) = (n % originals.count, n / originals.count)
            let mutant = ConfigMutator.mutant(of: originals[fileIndex], seed: seed, index: index)
            let path = base + "/mutant-\(n).conf"
            let name = "\(Self.configs[fileIndex]) seed \(seed) mutant \(index) \(mutant.steps)"
            var problem: String?
            var status: Int32 = -1
            do {
                try Data(mutant.bytes).write(to: URL(fileURLWithPath: path))
                let result = try runCommand(Binaries.vaultd, ["--config", path, "--check-config"], seconds: 30)
                status = result.status
                problem = Self.problem(
                    result, path: path, lines: ConfigMutator.lines(mutant.bytes).count, marked: mutant.marked)
            } catch {
                problem = "did not run to its end: \(error)"
            }
            unlink(path)
            outcome.withLock { o in
                o.ran += 1
                o.statuses[status, default: 0] += 1
                if status == 0 { o.passed += 1 }
                if let problem { o.failures.append("\(name): \(problem)") }
            }
        }
        let result = outcome.withLock { $0 }
        let elapsed = Date().timeIntervalSince(started)
        #expect(result.failures.isEmpty, "\(result.failures.count) failures; first: \(result.failures.prefix(5))")
        #expect(result.ran >= min(total, 100), "only \(result.ran) of \(total) mutants ran in \(Int(elapsed)) s")
        print(
            "CONFIGFUZZ seed=\(seed) mutants=\(result.ran)/\(total) accepted=\(result.passed) statuses=\(result.statuses) "
                + "in \(String(format: "%.1f", elapsed)) s")
    }

    /// What is wrong with one run, or nil.
    static func problem(_ result: CommandResult, path: String, lines: Int, marked: Bool) -> String? {
        if marked && (result.stderr.contains(ConfigMutator.marker) || result.stdout.contains(ConfigMutator.marker)) {
            return "quoted a value: \(result.stderr)"
        }
        switch result.status {
        case 0:
            return result.stdout.contains("configuration is valid") ? nil : "exit 0 without saying so"
        case 1:
            // The error names the mutant and a line it has.
            guard let range = result.stderr.range(of: path + ":") else { return "no FILE:LINE in: \(result.stderr)" }
            let digits = result.stderr[range.upperBound...].prefix { $0.isNumber }
            guard let line = Int(digits), line >= 1, line <= lines else {
                return "line '\(digits)' is not one of the file's \(lines): \(result.stderr)"
            }
            return nil
        default:
            return
                "exit status \(result.status) (signal \(result.status > 128 ? result.status - 128 : 0)): \(result.stderr)"
        }
    }
}
