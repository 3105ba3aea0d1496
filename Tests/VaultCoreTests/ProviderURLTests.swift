import Testing
import VaultCore

private let file = "/etc/vaultd/vaultd.conf"

/// An oauth2 provider whose token endpoint is `url`, with `extra` lines after it.
private func oauth2(_ url: String, _ extra: String...) throws(VaultError) -> VaultConfig {
    let lines = ["[Provider web]", "Type=oauth2", "ClientID=c", "TokenURL=\(url)"] + extra
    return try ConfigParser.parse(lines.joined(separator: "\n"), file: file)
}

/// Issue 13: a misconfigured token URL must not send refresh tokens in clear.
@Suite("Provider URLs", .timeLimit(.minutes(5)))
struct ProviderURLTests {
    @Test(
        "Should take http:// to a loopback host",
        arguments: [
            "http://127.0.0.1:8080/token", "http://127.0.0.1/token", "http://127.1.2.3:9/t", "http://localhost:80/t",
            "http://LOCALHOST/t", "http://[::1]:8080/token", "http://[::1]/t", "http://127.0.0.1?x=1",
        ])
    func loopback(url: String) throws {
        #expect(ProviderURL.isLoopbackHTTP(url))
        #expect(try oauth2(url).providers["web"]?.oauth2?.tokenURL == url)
    }

    @Test(
        "Should refuse http:// to any other host, naming file, line, key and the fix, without quoting the URL",
        arguments: [
            "http://example.com/token", "http://10.0.0.1/t", "http://127.0.0.1.example.com/t",
            "http://127.0.0.1@example.com/t", "http://2130706433/t", "http://0x7f.0.0.1/t", "http://127.0.0.1:80:1/t",
            "http://[::2]/t", "http://[::1]x/t", "http://localhost.example.com/t", "http://128.0.0.1/t",
            "http://127.0.0.256/t",
        ])
    func notLoopback(url: String) throws {
        #expect(!ProviderURL.isLoopbackHTTP(url))
        let error = try #require(throws: VaultError.self) { try oauth2(url) }
        #expect(error.code == .invalidConfig)
        #expect(error.message.hasPrefix("\(file):4: key 'TokenURL': an http:// URL sends refresh tokens"))
        #expect(error.message.contains("use https://, or add AllowInsecureHTTP=yes to [Provider web]"))
        #expect(!error.message.contains(url), "the value is not quoted")
    }

    @Test("Should refuse a non-loopback http:// RevocationURL the same way")
    func revocationURL() throws {
        let error = try #require(throws: VaultError.self) {
            try oauth2("https://example.com/token", "RevocationURL=http://example.com/revoke")
        }
        #expect(error.message.hasPrefix("\(file):5: key 'RevocationURL': an http:// URL"), "\(error.message)")
    }

    @Test("Should take any https:// URL, and http:// to another host with AllowInsecureHTTP=yes")
    func allowed() throws {
        #expect(try oauth2("https://example.com/token").providers["web"]?.oauth2?.allowInsecureHTTP == false)
        let insecure = try oauth2(
            "http://example.com/token", "AllowInsecureHTTP=yes", "RevocationURL=http://example.com/revoke")
        #expect(insecure.providers["web"]?.oauth2?.allowInsecureHTTP == true)
        #expect(insecure.providers["web"]?.oauth2?.revocationURL == "http://example.com/revoke")
        // Set after the URL in the section, the key counts all the same.
        let later = try ConfigParser.parse(
            ["[Provider web]", "Type=oauth2", "TokenURL=http://example.com/t", "ClientID=c", "AllowInsecureHTTP=yes"]
                .joined(separator: "\n"), file: file)
        #expect(later.providers["web"]?.oauth2?.tokenURL == "http://example.com/t")
    }

    @Test("Should refuse AllowInsecureHTTP that is no yes or no, and outside an oauth2 provider")
    func badKey() throws {
        let error = try #require(throws: VaultError.self) {
            try oauth2("https://example.com/t", "AllowInsecureHTTP=maybe")
        }
        #expect(error.message == "\(file):5: key 'AllowInsecureHTTP': expected yes or no")
        let static_ = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Provider s]\nType=static\nAllowInsecureHTTP=yes", file: file)
        }
        #expect(static_.message == "\(file):3: key 'AllowInsecureHTTP' is for Type=oauth2, not Type=static")
    }
}
