import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore

extension AuthlibServer {
    /// Has the authorization endpoint approve as `user` from now on, or deny.
    func approve(as user: String? = nil, deny: Bool = false) throws {
        var body: [String: JSON] = ["deny": .bool(deny)]
        if let user { body["user"] = .string(user) }
        let response = try LoopbackHTTP.request(
            "POST", url: url, path: "/control/approve", body: JSON.object(body).serialized())
        guard response.status == 200 else { throw HarnessError("/control/approve answered \(response.status)") }
    }

    /// The code exchanges the token endpoint took.
    func codeExchanges() throws -> [JSON] {
        try requests().filter {
            $0["endpoint"]?.stringValue == "token" && $0["grant_type"]?.stringValue == "authorization_code"
        }
    }
}

/// The query of a URL, its parameters decoded (each once).
func queryItems(_ url: String) -> [String: String] {
    var items: [String: String] = [:]
    for item in URLComponents(string: url)?.queryItems ?? [] { items[item.name] = item.value ?? "" }
    return items
}

/// `url` with the query parameter `name` set to `value`.
func replacingQuery(_ url: String, _ name: String, with value: String) -> String {
    var components = URLComponents(string: url)!
    components.queryItems = (components.queryItems ?? []).map {
        $0.name == name ? URLQueryItem(name: name, value: value) : $0
    }
    // '+' is a space to form decoders: keep it literal.
    components.percentEncodedQuery = components.percentEncodedQuery?.replacingOccurrences(of: "+", with: "%2B")
    return components.string!
}

/// `bytes` in base64url without padding.
func base64url(_ bytes: [UInt8]) -> String {
    Data(bytes).base64EncodedString().replacingOccurrences(of: "+", with: "-")
        .replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
}

/// `vaultctl login --browser` against a real vaultd and a real OAuth 2.0
/// server (Authlib's authorization code grant with PKCE required), the test
/// playing the browser: it reads the authorization URL vaultctl prints, asks
/// Authlib for it without following the redirect, and brings the redirect's
/// Location to vaultctl's loopback listener (issue 32, item 3).
@Suite(
    "Browser login with PKCE against Authlib", .requiresKeyring, .requiresAuthlib, .ownThreads,
    .timeLimit(.minutes(5)))
struct BrowserLoginTests {
    /// The provider of these tests: a public client (PKCE is its proof),
    /// its host replaced by the Authlib server's (README's own example runs
    /// in FirstLoginExamplesTests).
    static let providerSection = """
        [Provider corp]
        Type=oauth2
        AuthorizationURL=https://login.example.com/authorize
        TokenURL=https://login.example.com/token
        ClientID=vaultd-public
        Scope=profile

        """

    /// A vaultd whose provider `corp` is `client` at `server`: `providerSection`
    /// with the client's id, and its secret when it has one.
    final class Setup {
        let server: AuthlibServer
        let fixture: DaemonFixture
        let client: AuthlibServer.Registration
        let directory: TemporaryDirectory

        init(_ client: AuthlibServer.Registration = AuthlibServer.basic, socketMode: Bool = false) throws {
            directory = try TemporaryDirectory()
            server = try AuthlibServer(directory: directory)
            fixture = try DaemonFixture(start: false)
            self.client = client
            var text = socketMode ? "[Vault]\nSocketMode=0666\n\n" : ""
            text += BrowserLoginTests.providerSection.replacingOccurrences(
                of: "https://login.example.com", with: server.url
            )
            .replacingOccurrences(of: "ClientID=vaultd-public", with: "ClientID=\(client.id)")
            if let secret = client.secret {
                let path = fixture.directory.path("client-secret")
                try secret.write(toFile: path, atomically: true, encoding: .utf8)
                text += "ClientSecretFile=\(path)\n"
            }
            // client_secret_basic is the default with a secret.
            if client.method == "client_secret_post" { text += "TokenEndpointAuthMethod=client_secret_post\n" }
            try fixture.configure(text)
            if socketMode { chmod(fixture.directory.url.path, 0o755) }
            try fixture.start()
        }

