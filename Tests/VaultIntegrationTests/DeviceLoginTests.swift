import Foundation
import Glibc
import Testing
import Varlink
import VaultClient

/// The device authorization grant (RFC 8628) of the Authlib test server
/// (Tests/servers/authlib_device.py), driven as its user would be.
extension AuthlibServer {
    /// The user at the verification URI: approves `userCode` as `user`,
    /// denies it, expires it, or has the next pending poll slowed down.
    func device(_ action: String, _ userCode: String, user: String? = nil) throws {
        var body: [String: JSON] = ["user_code": .string(userCode)]
        body["user"] = user.map(JSON.string)
        let response = try LoopbackHTTP.request(
            "POST", url: url, path: "/control/device/\(action)", body: JSON.object(body).serialized())
        guard response.status == 200 else {
            throw HarnessError("/control/device/\(action) answered \(response.status)")
        }
    }

    /// The device codes the server issued: none may show in any output.
    func deviceCodes() throws -> [String] {
        let body = try JSON.parse(LoopbackHTTP.request("GET", url: url, path: "/control/device/codes").body)
        return body["device_codes"]?.arrayValue?.compactMap(\.stringValue) ?? []
    }

    /// The token requests with the device code grant, oldest first.
    func devicePolls() throws -> [JSON] {
        try requests().filter { $0["grant_type"]?.stringValue == DeviceLoginTests.grantType }
    }
}

/// `vaultctl login PROVIDER USER --device` (issue 32, item 2) against a real
/// OAuth 2.0 server on Authlib, with the real vaultd and vaultctl: the
/// approved, pending, slow_down, denied and expired answers, Ctrl-C, each
/// client authentication, and a pending login no other uid may poll.
@Suite(
    "Device login against Authlib", .requiresKeyring, .requiresAuthlib, .ownThreads, .timeLimit(.minutes(5)))
struct DeviceLoginTests {
    static let grantType = "urn:ietf:params:oauth:grant-type:device_code"

    /// A running vaultd whose provider `oauth` is `client` at `server`, with device logins.
    func start(_ server: AuthlibServer, _ client: AuthlibServer.Registration, vault: String = "") throws
        -> DaemonFixture
    {
        try server.daemon(
            client, vault: vault, revocation: false,
            lines: ["DeviceAuthorizationURL=\(server.url)/device_authorization"]
                + (client.secret == nil ? [] : ["TokenEndpointAuthMethod=\(client.method)"]))
    }

    /// A `vaultctl login oauth USER --device` that waits, and what it showed.
    struct Waiting {
        var process: Process
        var out: OutputCollector
        var err: OutputCollector
        var userCode: String
        var verificationURI: String
        var complete: String?

        /// Waits for vaultctl's exit: its status, stdout and stderr.
        func finish() throws -> (status: Int32, out: String, err: String) {
            let status = try reap(process, seconds: 30)
            _ = out.waitForEnd(seconds: 5)
            _ = err.waitForEnd(seconds: 5)
            return (status, out.text, err.text)
        }
    }

    /// Starts the device login of `user`; returns once vaultctl shows the code.
    func login(_ fixture: DaemonFixture, _ user: String, json: Bool = false) throws -> Waiting {
        let (process, out, err) = try startInterruptible(
            Binaries.vaultctl.path,
            ["--socket", fixture.socketPath] + (json ? ["--json"] : []) + ["login", "oauth", user, "--device"])
        let shown = json ? out.wait(for: "\n") : out.wait(for: "Ctrl-C cancels")
        guard shown else {
            kill(process.processIdentifier, SIGKILL)
            throw HarnessError("vaultctl showed no code: \(out.text) \(err.text)")
        }
        if json {
            let first = try JSON.parse(String(out.text.split(separator: "\n")[0]))
            return Waiting(
                process: process, out: out, err: err, userCode: first["userCode"]?.stringValue ?? "",
                verificationURI: first["verificationUri"]?.stringValue ?? "",
                complete: first["verificationUriComplete"]?.stringValue)
        }
        // Each value on a line of its own, after the line that says what it is.
        let lines = out.text.split(separator: "\n").map(String.init)
        func after(_ label: String) -> String? {
            lines.firstIndex(of: label).flatMap { $0 + 1 < lines.count ? lines[$0 + 1] : nil }
        }
        return Waiting(
            process: process, out: out, err: err, userCode: after("and enter the code:") ?? "",
            verificationURI: after("To log \(user) in at oauth, open this address in a browser:") ?? "",
            complete: after("or open this address, which holds the code:"))
    }

