import Foundation
import Glibc
import Testing
import Varlink
import VaultCore

/// Sinks that carry the whole session, against the real daemon, keyring and
/// token server: `vaultctl exec`'s variables and `--env NAME=FIELD`, and the
/// token files of `TokenFileFormat=json` and `env` read by their consumers
/// (Python's `json.load`; systemd's own EnvironmentFile= parser and a POSIX
/// shell's `set -a; . FILE`), each following a refresh.
@Suite("Sinks carry the session", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct SessionSinkTests {
    /// A grant of the client credentials `scope` (none: nil), as the token endpoint answers it.
    func grant(_ server: TokenServer, scope: String?) async throws -> String {
        var form = "grant_type=client_credentials&client_id=vaultd-test"
        if let scope { form += "&scope=" + scope.addingPercentEncoding(withAllowedCharacters: .alphanumerics)! }
        return try await server.post("/token", form: form).text
    }

    /// What `vaultctl --json token` says of the session, as a sink must carry it.
    func expected(_ fixture: DaemonFixture, _ user: String) throws -> [String: String] {
        let result = try vaultctl(fixture.socketPath, ["--json", "token", "oauth", user])
        let reply = try JSON.parse(Array(result.stdout.utf8))
        var fields = ["token": try #require(reply["token"]?.stringValue), "provider": "oauth", "user": user]
        fields["type"] = reply["tokenType"]?.stringValue
        fields["expires_at"] = reply["expiresAt"]?.integerValue.map { String($0) }
        fields["instance_url"] = reply["instanceUrl"]?.stringValue
        fields["scope"] = reply["scope"]?.stringValue
        return fields
    }

    /// The `VAULTD_` variables of `fields`.
    func variables(_ fields: [String: String]) -> [String: String] {
        var out: [String: String] = [:]
        for field in SessionField.allCases { out[field.variable] = fields[field.rawValue] }
        return out
    }

    /// The variables of an `env -0` listing named in `names` (default: the fields' `VAULTD_` ones).
    func environment(_ listing: String, _ names: [String] = SessionField.allCases.map(\.variable)) -> [String: String] {
        var out: [String: String] = [:]
        for entry in listing.split(separator: "\0") {
            let parts = entry.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, names.contains(String(parts[0])) else { continue }
            out[String(parts[0])] = String(parts[1])
        }
        return out
    }

    @Test("Should give exec's command every field of the session, and --env NAME=FIELD under the program's names")
    func execVariables() async throws {
        let server = try TokenServer(["--lifetime", "3600", "--salesforce"])
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("sink")
        try expectSuccess(
            vaultctl(
                fixture.socketPath, ["login", "oauth", user], input: try await grant(server, scope: "api refresh_token")
            ))
        let fields = try expected(fixture, user)
        #expect(fields["scope"] == "api refresh_token", "GetToken tells the scope: \(fields)")
        #expect(fields["instance_url"] == server.url && fields["type"] == "Bearer", "\(fields)")
        #expect(fields["expires_at"] != nil)

        let run = try expectSuccess(
            vaultctl(
                fixture.socketPath,
                [
                    "exec", "--env", "SF_URL=instance_url", "--env", "WHO=user", "--env", "BEARER=token", "oauth", user,
                    "--", "/usr/bin/env", "-0",
                ]))
        #expect(environment(run.stdout) == variables(fields), "\(run.stderr)")
        #expect(
            environment(run.stdout, ["SF_URL", "WHO", "BEARER"])
                == ["SF_URL": server.url, "WHO": user, "BEARER": fields["token"] ?? "-"])

        // --env NAME alone still moves the token there (and only there).
        let renamed = try vaultctl(
            fixture.socketPath, ["exec", "--env", "API_TOKEN", "oauth", user, "--", "/usr/bin/env", "-0"])
        var withoutToken = variables(fields)
        withoutToken["VAULTD_TOKEN"] = nil
        #expect(environment(renamed.stdout) == withoutToken, "\(renamed.stderr)")
        #expect(environment(renamed.stdout, ["API_TOKEN"]) == ["API_TOKEN": fields["token"] ?? "-"])
    }

    @Test("Should unset in exec's command the variables of fields the session lacks, not pass on the caller's")
    func execUnsetsMissingFields() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("bare")
        #expect(
            try vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await grant(server, scope: nil))
                .status == 0)
        let fields = try expected(fixture, user)
        #expect(fields["instance_url"] == nil && fields["scope"] == nil, "\(fields)")
        let run = try expectSuccess(
            runCommand(
                Binaries.vaultctl,
                [
                    "--socket", fixture.socketPath, "exec", "--env", "URL=instance_url", "oauth", user, "--",
                    "/usr/bin/env", "-0",
                ],
                environment: ["VAULTD_INSTANCE_URL": "https://stale.example", "VAULTD_SCOPE": "stale", "URL": "stale"]))
        #expect(
            environment(run.stdout, SessionField.allCases.map(\.variable) + ["URL"]) == variables(fields),
            "\(run.stderr)")
    }

    @Test("Should restart exec's command with the refreshed session's fields")
    func execFollowsRefresh() async throws {
        let server = try TokenServer(["--lifetime", "3600", "--salesforce"])
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("sinkr")
        #expect(
            try vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await grant(server, scope: "api"))
                .status == 0)
        let out = fixture.directory.path("seen")
        let marker = "4\(Int.random(in: 100...999))1"
        let (process, stdout, stderr) = try startInterruptible(
            Binaries.vaultctl.path,
            [
                "--socket", fixture.socketPath, "exec", "--env", "EXP=expires_at", "oauth", user, "--", "/bin/sh",
                "-c",
                "echo \"$VAULTD_TOKEN $VAULTD_EXPIRES_AT $EXP $VAULTD_INSTANCE_URL $VAULTD_SCOPE\" >> \(out); "
                    + "exec sleep \(marker)",
            ])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        func line(_ f: [String: String]) -> String {
            [f["token"], f["expires_at"], f["expires_at"], f["instance_url"], f["scope"]].map { $0 ?? "-" }
                .joined(separator: " ")
        }
        let lines = { ((content(out) ?? "").split(separator: "\n").map(String.init)) }
        let first = try await eventually(lines, until: { $0.count == 1 })
        #expect(first == [line(try expected(fixture, user))], "\(stderr.text)")
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let second = try await eventually(lines, until: { $0.count == 2 })
        let now = line(try expected(fixture, user))
        #expect(second.count == 2 && second.last == now, "\(second) \(stderr.text)")
        #expect(second.first != second.last)
        #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
        #expect(stdout.waitForEnd(seconds: 20) && stderr.waitForEnd(seconds: 20), "\(stderr.text)")
        #expect(try reap(process) == 75, "\(stderr.text)")
    }

    /// A daemon whose `oauth` account `user` keeps a token file of `format` in `directory`.
    func start(_ server: TokenServer, _ user: String, _ format: String, _ directory: TokenDirectory) throws
        -> DaemonFixture
    {
        let fixture = try DaemonFixture(
            oauthServer: server,
            extra: "\n[Account oauth \(user)]\nTokenFile=\(directory.file("session"))\nTokenFileFormat=\(format)\n")
        try fixture.start()
        return fixture
    }

    /// The token file read with Python's json.load, as a flat dictionary of strings.
    func loadJSON(_ path: String) throws -> [String: String] {
        let script =
            "import json, sys\nwith open(sys.argv[1]) as f: d = json.load(f)\n"
            + "assert isinstance(d['expires_at'], int)\nprint(json.dumps({k: str(v) for k, v in d.items()}))"
        let result = try runCommand(URL(fileURLWithPath: "/usr/bin/python3"), ["-c", script, path])
        guard result.status == 0, let object = try JSON.parse(Array(result.stdout.utf8)).objectValue else {
            throw HarnessError("python3 could not read \(path): \(result.stderr)")
        }
        return object.compactMapValues(\.stringValue)
    }

    @Test("Should keep TokenFileFormat=json a document json.load reads, in step with refreshes")
    func jsonFile() async throws {
        let server = try TokenServer(["--lifetime", "3600", "--salesforce"])
        let directory = try TokenDirectory()
        let user = uniqueName("json")
        let fixture = try start(server, user, "json", directory)
        let path = directory.file("session")
        #expect(
            try vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await grant(server, scope: "api id"))
                .status == 0)
        let first = try expected(fixture, user)
        #expect(first["scope"] == "api id" && first["instance_url"] == server.url)
        _ = try await eventually({ content(path) }, until: { $0 != nil })
        #expect(try loadJSON(path) == first)
        var st = stat()
        #expect(lstat(path, &st) == 0 && st.st_mode & 0o7777 == 0o600)

        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let second = try expected(fixture, user)
        #expect(second["token"] != first["token"])
        _ = try await eventually({ try? loadJSON(path) }, until: { $0 == second })
        #expect(try loadJSON(path) == second)
        #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
        #expect(try await eventually({ content(path) }, until: { $0 == nil }) == nil)
    }

    /// The variables systemd reads from an EnvironmentFile= `path`: its own
    /// parser (the one of environment.d(5), which also serves
    /// EnvironmentFile=) run by the environment.d generator, whose output
    /// quotes values with double quotes where they need it.
    func systemdReads(_ path: String, in directory: TokenDirectory) throws -> [String: String] {
        let generator = "/usr/lib/systemd/user-environment-generators/30-systemd-environment-d-generator"
        let config = directory.file("config")
        try FileManager.default.createDirectory(atPath: config + "/environment.d", withIntermediateDirectories: true)
        try? FileManager.default.removeItem(atPath: config + "/environment.d/50-vaultd.conf")
        try FileManager.default.copyItem(atPath: path, toPath: config + "/environment.d/50-vaultd.conf")
        let result = try runCommand(
            URL(fileURLWithPath: "/usr/bin/env"), ["-i", "XDG_CONFIG_HOME=" + config, generator])
        guard result.status == 0 else { throw HarnessError("\(generator): \(result.stderr)") }
        var out: [String: String] = [:]
        for line in result.stdout.split(separator: "\n") where line.hasPrefix("VAULTD_") {
            let parts = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            var value = String(parts[1])
            if value.hasPrefix("\""), value.hasSuffix("\""), value.count >= 2 {
                // The generator's double quotes: a backslash keeps the character after it.
                var unquoted = ""
                var escaped = false
                for character in value.dropFirst().dropLast() {
                    if !escaped && character == "\\" {
                        escaped = true
                        continue
                    }
                    unquoted.append(character)
                    escaped = false
                }
                value = unquoted
            }
            out[String(parts[0])] = value
        }
        return out
    }

    /// The variables a POSIX shell gets from `set -a; . FILE`.
    func shellReads(_ path: String) throws -> [String: String] {
        let result = try runCommand(
            URL(fileURLWithPath: "/usr/bin/env"),
            ["-i", "/bin/sh", "-c", "set -a; . \"$1\"; exec /usr/bin/env -0", "sh", path])
        guard result.status == 0 else { throw HarnessError("sh could not read \(path): \(result.stderr)") }
        return environment(result.stdout)
    }

    @Test("Should keep TokenFileFormat=env lines systemd's EnvironmentFile= parser and sh read alike, in step")
    func envFile() async throws {
        let server = try TokenServer(["--lifetime", "3600", "--salesforce"])
        let directory = try TokenDirectory()
        let user = uniqueName("env")
        let fixture = try start(server, user, "env", directory)
        let path = directory.file("session")
        // Spaces, double quotes and a backslash: values that must be quoted.
        let scope = #"api "chat" a\b"#
        #expect(
            try vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await grant(server, scope: scope))
                .status == 0)
        let first = variables(try expected(fixture, user))
        #expect(first["VAULTD_SCOPE"] == scope && first["VAULTD_INSTANCE_URL"] == server.url)
        _ = try await eventually({ content(path) }, until: { $0 != nil })
        #expect(try systemdReads(path, in: directory) == first)
        #expect(try shellReads(path) == first)

        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let second = variables(try expected(fixture, user))
        #expect(second["VAULTD_TOKEN"] != first["VAULTD_TOKEN"])
        _ = try await eventually({ try? shellReads(path) }, until: { $0 == second })
        #expect(try systemdReads(path, in: directory) == second)
        #expect(try shellReads(path) == second)
    }

    @Test("Should refuse to write an env file a value cannot go in, and say which field, not its value")
    func envFileRefused() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let directory = try TokenDirectory()
        let user = uniqueName("envq")
        let fixture = try start(server, user, "env", directory)
        #expect(
            try vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await grant(server, scope: "it's"))
                .status == 0)
        let token = try #require(try expected(fixture, user)["token"])
        let status = {
            try JSON.parse(Array(try vaultctl(fixture.socketPath, ["--json", "status", "oauth", user]).stdout.utf8))
        }
        let error = try await eventually(
            { try status()["session"]?["tokenFileError"]?.stringValue }, until: { $0 != nil })
        #expect(
            error?.contains("the session's scope holds a character an env file cannot carry") == true, "\(error ?? "")")
        #expect(error?.contains(token) == false)
        #expect(content(directory.file("session")) == nil)
    }
}
