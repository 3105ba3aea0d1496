import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore

/// `vaultctl exec` against the real daemon and token server: the token goes
/// into the command's environment, a refresh restarts or signals it, the end
/// of the session stops it, and its own exit status comes back.
@Suite("vaultctl exec", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ExecTests {
    /// A daemon with one oauth2 provider, and a session logged in there.
    func start(_ server: TokenServer) async throws -> (DaemonFixture, String) {
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("exec")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        return (fixture, user)
    }

    /// The lines of `path` (empty while it does not exist).
    func lines(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// The processes whose command line starts with `marker`.
    func processes(_ marker: String) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { pid_t($0) }.filter { pid in
            let bytes = FileManager.default.contents(atPath: "/proc/\(pid)/cmdline") ?? Data()
            return String(decoding: bytes.map { $0 == 0 ? 0x20 : $0 }, as: UTF8.self).hasPrefix(marker)
        }
    }

    /// Should start the command with the token, restart it with the new one
    /// after a refresh, and stop it and exit 75 when the session is kicked.
    @Test func restartsOnRefreshAndStopsOnKick() async throws {
        // Tokens that live an hour: only the test's own refreshes happen.
        let server = try TokenServer(["--lifetime", "3600"])
        let (fixture, user) = try await start(server)
        let out = fixture.directory.path("tokens")
        let marker = "3\(Int.random(in: 100...999))7"
        let (process, stdout, stderr) = try startInterruptible(
            Binaries.vaultctl.path,
            [
                "--socket", fixture.socketPath, "exec", "--env", "TOK", "oauth", user, "--", "/bin/sh", "-c",
                "echo \"$TOK\" >> \(out); exec sleep \(marker)",
            ])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        let first = try await eventually({ lines(out) }, until: { $0.count == 1 })
        let token = try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout
        #expect(first == [token.trimmingCharacters(in: .newlines)], "\(stderr.text)")

        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let second = try await eventually({ lines(out) }, until: { $0.count == 2 })
        let refreshed = try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout
        #expect(second.count == 2 && second[1] == refreshed.trimmingCharacters(in: .newlines), "\(stderr.text)")
        #expect(second.first != second.last, "the restarted command has the new token")
        let running = try await eventually({ processes("sleep \(marker)") }, until: { $0.count == 1 })
        #expect(running.count == 1, "the old command was stopped, the new one runs: \(running)")

        #expect(try vaultctl(fixture.socketPath, ["kick", "oauth", user]).status == 0)
        #expect(stdout.waitForEnd(seconds: 20), "vaultctl exec ends with the session")
        // Both streams to their end: stderr's reader may still hold the last line.
        #expect(stderr.waitForEnd(seconds: 20), "\(stderr.text)")
        #expect(try reap(process) == 75, "\(stderr.text)")
        #expect(stderr.text.contains("kickedOffline"), "\(stderr.text)")
        let left = try await eventually({ processes("sleep \(marker)") }, until: { $0.isEmpty })
        #expect(left.isEmpty, "the command was stopped: \(left)")
    }

    /// Should send the command the signal --on-refresh names instead of
    /// restarting it, and pass SIGTERM on to it and exit with its status.
    @Test func signalsOnRefreshAndForwardsSIGTERM() async throws {
        // Tokens that live an hour: only the test's own refreshes happen.
        let server = try TokenServer(["--lifetime", "3600"])
        let (fixture, user) = try await start(server)
        let out = fixture.directory.path("log")
        let (process, stdout, stderr) = try startInterruptible(
            Binaries.vaultctl.path,
            [
                "--socket", fixture.socketPath, "exec", "--on-refresh", "signal:HUP", "oauth", user, "--", "/bin/sh",
                "-c",
                "trap 'echo hup >> \(out)' HUP; echo \"start $VAULTD_TOKEN\" >> \(out); "
                    + "while :; do sleep 1 & wait $!; done",
            ])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        _ = try await eventually({ lines(out) }, until: { $0.count == 1 })
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let after = try await eventually({ lines(out) }, until: { $0.contains("hup") })
        #expect(after.filter { $0.hasPrefix("start ") }.count == 1, "not restarted: \(after)")
        #expect(after.contains("hup"), "\(after) \(stderr.text)")

        kill(process.processIdentifier, SIGTERM)
        #expect(stdout.waitForEnd(seconds: 20))
        #expect(try reap(process) == 128 + SIGTERM, "the command's own status: killed by SIGTERM")
    }

    /// Runs `exec --on-refresh signal:HUP` (and `extra`) with a command that
    /// traps SIGHUP and starts a grandchild that traps SIGUSR1 (and, with
    /// `grandchildTrapsHUP`, SIGHUP), refreshes once, and returns the log's
    /// lines once the command logged `hup`, the grandchild's pid, and the
    /// running vaultctl.
    func refreshSignalsFamily(_ extra: [String], grandchildTrapsHUP: Bool) async throws -> (
        log: String, lines: [String], grandchild: pid_t, stop: () throws -> Int32
    ) {
        // Tokens that live an hour: only the test's own refreshes happen.
        let server = try TokenServer(["--lifetime", "3600"])
        let (fixture, user) = try await start(server)
        let out = fixture.directory.path("log")
        let grandchildHUP = grandchildTrapsHUP ? "trap \"echo grandchild-hup >> \(out)\" HUP; " : ""
        let grandchild =
            "/bin/sh -c '\(grandchildHUP)trap \"echo usr1 >> \(out)\" USR1; echo \"grandchild $$\" >> \(out); "
            + "while :; do sleep 1 & wait $!; done' &"
        let (process, _, stderr) = try startInterruptible(
            Binaries.vaultctl.path,
            ["--socket", fixture.socketPath, "exec", "--on-refresh", "signal:HUP"] + extra + [
                "oauth", user, "--", "/bin/sh", "-c",
                "trap 'echo hup >> \(out)' HUP; \(grandchild) echo \"start $VAULTD_TOKEN\" >> \(out); "
                    + "while :; do sleep 1 & wait $!; done",
            ])
        let started = try await eventually({ lines(out) }, until: { $0.count == 2 })
        let pid = started.compactMap { $0.hasPrefix("grandchild ") ? pid_t($0.dropFirst(11)) : nil }.first
        guard let pid else {
            kill(process.processIdentifier, SIGKILL)
            throw HarnessError("the grandchild did not start: \(started) \(stderr.text)")
        }
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let after = try await eventually({ lines(out) }, until: { $0.contains("hup") })
        #expect(after.contains("hup"), "the command got SIGHUP: \(after) \(stderr.text)")
        return (
            out, after, pid,
            {
                // SIGTERM goes on to the command's group; vaultctl ends with the command.
                kill(process.processIdentifier, SIGTERM)
                withExtendedLifetime(fixture) {}
                return try reap(process)
            }
        )
    }

    /// Should send the --on-refresh signal to the command alone: a
    /// grandchild that does not expect SIGHUP (whose default ends a process)
    /// lives on and still answers.
    @Test func signalsTheCommandAlone() async throws {
        let run = try await refreshSignalsFamily([], grandchildTrapsHUP: false)
        #expect(kill(run.grandchild, SIGUSR1) == 0, "the grandchild is there")
        let answered = try await eventually({ lines(run.log) }, until: { $0.contains("usr1") })
        #expect(answered.contains("usr1"), "the grandchild lived through the refresh: \(answered)")
        #expect(try run.stop() == 128 + SIGTERM)
    }

    /// Should send the --on-refresh signal to the command's whole process
    /// group with --signal-group.
    @Test func signalsTheGroupWithSignalGroup() async throws {
        let run = try await refreshSignalsFamily(["--signal-group"], grandchildTrapsHUP: true)
        let both = try await eventually({ lines(run.log) }, until: { $0.contains("grandchild-hup") })
        #expect(both.contains("grandchild-hup"), "the grandchild got SIGHUP too: \(both)")
        #expect(try run.stop() == 128 + SIGTERM)
    }

    /// Should exit with the command's own status when it ends by itself.
    @Test func passesTheCommandsStatus() async throws {
        // Tokens that live an hour: only the test's own refreshes happen.
        let server = try TokenServer(["--lifetime", "3600"])
        let (fixture, user) = try await start(server)
        let result = try vaultctl(fixture.socketPath, ["exec", "oauth", user, "--", "/bin/sh", "-c", "exit 7"])
        #expect(result.status == 7, "\(result.stderr)")
        try expectFailure(
            vaultctl(fixture.socketPath, ["exec", "oauth", user, "--", "/nonexistent/program"]),
            saying: "cannot run /nonexistent/program")
        try expectFailure(
            vaultctl(fixture.socketPath, ["exec", "oauth", "nobody-here", "--", "true"]), saying: "ERR_NOT_LOGGED_IN")
    }
}
