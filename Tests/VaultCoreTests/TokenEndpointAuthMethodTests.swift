import Testing
import VaultCore

private let file = "/etc/vaultd/vaultd.conf"

/// An oauth2 provider `o` with `extra` lines after its required keys.
private func oauth2(_ extra: String...) throws(VaultError) -> OAuth2Settings? { try oauth2(extra) }

/// An oauth2 provider `o` with `extra` lines after its required keys.
private func oauth2(_ extra: [String]) throws(VaultError) -> OAuth2Settings? {
    let lines = ["[Provider o]", "Type=oauth2", "TokenURL=https://example.com/token", "ClientID=c"] + extra
    return try ConfigParser.parse(lines.joined(separator: "\n"), file: file).providers["o"]?.oauth2
}

/// `TokenEndpointAuthMethod=` (issue 32, item 1): RFC 7591's names, the
/// default by whether there is a secret; private_key_jwt with JWTKeyFile=
/// (JWTBearerConfigTests).
@Suite("TokenEndpointAuthMethod", .timeLimit(.minutes(5)))
struct TokenEndpointAuthMethodTests {
    @Test(
        "Should read each method vaultd speaks by its RFC 7591 name",
        arguments: [
            ("client_secret_basic", TokenEndpointAuthMethod.clientSecretBasic),
            ("client_secret_post", .clientSecretPost), ("none", .none), ("private_key_jwt", .privateKeyJWT),
        ])
    func names(name: String, method: TokenEndpointAuthMethod) throws {
        let key = method == .privateKeyJWT ? ["JWTKeyFile=key.pem"] : []
        #expect(try oauth2(["TokenEndpointAuthMethod=\(name)"] + key)?.tokenEndpointAuthMethod == method)
    }

    @Test("Should leave the method unset without the key: the default is chosen by whether there is a secret")
    func defaultMethod() throws {
        #expect(try oauth2()?.tokenEndpointAuthMethod == nil)
        #expect(try oauth2("ClientSecretFile=secret")?.tokenEndpointAuthMethod == nil)
        #expect(TokenEndpointAuthMethod.defaultMethod(hasSecret: true) == .clientSecretBasic)
        #expect(TokenEndpointAuthMethod.defaultMethod(hasSecret: false) == .none)
    }

    @Test(
        "Should refuse any other value, naming the ones accepted",
        arguments: ["basic", "Client_Secret_Basic", "", "client_secret_jwt", "tls_client_auth"])
    func unknown(value: String) throws {
        let error = try #require(throws: VaultError.self) { try oauth2("TokenEndpointAuthMethod=\(value)") }
        #expect(error.code == .invalidConfig)
        #expect(
            error.message
                == "\(file):5: key 'TokenEndpointAuthMethod': expected one of: client_secret_basic, client_secret_post, none, private_key_jwt"
        )
    }

    @Test("Should refuse the key outside an oauth2 provider")
    func onlyOAuth2() throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Provider s]\nType=static\nTokenEndpointAuthMethod=none", file: file)
        }
        #expect(error.message == "\(file):3: key 'TokenEndpointAuthMethod' is for Type=oauth2, not Type=static")
    }
}
