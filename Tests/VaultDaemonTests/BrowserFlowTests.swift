import Testing
import Varlink
import VaultCore

@testable import VaultDaemon

/// The browser login's pure pieces (issue 32, item 3): PKCE's S256
/// challenge, the authorization URL, the loopback redirect URIs vaultd
/// takes (the table of pending logins: PendingLoginsTests).
@Suite("Browser login: PKCE, the authorization URL, loopback redirects", .timeLimit(.minutes(5)))
struct BrowserFlowTests {
    @Test("Should make RFC 7636 appendix B's challenge of its verifier")
    func appendixB() {
        let verifier = Secret("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
        #expect(BrowserFlow.challenge(of: verifier) == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
    }

    @Test("Should make verifiers of 43 unreserved characters, each new")
    func verifiers() {
        let made = (0..<16).map { _ in BrowserFlow.randomText(bytes: 32) }
        #expect(Set(made).count == made.count)
        for verifier in made {
            #expect(verifier.count == 43)
            #expect(verifier.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") })
        }
    }

    @Test("Should build the authorization request with every parameter encoded, after a query of its own")
    func authorizationURL() {
        var settings = OAuth2Settings(tokenURL: "https://login.example.com/token", clientID: "my app+1")
        settings.authorizationURL = "https://login.example.com/authorize"
        settings.scope = "openid profile"
        let url = BrowserFlow.authorizationURL(
            settings, redirectURI: "http://127.0.0.1:4711/", state: "s-1", challenge: "c_2")
        #expect(
            url == "https://login.example.com/authorize?response_type=code&client_id=my%20app%2B1"
                + "&redirect_uri=http%3A%2F%2F127.0.0.1%3A4711%2F&scope=openid%20profile&state=s-1"
                + "&code_challenge=c_2&code_challenge_method=S256")
        settings.authorizationURL = "https://login.example.com/authorize?prompt=consent"
        settings.scope = nil
        let withQuery = BrowserFlow.authorizationURL(
            settings, redirectURI: "http://127.0.0.1:1/", state: "s", challenge: "c")
        #expect(withQuery.hasPrefix("https://login.example.com/authorize?prompt=consent&response_type=code&"))
        #expect(!withQuery.contains("scope="))
    }

    @Test(
        "Should take only loopback listeners' redirect URIs",
        arguments: [
            ("http://127.0.0.1:4711/", true), ("http://127.0.0.1:1/cb", true), ("http://127.0.0.1:65535/", true),
            ("http://127.0.0.1:0/", false), ("http://127.0.0.1:65536/", false), ("http://127.0.0.1/", false),
            ("http://127.0.0.1:80", false), ("http://127.0.0.1:80/?x=1", false), ("http://127.0.0.1:80/#f", false),
            ("https://127.0.0.1:80/", false), ("http://localhost:80/", false), ("http://127.0.0.2:80/", false),
            ("http://127.0.0.1:80@evil.example/", false), ("http://127.0.0.1:80/ x", false),
        ])
    func loopbackRedirect(uri: String, taken: Bool) {
        #expect(BrowserFlow.isLoopbackRedirect(uri) == taken)
    }
}