        /// Starts `vaultctl login corp USER --browser --no-open` and reads the URL it prints.
        func start(_ user: String, _ extra: [String] = []) throws -> Login {
            let (process, out, err) = try startInterruptible(
                Binaries.vaultctl.path,
                ["--socket", fixture.socketPath, "login", "corp", user, "--browser", "--no-open"] + extra)
            let prefix = server.url + "/authorize?"
            guard out.wait(for: "\n"), let line = out.text.split(separator: "\n").first, line.hasPrefix(prefix) else {
                process.terminate()
                throw HarnessError("vaultctl printed no authorization URL: \(out.text) \(err.text)")
            }
            return Login(process: process, out: out, err: err, url: String(line))
        }

        /// What a browser does with `url` at the authorization server: its redirect's Location.
        func authorize(_ url: String) throws -> String {
            let path = String(url.dropFirst(server.url.count))
            let response = try LoopbackHTTP.request("GET", url: server.url, path: path)
            guard response.status == 302, let location = response.headers["location"] else {
                throw HarnessError(
                    "/authorize answered \(response.status): \(String(decoding: response.body, as: UTF8.self))")
            }
            return location
        }

        /// Everything vaultd wrote.
        var daemonOutput: String { fixture.daemon?.allOutput ?? "" }
    }

    /// A running `vaultctl login --browser`.
    struct Login {
        let process: Process
        let out: OutputCollector
        let err: OutputCollector
        /// The authorization URL it printed.
        let url: String

        /// The redirect URI it listens at, from the URL.
        var redirectURI: String { queryItems(url)["redirect_uri"] ?? "" }

        /// Brings `location` (a redirect to vaultctl's listener) as a browser does: the page's status.
        func deliver(_ location: String) throws -> Int {
            guard location.hasPrefix("http://127.0.0.1:"), let slash = location.dropFirst(7).firstIndex(of: "/") else {
                throw HarnessError("not a loopback redirect: \(location)")
            }
            return try LoopbackHTTP.request("GET", url: String(location[..<slash]), path: String(location[slash...]))
                .status
        }

        /// Waits for vaultctl's end: its status, stdout and stderr.
        func finish() throws -> CommandResult {
            let status = try reap(process, seconds: 30)
            _ = out.waitForEnd(seconds: 5)
            _ = err.waitForEnd(seconds: 5)
            return CommandResult(status: status, stdout: out.text, stderr: err.text)
        }
    }

    /// Checks that no code, verifier, client secret or token is in `output`.
    func expectNoSecrets(_ output: String, _ secrets: [String], sourceLocation: SourceLocation = #_sourceLocation) {
        for secret in secrets where !secret.isEmpty {
            #expect(!output.contains(secret), "a secret in the output", sourceLocation: sourceLocation)
        }
    }

    @Test(
        "Should log in through the browser, exchanging the code with the verifier, by each client authentication",
        arguments: [AuthlibServer.basic, AuthlibServer.post, AuthlibServer.publicClient])
    func success(client: AuthlibServer.Registration) throws {
        let setup = try Setup(client)
        let user = uniqueName("alice")
        try setup.server.approve(as: user)
        let login = try setup.start(user)
        let query = queryItems(login.url)
        #expect(query["response_type"] == "code" && query["client_id"] == client.id && query["scope"] == "profile")
        #expect(query["code_challenge_method"] == "S256" && (query["state"]?.count ?? 0) >= 22)
        #expect(login.redirectURI.hasPrefix("http://127.0.0.1:") && login.redirectURI.hasSuffix("/"))
        let location = try setup.authorize(login.url)
        let code = try #require(queryItems(location)["code"])
        #expect(try login.deliver(location) == 200)
        let result = try login.finish()
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("logged in: \(user) @ corp"), "\(result.stdout)")

