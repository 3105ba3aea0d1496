import Foundation
import Glibc
import Testing
import Varlink
import VaultCore

/// scripts/run as a developer runs it, with no Secret Service reachable, so
/// it starts a private keyring: with a generated password the keyring is
/// temporary, and every session left in it is logged out (revoked at the
/// real token server) before it is discarded; with VAULTD_KEYRING_PASSWORD
/// it is kept. The binaries are this build's (VAULTD_BIN_DIR), not a release build.
@Suite("scripts/run and its private keyring", .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct RunScriptTests {
    /// A run of scripts/run with its own runtime directory, a config whose
    /// provider `oauth` revokes at `server`, and no keyring in reach.
    final class Run {
        let directory: TemporaryDirectory
        let socketPath: String
        let keyringDirectory: String
        let process: Process
        let stdout: OutputCollector
        let stderr: OutputCollector

        init(server: TokenServer, password: String?) throws {
            directory = try TemporaryDirectory()
            let runtime = directory.path("runtime")
            mkdir(runtime, 0o700)
            keyringDirectory = runtime + "/vaultd-keyring-\(getuid())"
            socketPath = directory.path("vaultd.sock")
            let config = directory.path("vaultd.conf")
            try server.providerSection(revocation: true).write(toFile: config, atomically: true, encoding: .utf8)
            var environment = [
                "-u", "DBUS_SESSION_BUS_ADDRESS", "-u", "VAULTD_KEYRING_PASSWORD", "-u",
                "VAULTD_KEYRING_PASSWORD_GENERATED", "-u", "VAULTD_SOCKET", "-u", "VAULTD_STORE_SCOPE",
                "XDG_RUNTIME_DIR=\(runtime)", "VAULTD_BIN_DIR=\(Binaries.directory.path)",
            ]
            if let password { environment.append("VAULTD_KEYRING_PASSWORD=\(password)") }
            let script = Binaries.packageRoot.appendingPathComponent("scripts/run").path
            // As a shell starts a foreground job: its own process group (here a
            // session of its own), SIGINT and SIGTERM at their defaults, nothing
            // blocked (a test thread's mask would be inherited otherwise).
            process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments =
                [
                    "-c",
                    "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                        + "signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
                        + "os.getpgid(0) == os.getpid() or os.setsid(); os.execv(sys.argv[1], sys.argv[1:])",
                    "/usr/bin/env",
                ] + environment + [script, "--config", config, "--socket", socketPath]
            let out = Pipe()
            let err = Pipe()
            process.standardOutput = out
            process.standardError = err
            process.standardInput = FileHandle.nullDevice
            stdout = OutputCollector(out)
            stderr = OutputCollector(err)
            try process.run()
        }

        /// Waits (bounded) until vaultd answers on the socket.
        func waitUntilServing() async throws {
            let list = try await eventually(
                tries: 300, interval: .milliseconds(100),
                { try vaultctl(socketPath, ["--timeout", "2", "list"]) }, until: { $0.status == 0 })
            try #require(list.status == 0, "vaultd serves: \(stdout.text)\n\(stderr.text)")
        }

        /// Sends `signal` to scripts/run (with `group`, to its whole process
        /// group, as a Ctrl-C in a terminal does) and returns its exit status (bounded).
        func stop(_ signal: Int32, group: Bool = false) throws -> Int32 {
            kill(group ? -process.processIdentifier : process.processIdentifier, signal)
            let status = try reap(process, seconds: 90)
            _ = stdout.waitForEnd(seconds: 20)
            _ = stderr.waitForEnd(seconds: 20)
            return status
        }

        /// Processes still running with this run's directory in their command
        /// line or environment (the bus, the keyring, vaultd).
        func leftovers() -> [String] {
            let needle = directory.url.path
            let pids = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
            return pids.filter { Int($0) != nil }.filter { pid in
                ["cmdline", "environ"].contains { name in
                    guard let data = FileManager.default.contents(atPath: "/proc/\(pid)/\(name)") else { return false }
                    return String(decoding: data, as: UTF8.self).contains(needle)
                }
            }
        }

        deinit {
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                _ = try? reap(process)
            }
        }
    }

    /// Logs `user` in at `oauth` with a fresh grant; returns its access token.
    func login(_ run: Run, _ server: TokenServer, _ user: String) async throws -> String {
        let grant = try await server.grant()
        let access = try #require(try JSON.parse(grant)["access_token"]?.stringValue)
        let login = try vaultctl(run.socketPath, ["login", "oauth", user], input: grant)
        try #require(login.status == 0, "\(login.stderr)")
        return access
    }

    @Test("Should log out and revoke every session of a temporary keyring at Ctrl-C, then discard it")
    func temporaryKeyringRevokedAtStop() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let run = try Run(server: server, password: nil)
        try await run.waitUntilServing()
        #expect(run.stdout.text.contains("This keyring is TEMPORARY"), "said at start: \(run.stdout.text)")
        // The generated password is never shown: anyone reading the terminal
        // or a CI log could unlock the keyring's copy on disk with it.
        let passwordLines = run.stdout.text.split(separator: "\n").filter { $0.contains("password:") }
        #expect(
            passwordLines.map { $0.trimmingCharacters(in: .whitespaces) }
                == [
                    "password:      generated for this run and not shown (set VAULTD_KEYRING_PASSWORD to choose one and keep the keyring across runs)"
                ],
            "\(passwordLines)")
        let users = [uniqueName("run"), uniqueName("run")]
        var tokens: [String] = []
        for user in users { tokens.append(try await login(run, server, user)) }
        for token in tokens { #expect(try await server.accepts(token)) }
        #expect(try await server.revocations().isEmpty)

        let status = try run.stop(SIGINT, group: true)
        #expect(status == 0, "scripts/run ends as vaultd did: \(run.stdout.text)\n\(run.stderr.text)")
        let out = run.stdout.text
        #expect(out.contains("the keyring is temporary: logging out every session left in it"), "\(out)")
        for user in users { #expect(out.contains("logged out oauth \(user)"), "\(out)") }
        #expect(out.contains("logged out 2 of 2 session(s)"), "\(out)")
        #expect(out.contains("discarded the temporary keyring"), "\(out)")
        #expect(!run.stderr.text.contains("still waiting for the provider"), "\(run.stderr.text)")
        // Revoked at the provider, not merely forgotten with the keyring.
        let revocations = try await server.revocations()
        #expect(revocations.count >= 2, "every session was revoked: \(revocations)")
        for token in tokens { #expect(try await server.accepts(token) == false, "the token no longer works") }
        #expect(!FileManager.default.fileExists(atPath: run.keyringDirectory + "/data"), "the keyring is gone")
        let left = try await eventually({ run.leftovers() }, until: { $0.isEmpty })
        #expect(left.isEmpty, "nothing of the run keeps running: pids \(left)")
    }

    @Test("Should keep the keyring and its sessions, unrevoked and unmentioned, with VAULTD_KEYRING_PASSWORD")
    func chosenPasswordKeepsKeyring() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let run = try Run(server: server, password: "run-test-password-7f3k")
        try await run.waitUntilServing()
        let token = try await login(run, server, uniqueName("keep"))

        let status = try run.stop(SIGTERM)
        #expect(status == 0, "\(run.stdout.text)\n\(run.stderr.text)")
        let out = run.stdout.text + run.stderr.text
        #expect(!out.localizedCaseInsensitiveContains("temporary"), "\(out)")
        #expect(!out.contains("logged out"), "\(out)")
        #expect(try await server.revocations().isEmpty)
        #expect(try await server.accepts(token), "the session's token still works")
        #expect(FileManager.default.fileExists(atPath: run.keyringDirectory + "/data/keyrings"), "the keyring is kept")
        let left = try await eventually({ run.leftovers() }, until: { $0.isEmpty })
        #expect(left.isEmpty, "nothing of the run keeps running: pids \(left)")
    }
}
