import Foundation
import Testing
import Varlink

/// A private key made with `openssl genpkey` for one test run, and its public half.
struct TestKeyPair {
    /// The key's kind as the server imports it: RSA (RS256) or EC (ES256, P-256).
    let type: String
    /// The PEM private key, mode 600: vaultd's `JWTKeyFile=`.
    let privateKey: String
    /// The PEM public key the server checks signatures with.
    let publicKey: String

    /// A new key of `type` in `directory`, its files named after `name`.
    init(_ type: String, in directory: TemporaryDirectory, name: String) throws {
        self.type = type
        privateKey = directory.path("\(name).pem")
        publicKey = directory.path("\(name).pub")
        let openssl = URL(fileURLWithPath: "/usr/bin/openssl")
        let options =
            type == "RSA"
            ? ["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]
            : ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
        for arguments in [
            ["genpkey", "-out", privateKey] + options, ["pkey", "-in", privateKey, "-pubout", "-out", publicKey],
        ] {
            let result = try runCommand(openssl, arguments)
            guard result.status == 0 else { throw HarnessError("openssl \(arguments[0]) failed: \(result.stderr)") }
        }
        guard chmod(privateKey, 0o600) == 0 else { throw HarnessError("chmod \(privateKey) failed") }
    }

    /// The lines of the private key's base64 body: none may be in any output.
    func privateLines() throws -> [String] {
        try String(contentsOfFile: privateKey, encoding: .utf8).split(separator: "\n")
            .filter { !$0.hasPrefix("-----") }.map(String.init)
    }
}

/// The JWT bearer grant (`Grant=jwt-bearer`, issue 32 item 4) and
/// `private_key_jwt` client authentication (item 1) against the real
/// Authlib server, which checks each JWT's signature with the public key
/// registered for the client, and its issuer, subject, audience, expiry
/// and `jti`.
@Suite(
    "JWT bearer and private_key_jwt against Authlib", .requiresKeyring, .requiresAuthlib, .ownThreads,
    .timeLimit(.minutes(5)))
struct JWTBearerTests {
    static let grantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"

    /// A client that may use the JWT bearer grant with `key`.
    func bearerClient(_ key: TestKeyPair) -> AuthlibServer.Registration {
        AuthlibServer.Registration(
            id: "vaultd-jwt-\(key.type)", secret: nil, method: "none", publicKey: (key.publicKey, key.type),
            jwtBearer: true)
    }

    /// A client registered for `private_key_jwt` with `key`.
    func keyClient(_ key: TestKeyPair) -> AuthlibServer.Registration {
        AuthlibServer.Registration(
            id: "vaultd-pkjwt-\(key.type)", secret: nil, method: "private_key_jwt",
            publicKey: (key.publicKey, key.type))
    }

