import Varlink
import VaultCore

// This file is compiled twice: into VaultCoreTests, where the corpus replay
// test calls it, and by scripts/fuzz into libFuzzer binaries (with
// Fuzz/Drivers/*.swift), so the short and the long form run the same code.
// It imports VaultCore only, never Testing.

/// The entry functions of the fuzz targets `json` and `config`. Each takes one
/// input, runs it through the code under test and checks what must hold
/// whatever the input; it answers nil, or what did not hold.
enum CoreFuzzEntry {
    /// `json`: the decoder every local user reaches. A refusal names a reason
    /// and an offset inside the input; a value prints to text that parses
    /// back to the same value and prints the same again; and only valid UTF-8
    /// is ever accepted.
    static func json(_ input: [UInt8]) -> String? {
        let value: JSON
        do {
            value = try JSON.parse(input)
        } catch {
            if error.reason.isEmpty { return "a refusal without a reason" }
            if error.offset < 0 || error.offset > input.count {
                return "offset \(error.offset) outside the input of \(input.count) bytes"
            }
            return nil
        }
        if String(validating: input, as: UTF8.self) == nil { return "accepted input that is not UTF-8" }
        let printed = value.serialized()
        let again: JSON
        do { again = try JSON.parse(printed) } catch { return "its own output does not parse: \(error)" }
        if again != value { return "printed and parsed back, the value changed" }
        if again.serialized() != printed { return "printing is not stable" }
        if printed.contains(0) { return "printed a raw NUL" }
        if depth(value) > 64 { return "accepted nesting deeper than 64" }
        return nil
    }

    /// The nesting depth of a value (a scalar is 0).
    static func depth(_ value: JSON) -> Int {
        switch value {
        case .array(let elements): return 1 + (elements.map(depth).max() ?? 0)
        case .object(let members): return 1 + (members.values.map(depth).max() ?? 0)
        default: return 0
        }
    }

    /// `config`: the configuration reader, as `vaultd --check-config` runs
    /// it. A form feed (0x0C) in the input starts the next drop-in file. A
    /// refusal is `invalidConfig` and starts with `FILE:LINE: ` naming one of
    /// the files and a line it has.
    static func config(_ input: [UInt8]) -> String? {
        let parts = input.split(separator: 0x0C, omittingEmptySubsequences: false)
        var layers: [(text: String, file: String)] = []
        var lineCounts: [String: Int] = [:]
        do throws(VaultError) {
            for (i, part) in parts.enumerated() {
                let file = i == 0 ? "/fuzz/vaultd.conf" : "/fuzz/vaultd.conf.d/\(i).conf"
                lineCounts[file] = part.count { $0 == UInt8(ascii: "\n") } + 1
                layers.append((try ConfigParser.text(of: Array(part), file: file), file))
            }
            _ = try ConfigParser.parse(layers: layers)
            return nil
        } catch {
            if error.code != .invalidConfig { return "refused with \(error.code), not invalidConfig" }
            return fileAndLineProblem(error.message, lineCounts)
        }
    }

    /// Nil when `message` starts with `FILE:LINE: ` for one of `lineCounts`'
    /// files and a line it has; else what is wrong.
    static func fileAndLineProblem(_ message: String, _ lineCounts: [String: Int]) -> String? {
        for (file, lines) in lineCounts where message.hasPrefix(file + ":") {
            let rest = message.dropFirst(file.count + 1)
            guard let colon = rest.firstIndex(of: ":"), let line = Int(rest[..<colon]) else { continue }
            if line >= 1 && line <= lines && rest[colon...].hasPrefix(": ") { return nil }
            return "line \(line) of \(file), which has \(lines)"
        }
        return "an error without FILE:LINE: \(message)"
    }
}
