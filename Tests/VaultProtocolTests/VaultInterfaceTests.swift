import Foundation
import Testing
import VaultCore
import VaultProtocol

/// The repository's root, found from this file's path: Tests/VaultProtocolTests/<file>.
private let repositoryRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

@Suite("VaultInterface", .timeLimit(.minutes(5)))
struct VaultInterfaceTests {
    @Test("Should embed exactly the text of docs/io.vaultd.Vault.varlink")
    func matchesDocs() throws {
        let url = repositoryRoot.appendingPathComponent("docs/io.vaultd.Vault.varlink")
        var file = try String(contentsOf: url, encoding: .utf8)
        if file.hasSuffix("\n") { file.removeLast() }
        var embedded = VaultInterface.description
        if embedded.hasSuffix("\n") { embedded.removeLast() }
        #expect(embedded == file)
    }

    @Test("Should be the interface io.vaultd.Vault")
    func name() {
        #expect(VaultInterface.name == "io.vaultd.Vault")
        #expect(VaultInterface.description.split(separator: "\n").contains("interface io.vaultd.Vault"))
    }

    @Test("Should declare every error code with code and message", arguments: VaultError.Code.allCases)
    func declaresError(code: VaultError.Code) {
        let lines = VaultInterface.description.split(separator: "\n").map(String.init)
        #expect(lines.contains("error \(code.varlinkErrorName) (code: string, message: string)"))
    }

    @Test("Should declare no error without a code")
    func noExtraErrors() {
        let declared = VaultInterface.description.split(separator: "\n").filter { $0.hasPrefix("error ") }.count
        #expect(declared == VaultError.Code.allCases.count)
    }

    @Test("Should declare every method", arguments: VaultMethod.allCases)
    func declaresMethod(method: VaultMethod) throws {
        let shortName = try #require(method.rawValue.split(separator: ".").last)
        #expect(method.rawValue == "io.vaultd.Vault.\(shortName)")
        #expect(VaultInterface.description.contains("\nmethod \(shortName)("))
    }

    @Test("Should declare no method that is not a VaultMethod")
    func noExtraMethods() {
        let declared = VaultInterface.description.split(separator: "\n").filter { $0.hasPrefix("method ") }.count
        #expect(declared == VaultMethod.allCases.count)
    }
}
