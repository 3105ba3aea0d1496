import Foundation
import Testing
import VaultDaemon

/// man/vaultd.8.scd, the man page of vaultd, against `vaultd --help`.
@Suite("vaultd(8)", .timeLimit(.minutes(5)))
struct ManPageTests {
    @Test("Should describe every option vaultd --help lists")
    func everyOption() throws {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        let page = try String(contentsOf: root.appendingPathComponent("man/vaultd.8.scd"), encoding: .utf8)
        let options = try #require(page.range(of: "\n# OPTIONS\n"), "no OPTIONS section")
        let optionText = page[options.upperBound...]
        // The options are the first word of the usage text's indented lines.
        let names = DaemonOptions.usage.split(separator: "\n").compactMap { line -> String? in
            let word = line.drop { $0 == " " }.prefix { $0 != " " }
            return line.hasPrefix("  --") ? String(word) : nil
        }
        #expect(names.count >= 7, "read \(names) from vaultd --help")
        for name in names {
            #expect(optionText.contains("\n*\(name)*"), "man/vaultd.8.scd does not describe \(name)")
        }
    }
}
