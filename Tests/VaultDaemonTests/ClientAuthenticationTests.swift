import Foundation
import Testing
import VaultCore

@testable import VaultDaemon

/// How vaultd authenticates its client at the token endpoint (RFC 6749
/// section 2.3.1, issue 32 item 1): the Basic credentials' encoding and
/// which method a client uses.
@Suite("Client authentication", .timeLimit(.minutes(5)))
struct ClientAuthenticationTests {
    func settings(_ method: TokenEndpointAuthMethod? = nil) -> OAuth2Settings {
        var settings = OAuth2Settings(tokenURL: "https://example.com/token", clientID: "c")
        settings.tokenEndpointAuthMethod = method
        return settings
    }

    @Test(
        "Should form-urlencode the id and the secret each, then join them with ':' in base64",
        arguments: [
            ("vaultd-test", "s3cr3t", "dmF1bHRkLXRlc3Q6czNjcjN0"),
            // ':' in the id, '%', '+', '/', ' ', '=', '&' and non-ASCII: each as %XX, a space as %20.
            (
                "my client:1+é", "p@ss:w0rd%20+/ =&é",
                "bXklMjBjbGllbnQlM0ExJTJCJUMzJUE5OnAlNDBzcyUzQXcwcmQlMjUyMCUyQiUyRiUyMCUzRCUyNiVDMyVBOQ=="
            ),
        ])
    func basicCredentials(id: String, secret: String, expected: String) {
        let bytes = OAuth2Client.basicCredentials(clientID: id, secret: Secret(secret))
        #expect(String(decoding: bytes, as: UTF8.self) == expected)
        // Decoded as a server does: base64, split at the first ':', percent-decoded.
        let pair = String(decoding: Base64.decode(expected) ?? [], as: UTF8.self)
        let parts = pair.split(separator: ":", maxSplits: 1).map { $0.removingPercentEncoding ?? "" }
        #expect(parts == [id, secret])
    }

    @Test("Should use client_secret_basic with a secret and none without one, unless the key says otherwise")
    func method() {
        #expect(OAuth2Client(settings: settings(), clientSecret: Secret("s")).authMethod == .clientSecretBasic)
        #expect(OAuth2Client(settings: settings(), clientSecret: nil).authMethod == .none)
        for method in TokenEndpointAuthMethod.allCases {
            #expect(OAuth2Client(settings: settings(method), clientSecret: Secret("s")).authMethod == method)
            #expect(OAuth2Client(settings: settings(method), clientSecret: nil).authMethod == method)
        }
    }

    @Test("Should not send a request that needs a secret there is none of, and say so without a secret")
    func missingSecret() async {
        // An address nothing listens on: a request sent would fail as refused, not as this.
        var unreachable = settings(.clientSecretBasic)
        unreachable.tokenURL = "http://127.0.0.1:9/token"
        let client = OAuth2Client(settings: unreachable, clientSecret: nil, timeoutSeconds: 5)
        let outcome = await client.clientCredentials()
        guard case .transient(let reason, _, _) = outcome else {
            Issue.record("expected transient, got \(outcome)")
            return
        }
        #expect(reason.hasPrefix("TokenEndpointAuthMethod=client_secret_basic needs a client secret"))
    }
}
