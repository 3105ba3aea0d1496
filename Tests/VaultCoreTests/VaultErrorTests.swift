import Testing
import VaultCore

@Suite("VaultError", .timeLimit(.minutes(5)))
struct VaultErrorTests {
    private let codes = VaultError.Code.allCases

    @Test("Should give every code a distinct seed code")
    func distinctSeedCodes() {
        #expect(Set(codes.map(\.seedCode)).count == codes.count)
        #expect(codes.count == 34)
    }

    @Test("Should give every code a distinct Varlink error name")
    func distinctVarlinkNames() {
        #expect(Set(codes.map(\.varlinkErrorName)).count == codes.count)
        for code in codes {
            #expect(code.varlinkErrorName.first?.isUppercase == true, "\(code)")
            #expect(code.varlinkErrorName.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) }, "\(code)")
        }
    }

    @Test("Should find each code from its seed code", arguments: VaultError.Code.allCases)
    func seedCodeRoundTrip(code: VaultError.Code) {
        #expect(VaultError.Code(seedCode: code.seedCode) == code)
    }

    @Test("Should find no code for an unknown seed code")
    func unknownSeedCode() {
        #expect(VaultError.Code(seedCode: "ERR_NOPE") == nil)
        #expect(VaultError.Code(seedCode: "") == nil)
    }

    @Test("Should use the seeds' codes for the well-known kinds")
    func seedCodes() {
        #expect(VaultError.Code.notLoggedIn.seedCode == "ERR_NOT_LOGGED_IN")
        #expect(VaultError.Code.invalidCredential.seedCode == "AUTH_ERR_AUTH_TOKEN_NOT_FOUND")
        #expect(VaultError.Code.unknownProvider.seedCode == "ERR_PROVIDER_NOT_FOUND")
        #expect(VaultError.Code.userDeactivated.seedCode == "ERR_USER_DEACTIVATED")
    }

    @Test("Should be equal when the codes are, whatever the messages")
    func equality() {
        #expect(VaultError(.storeLocked, "one") == VaultError(.storeLocked, "two"))
        #expect(VaultError(.storeLocked, "same") != VaultError(.storeFailed, "same"))
    }

    @Test("Should describe itself as seed code and message")
    func description() {
        #expect(VaultError(.storeLocked, "unlock it").description == "ERR_SECRET_STORE_LOCKED: unlock it")
    }

    @Test("Should tell how to log in when not logged in, and how to configure an unknown provider")
    func helpers() {
        let notLoggedIn = VaultError.notLoggedIn(Account(provider: "demo", user: "alice"))
        #expect(notLoggedIn.code == .notLoggedIn)
        #expect(notLoggedIn.message == "alice @ demo is not logged in; log in with 'vaultctl login demo alice'")
        let unknown = VaultError.unknownProvider("acme")
        #expect(unknown.code == .unknownProvider)
        #expect(unknown.message.contains("[Provider acme]"))
    }
}
