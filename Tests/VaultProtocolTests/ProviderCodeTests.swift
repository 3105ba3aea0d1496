import Testing
import VaultCore
import VaultProtocol

@Suite("Provider codes on the wire", .timeLimit(.minutes(5)))
struct ProviderCodeTests {
    @Test("Should send vaultd's code and the provider's code and words apart, and read them back, for every code")
    func everyCodeRoundTrips() {
        for code in VaultError.Code.allCases {
            let error = VaultError(
                code, "what happened", providerCode: "AUTH_ERR_APIKEY_NOT_FOUND", providerMessage: "its words")
            let reply = error.varlinkReply
            #expect(reply.error == "io.vaultd.Vault.\(code.varlinkErrorName)")
            #expect(reply.parameters["code"]?.stringValue == code.seedCode, "\(code)")
            #expect(reply.parameters["providerCode"]?.stringValue == "AUTH_ERR_APIKEY_NOT_FOUND")
            #expect(reply.parameters["providerMessage"]?.stringValue == "its words")
            let back = VaultError(reply: reply)
            #expect(back?.code == code)
            #expect(back?.message == "what happened")
            #expect(back?.providerCode == "AUTH_ERR_APIKEY_NOT_FOUND")
            #expect(back?.providerMessage == "its words")
        }
        let own = VaultError(reply: VaultError(.notLoggedIn, "no").varlinkReply)
        #expect(own?.providerCode == nil && own?.providerMessage == nil)
        #expect(VaultError(.notLoggedIn, "no").varlinkReply.parameters["providerCode"] == nil)
    }
}