    /// Waits until the server answered a device poll with `error`.
    func waitForPoll(_ server: AuthlibServer, _ error: String) async throws -> [JSON] {
        try await eventually(
            tries: 400, { try server.devicePolls() }, until: { $0.contains { $0["error"]?.stringValue == error } })
    }

    /// No client secret, device code or token in `output`.
    func expectNoSecrets(
        _ output: String, _ server: AuthlibServer, _ client: AuthlibServer.Registration, tokens: [String] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let codes = try server.deviceCodes()
        #expect(!codes.isEmpty, sourceLocation: sourceLocation)
        for secret in codes + tokens + (client.secret.map { [$0] } ?? []) {
            #expect(!output.contains(secret), "a secret in the output", sourceLocation: sourceLocation)
        }
    }

    @Test(
        "Should log in once the user approves, after pending polls, with each client authentication",
        arguments: [AuthlibServer.basic, AuthlibServer.post, AuthlibServer.publicClient])
    func approved(_ client: AuthlibServer.Registration) async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, client)
        let user = uniqueName("device")
        let waiting = try login(fixture, user)
        #expect(waiting.verificationURI == server.url + "/device")
        #expect(waiting.userCode.count == 9, "an Authlib user code: \(waiting.out.text)")
        #expect(waiting.complete == server.url + "/device?user_code=\(waiting.userCode)")
        let pending = try await waitForPoll(server, "authorization_pending")
        #expect(pending.count >= 1, "vaultd polls while the user has not approved")
        try server.device("approve", waiting.userCode, user: user)
        let (status, out, err) = try waiting.finish()
        #expect(status == 0, "\(out) \(err)")
        #expect(out.contains("logged in: \(user) @ oauth"), "\(out)")

        let token = try expectSuccess(vaultctl(fixture.socketPath, ["token", "oauth", user]))
        let accessToken = token.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(try server.user(of: accessToken) == user, "the token is the approving user's")

        // Every request authenticated as the client is registered.
        let requests = try server.requests()
        let authorization = requests.filter { $0["endpoint"]?.stringValue == "device_authorization" }
        #expect(authorization.count == 1)
        let polls = try server.devicePolls()
        for request in authorization + polls {
            #expect(request["auth_method"]?.stringValue == client.method, "\(request.text)")
            #expect(request["basic"]?.boolValue == (client.method == "client_secret_basic"))
        }
        #expect(polls.last?["status"]?.integerValue == 200)
        #expect(polls.last?["user"]?.stringValue == user)
        let daemon = try #require(fixture.daemon)
        try expectNoSecrets(
            daemon.allOutput + out + err + waiting.err.text, server, client,
            tokens: [accessToken] + (try server.liveRefreshTokens()))
    }

    @Test("Should replace a logged-in session's tokens with --device --replace")
    func replace() async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, AuthlibServer.publicClient)
        let user = uniqueName("again")
        var tokens: [String] = []
        for (flags, said) in [([String](), "logged in: "), (["--replace"], "replaced: ")] {
            let (process, out, err) = try startInterruptible(
                Binaries.vaultctl.path,
                ["--socket", fixture.socketPath, "login", "oauth", user, "--device"] + flags)
            defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
            #expect(out.wait(for: "Ctrl-C cancels"), "\(out.text) \(err.text)")
            let lines = out.text.split(separator: "\n").map(String.init)
            let code = try #require(lines.firstIndex(of: "and enter the code:").map { lines[$0 + 1] })
            try server.device("approve", code, user: user)
            #expect(try reap(process, seconds: 30) == 0, "\(out.text) \(err.text)")
            // Its last line may still be in the pipe when it has exited.
            _ = out.waitForEnd(seconds: 5)
            #expect(out.text.contains(said + "\(user) @ oauth"), "\(out.text)")
            let token = try vaultctl(fixture.socketPath, ["token", "oauth", user])
            tokens.append(token.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        #expect(tokens[0] != tokens[1], "the replace serves the new token")
        #expect(try server.user(of: tokens[1]) == user)
    }

    @Test("Should poll again only 5 seconds later than the interval after slow_down")
    func slowDown() async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, AuthlibServer.basic)
        let user = uniqueName("slow")
        let waiting = try login(fixture, user)
        // The first poll is answered slow_down, however slowly it came.
        try server.device("slow_down", waiting.userCode)
        _ = try await waitForPoll(server, "slow_down")
        try server.device("approve", waiting.userCode, user: user)
        let (status, out, err) = try waiting.finish()
        #expect(status == 0, "\(out) \(err)")
        let requests = try server.requests()
        let started = requests.first { $0["endpoint"]?.stringValue == "device_authorization" }?["at"]
        let times = try server.devicePolls().compactMap { poll -> Double? in
            guard case .number(let at)? = poll["at"] else { return nil }
            return at
        }
        try #require(times.count == 2, "the slowed poll, then the approved one")
        if case .number(let start)? = started { #expect(times[0] - start >= 1, "the first poll waits the interval") }
        #expect(times[1] - times[0] >= 6, "interval 1 s + 5 s after slow_down: \(times)")
    }

    @Test("Should fail with ERR_LOGIN_DENIED when the user refuses, as text and as JSON")
    func denied() async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, AuthlibServer.publicClient)
        let user = uniqueName("refused")
        let waiting = try login(fixture, user, json: true)
        #expect(waiting.verificationURI == server.url + "/device", "\(waiting.out.text)")
        try server.device("deny", waiting.userCode)
        let (status, _, err) = try waiting.finish()
        #expect(status == 1)
        let error = try JSON.parse(err.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(error["code"]?.stringValue == "ERR_LOGIN_DENIED", "\(err)")
        #expect(error["providerCode"]?.stringValue == "access_denied")
        #expect(error["message"]?.stringValue?.contains("refused") == true)
        let status2 = try vaultctl(fixture.socketPath, ["status", "oauth", user])
        #expect(status2.stderr.contains("ERR_NOT_LOGGED_IN"), "\(status2.stderr)")
    }

    @Test(
        "Should fail with ERR_LOGIN_EXPIRED when the code expires: the server's expired_token, or its expires_in",
        arguments: [false, true])
    func expired(byLifetime: Bool) async throws {
        let directory = try TemporaryDirectory()
        let lifetime = byLifetime ? ["--device-expires-in", "2"] : []
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"] + lifetime)
        let fixture = try start(server, AuthlibServer.post)
        let user = uniqueName("late")
        let waiting = try login(fixture, user)
        #expect(waiting.out.text.contains(byLifetime ? "valid for 1 min" : "valid for 30 min"))
        if !byLifetime { try server.device("expire", waiting.userCode) }
        let (status, out, err) = try waiting.finish()
        #expect(status == 1, "\(out)")
        #expect(err.contains("ERR_LOGIN_EXPIRED"), "\(err)")
        #expect(err.contains("expired"), "\(err)")
    }

    @Test("Should stop polling when vaultctl is interrupted: at most one more request")
    func interrupted() async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, AuthlibServer.basic)
        let user = uniqueName("cancel")
        let waiting = try login(fixture, user)
        _ = try await waitForPoll(server, "authorization_pending")
        kill(waiting.process.processIdentifier, SIGINT)
        let (status, _, _) = try waiting.finish()
        // By the signal: reap's 128 + n, or Foundation's n when it reaped first.
        // (terminationReason traps unless Foundation saw the exit: asked only then.)
        let bySignal =
            status == 128 + SIGINT
            || (status == SIGINT && !waiting.process.isRunning && waiting.process.terminationReason == .uncaughtSignal)
        #expect(bySignal, "vaultctl ended by SIGINT: \(status)")
        let atInterrupt = try server.devicePolls().count
        // Three intervals: a vaultd that kept polling would send three more.
        let later = try await eventually(
            tries: 150, { try server.devicePolls().count }, until: { $0 > atInterrupt + 1 })
        #expect(later <= atInterrupt + 1, "polls at Ctrl-C: \(atInterrupt), 3 s later: \(later)")
    }

    @Test(
        "Should answer another uid's poll of a pending login as an unknown one, and send nothing for it",
        .enabled(if: getuid() == 0, "needs root to create users"))
    func otherUID() async throws {
        try TestUsers.ensure()
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, AuthlibServer.basic, vault: "SocketMode=0666")
        let user = uniqueName("mine")
        let vault = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60)
        let start = try vault.startDeviceLogin(provider: "oauth", user: user)
        let replies = try varlinkCalls(
            as: TestUsers.a, fixture.socketPath, [("PollDeviceLogin", .object(["login": .string(start.login)]))])
        let reply = replies.first
        #expect(reply?["error"]?.stringValue == "io.vaultd.Vault.LoginExpired", "\(replies)")
        #expect(try server.devicePolls().isEmpty, "another uid's poll reached the provider")
        // The owner still may: pending, then done once approved.
        #expect(try vault.pollDeviceLogin(start.login) == .pending(interval: 1))
        try server.device("approve", start.userCode, user: user)
        guard case .done(let result) = try vault.pollDeviceLogin(start.login) else {
            Issue.record("no login after the approval")
            return
        }
        #expect(result.created && result.session.account.user == user)
    }

    /// The errors of `count` StartDeviceLogin calls made as the second test
    /// user (nil for a call that worked), and the device authorization
    /// requests the server took.
    func startsAsOtherUser(count: Int, vault: String) throws -> (errors: [String?], requests: Int) {
        try TestUsers.ensure()
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server, AuthlibServer.basic, vault: "SocketMode=0666\n" + vault)
        let start: JSON = ["provider": "oauth", "user": .string(uniqueName("cap"))]
        let replies = try varlinkCalls(
            as: TestUsers.a, fixture.socketPath, Array(repeating: ("StartDeviceLogin", start), count: count))
        let errors = replies.map { $0["error"]?.stringValue }
        let requests = try server.requests().filter { $0["endpoint"]?.stringValue == "device_authorization" }.count
        return (errors, requests)
    }

    @Test(
        "Should ask the provider nothing for a uid holding its 4 pending logins, and charge each start",
        .enabled(if: getuid() == 0, "needs root to create users"))
    func startsBounded() throws {
        let capped = try startsAsOtherUser(count: 6, vault: "ProviderRequestBurst=100")
        #expect(
            capped.errors == [
                nil, nil, nil, nil, "io.vaultd.Vault.InvalidParameter", "io.vaultd.Vault.InvalidParameter",
            ])
        #expect(capped.requests == 4, "a refused start reached the provider")
        let charged = try startsAsOtherUser(count: 3, vault: "ProviderRequestsPerMinute=1\nProviderRequestBurst=2")
        #expect(charged.errors == [nil, nil, "io.vaultd.Vault.TooManyProviderRequests"])
        #expect(charged.requests == 2, "a start past the budget reached the provider")
    }

    @Test(
        "Should refuse a bad DeviceAuthorizationURL at --check-config, naming file, line and key",
        arguments: ["ftp://idp.example/device", "http://idp.example/device", "https://idp.example/a b"])
    func checkConfig(_ url: String) throws {
        let directory = try TemporaryDirectory()
        let path = directory.path("vaultd.conf")
        let result = try checkConfigText(
            "[Provider corp]\nType=oauth2\nTokenURL=https://idp.example/token\nClientID=c\nDeviceAuthorizationURL=\(url)\n",
            at: path)
        #expect(result.status != 0)
        #expect(result.stderr.contains("\(path):5: key 'DeviceAuthorizationURL'"), "\(result.stderr)")
        let wrongType = try checkConfigText(
            "[Provider corp]\nType=static\nDeviceAuthorizationURL=https://idp.example/device\n", at: path)
        #expect(wrongType.stderr.contains("is for Type=oauth2"), "\(wrongType.stderr)")
    }

    @Test("Should refuse --device for a provider without DeviceAuthorizationURL, asking nothing of it")
    func noDeviceEndpoint() throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory)
        let fixture = try DaemonFixture(
            config:
                "[Provider oauth]\nType=oauth2\nTokenURL=\(server.url)/token\nClientID=\(AuthlibServer.publicClient.id)\n"
        )
        try expectFailure(
            vaultctl(fixture.socketPath, ["login", "oauth", uniqueName("nodev"), "--device"]),
            saying: "DeviceAuthorizationURL=")
        #expect(try server.requests().isEmpty)
        let mixed = try vaultctl(fixture.socketPath, ["login", "oauth", "x", "--device", "--from-provider"])
        #expect(mixed.status == 2, "\(mixed.stderr)")
    }
}
