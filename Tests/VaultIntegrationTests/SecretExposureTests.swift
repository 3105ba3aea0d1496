import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore

/// Every secret a test issued, and every place it must never show up.
struct ExposureCheck {
    private(set) var secrets: [String: String] = [:]
    private(set) var findings: [String] = []

    /// Remembers `value` under `name` (a token, a refresh token, a client secret).
    mutating func issued(_ name: String, _ value: String) {
        guard value.count >= 8 else { return }
        secrets[name] = value
    }

    /// Records a finding for each issued secret that `text` (from `place`) contains.
    mutating func scan(_ place: String, _ text: String) {
        for (name, value) in secrets.sorted(by: { $0.key < $1.key }) where text.contains(value) {
            findings.append("\(name) in \(place)")
        }
    }

    /// The same for raw bytes (NUL-separated /proc files, binary files).
    mutating func scan(_ place: String, bytes: [UInt8]) {
        scan(place, String(decoding: bytes.map { $0 == 0 ? 0x0A : $0 }, as: UTF8.self))
    }
}

/// Reads a file whole, or nil when it cannot be read.
func readBytes(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map { Array($0) }
}

/// Secrets never leave vaultd except where they must: no token, refresh
/// token, client secret or helper credential shows up in its output (at debug
/// level), in any event or error, in `/proc` of vaultd or of a helper, in a
/// file vaultd writes, or in a core dump (vaultd cannot be dumped).
@Suite("Secrets never exposed", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct SecretExposureTests {
    /// Should keep every secret it handled out of every output the test can read.
    @Test func noSecretInAnyOutput() async throws {
        let server = try TokenServer(["--client-secret", "cs-exposure-9f3k2m1q8w7e", "--lifetime", "3"])
        let standIns = try ChatStandIns()
        let fixture = try DaemonFixture(start: false)
        let dir = fixture.directory
        let examples = Binaries.packageRoot.appendingPathComponent("config/examples").path
        // A wrapper that keeps what the helper was started with (its argv and
        // environment, from /proc) before it becomes the real helper.
        let helperConfig = dir.path("cometchat.json")
        try #"{"base_url": "\#(standIns.url)/cometchat/v3", "api_key": "test-api-key"}"#.write(
            toFile: helperConfig, atomically: true, encoding: .utf8)
        let wrapper = dir.path("helper-wrapper")
        try writeExecutable(
            """
            #!/bin/sh
            n=$(date +%s%N)
            cat /proc/$$/cmdline > \(dir.path("helper-cmdline")).$n
            cat /proc/$$/environ > \(dir.path("helper-environ")).$n
            exec \(examples)/cometchat-helper --config \(helperConfig)
            """, to: wrapper)
        try fixture.configure(
            """
            [Vault]
            MinRefreshInterval=0

            [Provider demo]
            Type=static

            [Provider oauth]
            Type=oauth2
            TokenURL=\(server.url)/token
            RevocationURL=\(server.url)/revoke
            ClientID=vaultd-test

            [Provider cometchat]
            Type=exec
            Command=\(wrapper)
            Timeout=15s
            """)
        // Everything vaultd might write goes under the test's directory.
        let home = dir.path("home")
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true)
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath,
            environment: [
                "HOME": home, "XDG_STATE_HOME": home + "/state", "XDG_CACHE_HOME": home + "/cache",
                "XDG_CONFIG_HOME": home + "/config",
            ])
        fixture.daemon = daemon
        let pid = daemon.process.processIdentifier
        var check = ExposureCheck()
        var vaultctlOutput = ""
        // Everything vaultctl printed, but what `vaultctl token` prints on stdout, whose job it is.
        func ctl(_ arguments: [String], input: String? = nil) throws -> CommandResult {
            let result = try vaultctl(fixture.socketPath, arguments, input: input)
            if arguments.first != "token" { vaultctlOutput += result.stdout }
            vaultctlOutput += result.stderr
            return result
        }
        let events = try RecordedStream(fixture.socketPath)

        // A static token; a refused login carrying another token (an error reply).
        let staticToken = "st-exposure-" + UUID().uuidString
        check.issued("static token", staticToken)
        #expect(try ctl(["login", "demo", "alice"], input: staticToken).status == 0)
        let expired = "st-expired-" + UUID().uuidString
        check.issued("refused token", expired)
        #expect(try ctl(["login", "demo", "bob", "--expires-at", "1000"], input: expired).status == 1)

        // An OAuth 2.0 session with a client secret, refreshed (with rotation) twice.
        let clientSecret = "cs-exposure-9f3k2m1q8w7e"
        check.issued("client secret", clientSecret)
        #expect(try ctl(["provider-secret", "oauth"], input: clientSecret).status == 0)
        let grant = try JSON.parse(
            try await server.post(
                "/token", form: "grant_type=client_credentials&client_id=vaultd-test&client_secret=\(clientSecret)"
            ).text)
        check.issued("first access token", grant["access_token"]?.stringValue ?? "")
        check.issued("first refresh token", grant["refresh_token"]?.stringValue ?? "")
        #expect(try ctl(["login", "oauth", "carol"], input: grant.text).status == 0)
        for round in 1...2 {
            try expectSuccess(ctl(["refresh", "oauth", "carol"]))
            check.issued("access token after refresh \(round)", try ctl(["token", "oauth", "carol"]).stdout)
        }

        // A token a helper obtained, and one it obtains again on refresh.
        #expect(try ctl(["login", "cometchat", "alice", "--from-provider"]).status == 0)
        check.issued("helper token", try ctl(["token", "cometchat", "alice"]).stdout)
        #expect(try ctl(["refresh", "cometchat", "alice"]).status == 0)
        check.issued("helper token after refresh", try ctl(["token", "cometchat", "alice"]).stdout)

        // The current refresh token, as stored (the test never saw it on the wire).
        if fixture.engine == .secretService {
            let stored = try runCommand(
                URL(fileURLWithPath: "/usr/bin/secret-tool"),
                ["search", "--all", "xdg:schema", "io.vaultd.Session", "provider", "oauth", "user", "carol"])
            if let record = stored.stdout.split(separator: "\n").first(where: { $0.hasPrefix("secret = ") }),
                let json = try? JSON.parse(String(record.dropFirst("secret = ".count)))
            {
                check.issued("stored refresh token", json["tokens"]?["refreshToken"]?.stringValue ?? "")
            }
        } else {
            // SQLite: the database and its WAL are among the files scanned below.
            let record = try await fixture.store.records(provider: "oauth", user: "carol").first
            check.issued("stored refresh token", record?.tokens.refreshToken?.revealed ?? "")
        }
        #expect(check.secrets.count >= 10, "the test issued what it meant to: \(check.secrets.keys.sorted())")

        // Every place, while vaultd runs: /proc of vaultd, the events, the errors, vaultctl's words.
        for file in ["cmdline", "environ"] {
            check.scan("/proc/vaultd/\(file)", bytes: readBytes("/proc/\(pid)/\(file)") ?? [])
        }
        let limits = (try? String(contentsOfFile: "/proc/\(pid)/limits", encoding: .utf8)) ?? ""
        let core = limits.split(separator: "\n").first { $0.hasPrefix("Max core file size") } ?? ""
        #expect(core.split(separator: " ", omittingEmptySubsequences: true).dropFirst(4).prefix(2) == ["0", "0"])
        #expect(try ctl(["logout", "oauth", "carol"]).status == 0)
        // Read the stream up to the logout: every event of the test went through it.
        var kinds: [EventKind] = []
        while kinds.count < 20, !kinds.contains(.logoutSuccess) { kinds.append(try events.event().kind) }
        #expect(kinds.contains(.tokenRefreshed) && kinds.contains(.loginFailed), "\(kinds)")
        check.scan("events", events.rawText)
        check.scan("vaultctl output", vaultctlOutput)
        // What each helper run was started with.
        let helperFiles = try FileManager.default.contentsOfDirectory(atPath: dir.url.path)
            .filter { $0.hasPrefix("helper-cmdline") || $0.hasPrefix("helper-environ") }
        #expect(helperFiles.count >= 4, "the helper ran (login and refresh): \(helperFiles)")
        for name in helperFiles { check.scan("helper /proc/\(name)", bytes: readBytes(dir.path(name)) ?? []) }

        // After SIGTERM: everything vaultd wrote to stdout and stderr (debug level), and every file under its directories.
        #expect(daemon.stop() == 0)
        check.scan("vaultd stdout/stderr", daemon.allOutput)
        #expect(daemon.allOutput.contains("audit"), "the log was read")
        let written = FileManager.default.enumerator(atPath: dir.url.path)
        while let name = written?.nextObject() as? String {
            let path = dir.path(name)
            guard !name.hasPrefix("helper-"), path != fixture.configPath, path != helperConfig, path != wrapper
            else { continue }
            check.scan("file \(name)", bytes: readBytes(path) ?? [])
        }
        #expect(check.findings.isEmpty, "secrets exposed: \(check.findings)")
        #expect(try await server.revocations().count >= 1, "the logout revoked at the provider")
    }

    /// Should make vaultd undumpable: its /proc files belong to root even when
    /// it runs as another user, so no core dump or ptrace by that user reads it.
    @Test(.enabled(if: geteuid() == 0, "starting vaultd as another user needs root"))
    func notDumpable() throws {
        try TestUsers.ensure()
        let name = TestUsers.a
        guard let uid = TestUsers.uid(name), let gid = TestUsers.gid(name) else {
            throw HarnessError("no user \(name)")
        }
        let dir = try TemporaryDirectory()
        chmod(dir.url.path, 0o755)
        let run = dir.path("run")
        mkdir(run, 0o700)
        chown(run, uid, gid)
        let socket = run + "/vaultd.sock"
        let config = dir.path("vaultd.conf")
        try "[Provider demo]\nType=static\n".write(toFile: config, atomically: true, encoding: .utf8)
        chmod(config, 0o644)
        let daemon = try RunningDaemon(
            socketPath: socket, configPath: config, environment: ["HOME": dir.url.path],
            extraArguments: ["--memory-store"],
            launcher: ["/usr/bin/setpriv", "--reuid=\(uid)", "--regid=\(gid)", "--clear-groups"])
        defer { daemon.stop() }
        let pid = daemon.process.processIdentifier
        var status = stat()
        #expect(stat("/proc/\(pid)/status", &status) == 0)
        let real = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        #expect(real.contains("Uid:\t\(uid)"), "vaultd runs as \(name): \(real.prefix(300))")
        #expect(status.st_uid == 0, "a dumpable process's /proc files belong to its own user (\(status.st_uid))")
    }
}