        // One exchange, with the verifier of the challenge and the same redirect URI.
        let exchanges = try setup.server.codeExchanges()
        #expect(exchanges.count == 1)
        let exchange = try #require(exchanges.first)
        #expect(exchange["status"]?.integerValue == 200, "\(exchange.text)")
        #expect(exchange["auth_method"]?.stringValue == client.method)
        #expect(exchange["redirect_uri"]?.stringValue == login.redirectURI)
        let verifier = try #require(exchange["code_verifier"]?.stringValue)
        #expect(verifier.count >= 43)
        #expect(base64url(VaultCore.SHA256.hash(Array(verifier.utf8))) == query["code_challenge"])

        let token = try setup.fixture.token("corp", user)
        #expect(try setup.server.user(of: token) == user)
        let refreshTokens = try setup.server.liveRefreshTokens()
        #expect(refreshTokens.count == 1, "the token response's refresh token")
        let secrets = [code, verifier, token] + refreshTokens + (client.secret.map { [$0] } ?? [])
        expectNoSecrets(setup.daemonOutput + result.stdout + result.stderr, secrets)
    }

    @Test("Should replace a logged-in session's tokens with --replace")
    func replace() throws {
        let setup = try Setup(AuthlibServer.publicClient)
        let user = uniqueName("again")
        try setup.server.approve(as: user)
        for (extra, said) in [([], "logged in: "), (["--replace"], "replaced: ")] {
            let login = try setup.start(user, extra)
            #expect(try login.deliver(try setup.authorize(login.url)) == 200)
            let result = try login.finish()
            #expect(result.status == 0, "\(result.stderr)")
            #expect(result.stdout.contains(said + "\(user) @ corp"), "\(result.stdout)")
        }
        let token = try setup.fixture.token("corp", user)
        let exchanges = try setup.server.codeExchanges()
        #expect(exchanges.count == 2)
        #expect(try setup.server.user(of: token) == user)
    }

    @Test("Should refuse a redirect whose state was altered, and send nothing to the token endpoint")
    func alteredState() throws {
        let setup = try Setup()
        let user = uniqueName("state")
        let login = try setup.start(user)
        let location = try setup.authorize(login.url)
        let code = try #require(queryItems(location)["code"])
        let altered = replacingQuery(location, "state", with: "forged-state-0123456789abcdef")
        #expect(try login.deliver(altered) == 400)
        let result = try expectFailure(login.finish())
        #expect(
            result.stderr.contains("ERR_AUTHORIZATION_FAILED") && result.stderr.contains("state"), "\(result.stderr)")
        #expect(try setup.server.codeExchanges().isEmpty, "no token request was made")
        #expect(try vaultctl(setup.fixture.socketPath, ["status", "corp", user]).status != 0)
        expectNoSecrets(setup.daemonOutput + result.stdout + result.stderr, [code, setup.client.secret ?? ""])
    }

    @Test("Should fail clearly on an error redirect (the user declined)")
    func errorRedirect() throws {
        let setup = try Setup()
        try setup.server.approve(deny: true)
        let login = try setup.start(uniqueName("deny"), ["--json"])
        let location = try setup.authorize(login.url)
        #expect(queryItems(location)["error"] == "access_denied", "\(location)")
        #expect(try login.deliver(location) == 200)
        let result = try expectFailure(login.finish())
        // The last line: the one before tells where to open the URL.
        let error = try JSON.parse(String(result.stderr.split(separator: "\n").last ?? ""))
        #expect(error["code"]?.stringValue == "ERR_AUTHORIZATION_FAILED", "\(result.stderr)")
        #expect(error["providerCode"]?.stringValue == "access_denied", "\(result.stderr)")
        #expect(try setup.server.codeExchanges().isEmpty)
    }

    @Test("Should neither show nor end the login with the words of an error redirect of another state")
    func foreignErrorRedirect() throws {
        let setup = try Setup()
        try setup.server.approve(deny: true)
        let login = try setup.start(uniqueName("foreign"))
        let location = try setup.authorize(login.url)
        // The listener's address, with an error and words of another's choosing.
        let base = String(location.prefix { $0 != "?" })
        let forged = base + "?error=access_denied&error_description=Open%20evil.example&state=forged-0123456789"
        #expect(queryItems(location)["error"] == "access_denied", "\(location)")
        #expect(try login.deliver(forged) == 400)
        let result = try expectFailure(login.finish(), saying: "state is not the one of this login")
        #expect(!result.stderr.contains("evil.example"), "\(result.stderr)")
    }

    @Test("Should be refused by the server when the code was issued for another challenge (a wrong verifier)")
    func wrongVerifier() throws {
        let setup = try Setup()
        let login = try setup.start(uniqueName("verifier"))
        // The test's own challenge, on vaultctl's redirect URI and state.
        let ownVerifier = String(repeating: "v", count: 50)
        let ownChallenge = base64url(VaultCore.SHA256.hash(Array(ownVerifier.utf8)))
        let location = try setup.authorize(replacingQuery(login.url, "code_challenge", with: ownChallenge))
        #expect(try login.deliver(location) == 200)
        let result = try expectFailure(login.finish())
        #expect(
            result.stderr.contains("ERR_GRANT_REVOKED") && result.stderr.contains("invalid_grant"), "\(result.stderr)")
        #expect(result.stderr.contains("verifier"), "\(result.stderr)")
        let exchanges = try setup.server.codeExchanges()
        #expect(exchanges.count == 1)
        #expect(exchanges.first?["error"]?.stringValue == "invalid_grant")
        #expect(exchanges.first?["error_description"]?.stringValue?.contains("challenge") == true)
    }

    @Test("Should refuse a code used once already")
    func reusedCode() throws {
        let setup = try Setup(AuthlibServer.publicClient)
        let first = try setup.start(uniqueName("first"))
        let location = try setup.authorize(first.url)
        let code = try #require(queryItems(location)["code"])
        #expect(try first.deliver(location) == 200)
        #expect(try first.finish().status == 0)
        // The same code brought to a second login, with that login's own state.
        let second = try setup.start(uniqueName("second"))
        let stateOfSecond = try #require(queryItems(second.url)["state"])
        #expect(try second.deliver(second.redirectURI + "?code=\(code)&state=\(stateOfSecond)") == 200)
        let result = try expectFailure(second.finish())
        #expect(
            result.stderr.contains("ERR_GRANT_REVOKED") && result.stderr.contains("invalid_grant"), "\(result.stderr)")
        let exchanges = try setup.server.codeExchanges()
        #expect(exchanges.count == 2)
        #expect(exchanges.last?["error"]?.stringValue == "invalid_grant")
        #expect(
            exchanges.last?["error_description"]?.stringValue?.contains("code") == true, "\(exchanges.last?.text ?? "")"
        )
    }

    @Test(
        "Should let only the uid that began a browser login finish it", .enabled(if: getuid() == 0, "needs root"))
    func otherUID() throws {
        try TestUsers.ensure()
        let setup = try Setup(AuthlibServer.publicClient, socketMode: true)
        let user = uniqueName("mine")
        try setup.server.approve(as: user)
        let account: [String: JSON] = ["provider": "corp", "user": .string(user)]
        var begin = account
        begin["redirectUri"] = "http://127.0.0.1:9/"
        let begun = try varlinkCalls(as: TestUsers.a, setup.fixture.socketPath, [("BeginBrowserLogin", .object(begin))])
        let parameters = try #require(begun.first?["parameters"], "\(begun)")
        let id = try #require(parameters["login"]?.stringValue)
        let state = try #require(parameters["state"]?.stringValue)
        let location = try setup.authorize(try #require(parameters["authorizationUrl"]?.stringValue))
        let code = try #require(queryItems(location)["code"])
        let finish = JSON.object(["login": .string(id), "code": .string(code), "state": .string(state)])

        // Another uid: the login is unknown to it, and stays pending.
        let stranger = try varlinkCalls(as: TestUsers.b, setup.fixture.socketPath, [("FinishBrowserLogin", finish)])
        #expect(stranger.first?["error"]?.stringValue == "io.vaultd.Vault.LoginExpired", "\(stranger)")
        #expect(try setup.server.codeExchanges().isEmpty)
        let mine = try varlinkCalls(as: TestUsers.a, setup.fixture.socketPath, [("FinishBrowserLogin", finish)])
        #expect(mine.first?["error"] == nil, "\(mine)")
        #expect(mine.first?["parameters"]?["session"]?["ownerUid"]?.integerValue == Int64(TestUsers.uid(TestUsers.a)!))
        // Finished: once.
        let again = try varlinkCalls(as: TestUsers.a, setup.fixture.socketPath, [("FinishBrowserLogin", finish)])
        #expect(again.first?["error"]?.stringValue == "io.vaultd.Vault.LoginExpired", "\(again)")
        expectNoSecrets(setup.daemonOutput, [code])
    }

    @Test(
        "Should log a browser login in as the uid that began it when root brings its code",
        .enabled(if: getuid() == 0, "needs root"))
    func rootFinishes() throws {
        try TestUsers.ensure()
        let setup = try Setup(AuthlibServer.publicClient, socketMode: true)
        let user = uniqueName("theirs")
        try setup.server.approve(as: user)
        let begin: JSON = ["provider": "corp", "user": .string(user), "redirectUri": "http://127.0.0.1:9/"]
        let begun = try varlinkCalls(as: TestUsers.a, setup.fixture.socketPath, [("BeginBrowserLogin", begin)])
        let parameters = try #require(begun.first?["parameters"], "\(begun)")
        let location = try setup.authorize(try #require(parameters["authorizationUrl"]?.stringValue))
        let vault = try VaultConnection(path: setup.fixture.socketPath, timeoutSeconds: 60)
        let result = try vault.finishBrowserLogin(
            login: try #require(parameters["login"]?.stringValue),
            code: Secret(try #require(queryItems(location)["code"])),
            state: try #require(parameters["state"]?.stringValue))
        #expect(result.session.ownerUID == TestUsers.uid(TestUsers.a), "the session is its starter's, not root's")
    }

    @Test(
        "Should say when xdg-open is missing or fails, and go on waiting for the redirect",
        arguments: ["exit 3", nil] as [String?])
    func opener(script: String?) throws {
        let setup = try Setup()
        let user = uniqueName("open")
        try setup.server.approve(as: user)
        let bin = setup.directory.path("bin")
        try FileManager.default.createDirectory(atPath: bin, withIntermediateDirectories: true)
        if let script { try writeExecutable("#!/bin/sh\n\(script)\n", to: bin + "/xdg-open") }
        let (process, out, err) = try startInterruptible(
            "/usr/bin/env",
            [
                "PATH=\(bin)", Binaries.vaultctl.path, "--socket", setup.fixture.socketPath, "login", "corp", user,
                "--browser",
            ])
        let login = Login(process: process, out: out, err: err, url: "")
        let told = script == nil ? "cannot run xdg-open" : "xdg-open exited with 3"
        #expect(err.wait(for: told), "\(err.text)")
        guard out.wait(for: "\n"), let url = out.text.split(separator: "\n").first else {
            process.terminate()
            throw HarnessError("no URL: \(out.text)")
        }
        #expect(try login.deliver(try setup.authorize(String(url))) == 200)
        let result = try login.finish()
        #expect(result.status == 0, "\(result.stderr)")
    }

    @Test("Should report a bad AuthorizationURL= at --check-config, naming file, line and key")
    func checkConfig() throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("vaultd.conf")
        let result = try checkConfigText(
            "[Provider corp]\nType=oauth2\nTokenURL=https://login.example.com/token\nClientID=c\nAuthorizationURL=http://login.example.com/authorize\n",
            at: path)
        #expect(result.status != 0)
        #expect(result.stderr.contains("\(path):5: key 'AuthorizationURL'"), "\(result.stderr)")
    }

    @Test("Should end on Ctrl-C while it waits, and answer 404 to what is not the redirect")
    func interrupted() throws {
        let setup = try Setup()
        let login = try setup.start(uniqueName("ctrlc"))
        #expect(try login.deliver(login.redirectURI + "favicon.ico") == 404)
        kill(login.process.processIdentifier, SIGINT)
        let result = try login.finish()
        #expect(result.status != 0)
        #expect(try setup.server.codeExchanges().isEmpty)
    }
}
