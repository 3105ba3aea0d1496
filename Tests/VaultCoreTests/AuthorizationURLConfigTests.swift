import Testing
import VaultCore

private let file = "/etc/vaultd/vaultd.conf"

/// `[Provider] AuthorizationURL=` (issue 32, item 3): the browser login's
/// authorization endpoint, checked as the other endpoints are.
@Suite("AuthorizationURL configuration", .timeLimit(.minutes(5)))
struct AuthorizationURLConfigTests {
    func parse(_ extra: String..., type: String = "oauth2") throws(VaultError) -> ProviderConfig? {
        var lines = ["[Provider o]", "Type=\(type)"]
        if type == "oauth2" { lines += ["TokenURL=https://login.example.com/token", "ClientID=c"] }
        return try ConfigParser.parse((lines + extra).joined(separator: "\n"), file: file).providers["o"]
    }

    @Test("Should take an https:// or loopback http:// authorization endpoint, with a query of its own")
    func accepted() throws {
        #expect(try parse()?.oauth2?.authorizationURL == nil)
        for url in [
            "https://login.example.com/authorize", "https://login.example.com/authorize?prompt=consent",
            "http://127.0.0.1:8080/authorize",
        ] {
            #expect(try parse("AuthorizationURL=\(url)")?.oauth2?.authorizationURL == url)
        }
    }

    @Test(
        "Should refuse a bad authorization endpoint, naming file, line and key",
        arguments: [
            "ftp://login.example.com/authorize", "https://login.example.com/a b", "http://login.example.com/a", "",
        ]
    )
    func refused(url: String) {
        #expect {
            _ = try parse("AuthorizationURL=\(url)")
        } throws: { error in
            let message = (error as? VaultError)?.message ?? ""
            return message.hasPrefix("\(file):5: key 'AuthorizationURL'")
        }
    }

    @Test("Should refuse AuthorizationURL= in a provider that is not oauth2")
    func notOAuth2() {
        #expect {
            _ = try parse("AuthorizationURL=https://login.example.com/authorize", type: "static")
        } throws: { error in
            (error as? VaultError)?.message.contains("key 'AuthorizationURL' is for Type=oauth2") == true
        }
    }
}
