import Testing
import VaultCore

private let file = "/etc/vaultd/vaultd.conf"

/// An oauth2 provider `o` with `extra` lines after its required keys (line 5 on).
private func oauth2(_ extra: String..., tokenURL: String = "https://login.example.com:8443/services/oauth2/token")
    throws(VaultError) -> OAuth2Settings?
{
    let lines = ["[Provider o]", "Type=oauth2", "TokenURL=\(tokenURL)", "ClientID=c"] + extra
    return try ConfigParser.parse(lines.joined(separator: "\n"), file: file).providers["o"]?.oauth2
}

private func error(_ extra: String...) -> VaultError? {
    do {
        let lines = ["[Provider o]", "Type=oauth2", "TokenURL=https://login.example.com/token", "ClientID=c"] + extra
        _ = try ConfigParser.parse(lines.joined(separator: "\n"), file: file)
        return nil
    } catch { return error }
}

/// `Grant=`, `JWTKeyFile=`, `JWTIssuer=`, `JWTAudience=` (issue 32, item 4)
/// and `TokenEndpointAuthMethod=private_key_jwt` (item 1).
@Suite("JWT bearer and private_key_jwt configuration", .timeLimit(.minutes(5)))
struct JWTBearerConfigTests {
    @Test("Should default to the client credentials grant, with no key")
    func defaults() throws {
        let settings = try #require(try oauth2())
        #expect(settings.grant == .clientCredentials)
        #expect(settings.jwtKeyFile == nil)
    }

    @Test("Should read Grant=jwt-bearer with its key; issuer the client id, audience the token URL's origin")
    func jwtBearer() throws {
        let settings = try #require(try oauth2("Grant=jwt-bearer", "JWTKeyFile=sf.pem"))
        #expect(settings.grant == .jwtBearer)
        #expect(settings.jwtKeyFile == "sf.pem")
        #expect(settings.assertionIssuer == "c")
        #expect(settings.assertionAudience == "https://login.example.com:8443")
        let loopback = try #require(
            try oauth2("Grant=jwt-bearer", "JWTKeyFile=/k", tokenURL: "http://127.0.0.1:9/token?x=1"))
        #expect(loopback.assertionAudience == "http://127.0.0.1:9")
    }

    @Test("Should take JWTIssuer= and JWTAudience= over the defaults")
    func issuerAudience() throws {
        let settings = try #require(
            try oauth2(
                "Grant=jwt-bearer", "JWTKeyFile=sf.pem", "JWTIssuer=3MVG9", "JWTAudience=https://login.salesforce.com"))
        #expect(settings.assertionIssuer == "3MVG9")
        #expect(settings.assertionAudience == "https://login.salesforce.com")
    }

    @Test("Should read private_key_jwt with the key, for either grant")
    func privateKeyJWT() throws {
        let settings = try #require(try oauth2("TokenEndpointAuthMethod=private_key_jwt", "JWTKeyFile=/etc/k.pem"))
        #expect(settings.tokenEndpointAuthMethod == .privateKeyJWT)
        #expect(settings.grant == .clientCredentials)
        #expect(!TokenEndpointAuthMethod.privateKeyJWT.usesSecret)
    }

    @Test("Should refuse an unknown grant, naming the ones accepted")
    func unknownGrant() {
        #expect(
            error("Grant=password")?.message
                == "\(file):5: key 'Grant': expected one of: client-credentials, jwt-bearer")
    }

    @Test("Should refuse Grant=jwt-bearer and private_key_jwt without JWTKeyFile=")
    func keyRequired() {
        #expect(
            error("Grant=jwt-bearer")?.message
                == "\(file):1: [Provider o] with Grant=jwt-bearer needs JWTKeyFile= (a PEM private key, RSA or EC P-256)"
        )
        #expect(
            error("TokenEndpointAuthMethod=private_key_jwt")?.message
                == "\(file):1: [Provider o] with TokenEndpointAuthMethod=private_key_jwt needs JWTKeyFile= (a PEM private key, RSA or EC P-256)"
        )
    }

    @Test("Should refuse a key nothing signs with, and an issuer or audience without the JWT bearer grant")
    func unused() {
        #expect(
            error("JWTKeyFile=k.pem")?.message
                == "\(file):5: key 'JWTKeyFile': [Provider o] signs nothing with it; it is for Grant=jwt-bearer or TokenEndpointAuthMethod=private_key_jwt"
        )
        #expect(
            error("TokenEndpointAuthMethod=private_key_jwt", "JWTKeyFile=k", "JWTAudience=x")?.message
                == "\(file):7: key 'JWTAudience' is for Grant=jwt-bearer")
        #expect(
            error("Grant=jwt-bearer", "JWTKeyFile=k", "JWTIssuer=a b")?.message
                == "\(file):7: key 'JWTIssuer': expected a value without spaces")
    }

    @Test("Should refuse the keys outside an oauth2 provider")
    func onlyOAuth2() throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Provider s]\nType=static\nGrant=jwt-bearer", file: file)
        }
        #expect(error.message == "\(file):3: key 'Grant' is for Type=oauth2, not Type=static")
    }
}