    /// Checks an assertion as the server saw it: `alg` by the key's kind,
    /// the claims, an expiry within 3 minutes, a `jti`; returns the `jti`.
    @discardableResult
    func expectAssertion(
        _ assertion: JSON?, key: TestKeyPair, iss: String, sub: String, aud: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> String? {
        let header = assertion?["header"]
        let claims = assertion?["claims"]
        let rsa = key.type == "RSA"
        #expect(header?["alg"]?.stringValue == (rsa ? "RS256" : "ES256"), sourceLocation: sourceLocation)
        #expect(assertion?["signature_bytes"]?.integerValue == (rsa ? 256 : 64), sourceLocation: sourceLocation)
        #expect(claims?["iss"]?.stringValue == iss, sourceLocation: sourceLocation)
        #expect(claims?["sub"]?.stringValue == sub, sourceLocation: sourceLocation)
        #expect(claims?["aud"]?.stringValue == aud, sourceLocation: sourceLocation)
        let now = Int64(Date().timeIntervalSince1970)
        let iat = claims?["iat"]?.integerValue ?? 0
        let exp = claims?["exp"]?.integerValue ?? 0
        #expect(abs(iat - now) <= 60 && exp > iat && exp - iat <= 180, "\(iat) \(exp)", sourceLocation: sourceLocation)
        let jti = claims?["jti"]?.stringValue
        #expect(jti?.isEmpty == false, sourceLocation: sourceLocation)
        return jti
    }

    /// Checks that no key material, assertion or token is in `output`.
    func expectNoSecrets(
        _ output: String, _ keys: [TestKeyPair], tokens: [String] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        for line in try keys.flatMap({ try $0.privateLines() }) + tokens {
            #expect(!output.contains(line), "key material or a token in the output", sourceLocation: sourceLocation)
        }
        #expect(!output.contains("PRIVATE KEY"), sourceLocation: sourceLocation)
        // Every JWT begins with the base64url of '{"': an assertion in the output.
        #expect(!output.contains("eyJ"), "an assertion in the output", sourceLocation: sourceLocation)
    }

    @Test(
        "Should log users in from the provider with the JWT bearer grant, by RS256 and ES256", arguments: ["RSA", "EC"])
    func fromProvider(type: String) throws {
        let directory = try TemporaryDirectory()
        let key = try TestKeyPair(type, in: directory, name: "jwt")
        let client = bearerClient(key)
        let server = try AuthlibServer(directory: directory, extra: [client])
        let fixture = try server.daemon(client, lines: ["Grant=jwt-bearer", "JWTKeyFile=\(key.privateKey)"])
        let users = [uniqueName("alice"), uniqueName("bob")]
        var outputs = ""
        var tokens: [String] = []
        for user in users {
            let login = try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]))
            outputs += login.stdout + login.stderr
            let token = try fixture.token("oauth", user)
            tokens.append(token)
            // The server issued the token to the session's user: the assertion's sub.
            #expect(try server.user(of: token) == user)
        }
        let grants = try server.requests("token", grant: JWTBearerTests.grantType)
        #expect(grants.count == 2)
        var ids: Set<String> = []
        for (grant, user) in zip(grants, users) {
            #expect(grant["status"]?.integerValue == 200, "\(grant.text)")
            #expect(grant["user"]?.stringValue == user)
            let jti = expectAssertion(grant["assertion"], key: key, iss: client.id, sub: user, aud: server.url)
            if let jti { ids.insert(jti) }
        }
        #expect(ids.count == 2, "each assertion has a jti of its own")
        for user in users { _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user]) }
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(daemon.allOutput + outputs, [key], tokens: tokens)
    }

    @Test("Should keep an AutoLogin account's session with the JWT bearer grant, minting anew at refresh")
    func autoLogin() async throws {
        let directory = try TemporaryDirectory()
        let key = try TestKeyPair("EC", in: directory, name: "jwt")
        let client = bearerClient(key)
        let server = try AuthlibServer(directory: directory, extra: [client])
        let user = uniqueName("robot")
        let fixture = try server.daemon(
            client, lines: ["Grant=jwt-bearer", "JWTKeyFile=\(key.privateKey)"],
            after: "\n[Account oauth \(user)]\nAutoLogin=yes\n")
        let firstToken = try await fixture.awaitToken("oauth", user)
        #expect(try server.user(of: firstToken) == user)
        // No refresh token: the refresh is a new JWT bearer grant for the same user.
        let refreshed = try expectSuccess(vaultctl(fixture.socketPath, ["refresh", "oauth", user]))
        let secondToken = try fixture.token("oauth", user)
        #expect(secondToken != firstToken)
        #expect(try server.user(of: secondToken) == user)
        let grants = try server.requests("token", grant: JWTBearerTests.grantType)
        #expect(grants.count == 2)
        let ids = grants.compactMap {
            expectAssertion($0["assertion"], key: key, iss: client.id, sub: user, aud: server.url)
        }
        #expect(Set(ids).count == 2)
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(
            daemon.allOutput + refreshed.stdout + refreshed.stderr, [key], tokens: [firstToken, secondToken])
    }

    @Test(
        "Should authenticate by private_key_jwt to refresh, rotate, revoke and mint, by RS256 and ES256",
        arguments: ["RSA", "EC"])
    func privateKeyJWT(type: String) async throws {
        let directory = try TemporaryDirectory()
        let key = try TestKeyPair(type, in: directory, name: "client")
        let client = keyClient(key)
        let server = try AuthlibServer(directory: directory, extra: [client])
        let fixture = try server.daemon(
            client, lines: ["TokenEndpointAuthMethod=private_key_jwt", "JWTKeyFile=\(key.privateKey)"])
        let cycle = try await server.heldRefreshTokenCycle(fixture, client, user: uniqueName("pk"))
        let mint = try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "oauth", uniqueName("cc"), "--from-provider"]))
        let seen =
            try server.requests("token", grant: "refresh_token")
            + server.requests("token", grant: "client_credentials")
            + cycle.revoked
        #expect(seen.count == 3)
        var ids: Set<String> = []
        for request in seen {
            #expect(request["status"]?.integerValue == 200, "\(request.text)")
            #expect(request["client_id"]?.stringValue == client.id, "\(request.text)")
            #expect(request["auth_method"]?.stringValue == "private_key_jwt", "\(request.text)")
            #expect(request["basic"]?.boolValue == false && request["secret_in_body"]?.boolValue == false)
            let jti = expectAssertion(
                request["client_assertion"], key: key, iss: client.id, sub: client.id, aud: server.url + "/token")
            if let jti { ids.insert(jti) }
        }
        #expect(ids.count == 3, "each client assertion has a jti of its own")
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(
            daemon.allOutput + cycle.output + mint.stdout + mint.stderr, [key],
            tokens: [cycle.firstRefresh, cycle.token] + cycle.live)
    }

    @Test(
        "Should be refused by the server when signing with another key than the registered one, with a clear code",
        arguments: [
            ("jwt-bearer", "invalid_grant", "ERR_GRANT_REVOKED"),
            ("private_key_jwt", "invalid_client", "ERR_INVALID_CLIENT"),
        ])
    func wrongKey(use: String, error: String, code: String) throws {
        let directory = try TemporaryDirectory()
        let registered = try TestKeyPair("EC", in: directory, name: "registered")
        let other = try TestKeyPair("EC", in: directory, name: "other")
        let bearer = use == "jwt-bearer"
        let words = bearer ? "refused the JWT bearer assertion" : "refused the client assertion"
        let client = bearer ? bearerClient(registered) : keyClient(registered)
        let server = try AuthlibServer(directory: directory, extra: [client])
        let lines =
            bearer ? ["Grant=jwt-bearer"] : ["TokenEndpointAuthMethod=private_key_jwt"]
        let fixture = try server.daemon(client, lines: lines + ["JWTKeyFile=\(other.privateKey)"])
        let login = try expectFailure(
            vaultctl(fixture.socketPath, ["--json", "login", "oauth", uniqueName("wrong"), "--from-provider"]))
        #expect(login.stdout.contains(code) || login.stderr.contains(code), "\(login.stdout) \(login.stderr)")
        #expect((login.stdout + login.stderr).contains(words), "\(login.stdout) \(login.stderr)")
        let seen = try server.requests("token")
        #expect(seen.count == 1)
        #expect(seen.first?["error"]?.stringValue == error, "\(seen.first?.text ?? "")")
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(daemon.allOutput + login.stdout + login.stderr, [registered, other])
    }

    @Test("Should take a relative JWTKeyFile= in $CREDENTIALS_DIRECTORY, as systemd's LoadCredential= gives it")
    func credentialsDirectory() throws {
        let directory = try TemporaryDirectory()
        let key = try TestKeyPair("RSA", in: directory, name: "jwt")
        let client = bearerClient(key)
        let server = try AuthlibServer(directory: directory, extra: [client])
        let fixture = try DaemonFixture(start: false)
        var text = "[Provider oauth]\nType=oauth2\nTokenURL=\(server.url)/token\nClientID=\(client.id)\n"
        text += "Grant=jwt-bearer\nJWTKeyFile=salesforce.pem\n"
        try fixture.configure(text)
        // The store's own credential directory (the SQLite data key) when it has one, else one of the test's.
        let store = try RunningDaemon.storeEnvironment(
            socketPath: fixture.socketPath, engine: fixture.engine, dataKey: fixture.dataKey)
        var credentials = store["CREDENTIALS_DIRECTORY"] ?? ""
        if credentials.isEmpty {
            credentials = fixture.directory.path("credentials")
            #expect(mkdir(credentials, 0o700) == 0)
        }
        let credential = credentials + "/salesforce.pem"
        try FileManager.default.copyItem(atPath: key.privateKey, toPath: credential)
        #expect(chmod(credential, 0o400) == 0)
        fixture.daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath,
            environment: ["CREDENTIALS_DIRECTORY": credentials], engine: fixture.engine, dataKey: fixture.dataKey)
        let user = uniqueName("sf")
        let login = try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]))
        #expect(try server.user(of: fixture.token("oauth", user)) == user)
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(daemon.allOutput + login.stdout + login.stderr, [key])
    }

    @Test("Should not send a request when the key file is readable by others, and say why without its bytes")
    func untrustedKeyFile() throws {
        let directory = try TemporaryDirectory()
        let key = try TestKeyPair("RSA", in: directory, name: "jwt")
        #expect(chmod(key.privateKey, 0o644) == 0)
        let client = bearerClient(key)
        let server = try AuthlibServer(directory: directory, extra: [client])
        let fixture = try server.daemon(client, lines: ["Grant=jwt-bearer", "JWTKeyFile=\(key.privateKey)"])
        let login = try expectFailure(
            vaultctl(fixture.socketPath, ["login", "oauth", uniqueName("u"), "--from-provider"]),
            saying: "is readable by others (mode 644)")
        #expect(try server.requests("token").isEmpty, "nothing was sent")
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(daemon.allOutput + login.stdout + login.stderr, [key])
    }
}
