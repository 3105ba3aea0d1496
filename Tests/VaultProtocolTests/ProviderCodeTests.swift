import Testing
import VaultCore
import VaultProtocol

@Suite("Provider codes on the wire", .timeLimit(.minutes(5)))
struct ProviderCodeTests {
    @Test("Should send a helper's code as the reply's code under the kind's error name, and read it back")
    func providerCodeRoundTrip() {
        let error = VaultError(.invalidCredential, "the provider refused", providerCode: "AUTH_ERR_APIKEY_NOT_FOUND")
        let reply = error.varlinkReply
        #expect(reply.error == "io.vaultd.Vault.InvalidCredential")
        #expect(reply.parameters["code"]?.stringValue == "AUTH_ERR_APIKEY_NOT_FOUND")
        let back = VaultError(reply: reply)
        #expect(back?.code == .invalidCredential)
        #expect(back?.providerCode == "AUTH_ERR_APIKEY_NOT_FOUND")
        let own = VaultError(reply: VaultError(.notLoggedIn, "no").varlinkReply)
        #expect(own?.providerCode == nil && own?.replyCode == "ERR_NOT_LOGGED_IN")
    }
}
