import Foundation
import Testing
import VaultCLI

/// man/vaultctl.1.scd, the man page of vaultctl, against the command table.
@Suite("vaultctl(1)", .timeLimit(.minutes(5)))
struct ManPageTests {
    /// The scdoc source of the man page, read from the checkout.
    static func page() throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        return try String(contentsOf: root.appendingPathComponent("man/vaultctl.1.scd"), encoding: .utf8)
    }

    @Test("Should describe every command with its arguments and options, and every global option")
    func everyCommandAndOption() throws {
        let page = try Self.page()
        let commands = try #require(page.range(of: "\n# COMMANDS\n"), "no COMMANDS section")
        let commandText = page[commands.upperBound...]
        for spec in CommandTable.commands {
            // One paragraph per command, its first line the synopsis.
            let line = try #require(
                commandText.split(separator: "\n").first { $0.hasPrefix("*\(spec.name)*") },
                "man/vaultctl.1.scd has no paragraph for '\(spec.name)'")
            for argument in spec.required + spec.optional {
                #expect(
                    line.contains("_\(argument.name)_"), "vaultctl \(spec.name): \(argument.name) is not in '\(line)'")
            }
            for option in spec.options {
                #expect(line.contains("*\(option.name)*"), "vaultctl \(spec.name): \(option.name) is not in '\(line)'")
            }
        }
        let globals = try #require(page.range(of: "\n# GLOBAL OPTIONS\n"), "no GLOBAL OPTIONS section")
        let globalText = page[globals.upperBound..<commands.lowerBound]
        for option in CommandTable.globalOptions {
            for spelling in [option.name] + option.aliases {
                #expect(globalText.contains("*\(spelling)*"), "man/vaultctl.1.scd does not describe \(spelling)")
            }
        }
    }
}
