import Foundation
import Testing

@testable import VaultCore

/// man/vaultd.conf.5.scd, the man page of the configuration, against the parser.
@Suite("vaultd.conf(5)", .timeLimit(.minutes(5)))
struct ManPageTests {
    /// The scdoc source of the man page, read from the checkout.
    static func page() throws -> String {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
        return try String(contentsOf: root.appendingPathComponent("man/vaultd.conf.5.scd"), encoding: .utf8)
    }

    @Test("Should name every key the parser accepts, as *Key=*, in the section it belongs to")
    func everyKey() throws {
        let page = try Self.page()
        let sections: [(header: String, keys: [String])] = [
            ("# [Vault] SECTION", ConfigParser.vaultKeys),
            ("# [Provider NAME] SECTION", ConfigParser.providerKeys),
            ("# [Account PROVIDER USER] SECTION", ConfigParser.accountKeys),
            ("# [Etcd] SECTION", ConfigParser.etcdKeys),
        ]
        for (index, section) in sections.enumerated() {
            let start = try #require(page.range(of: "\n\(section.header)\n"), "no '\(section.header)' heading")
            let end = index + 1 < sections.count ? page.range(of: "\n\(sections[index + 1].header)\n")?.lowerBound : nil
            let text = page[start.upperBound..<(end ?? page.endIndex)]
            for key in section.keys {
                #expect(
                    text.contains("*\(key)=*"),
                    "man/vaultd.conf.5.scd does not describe \(key)= under \(section.header)")
            }
        }
    }

    @Test("Should name every provider type")
    func everyType() throws {
        let page = try Self.page()
        for type in ProviderType.allCases {
            #expect(
                page.contains("\t*\(type.rawValue)*:"), "man/vaultd.conf.5.scd does not describe Type=\(type.rawValue)")
        }
    }
}
