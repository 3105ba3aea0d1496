import Foundation
import Glibc
import Testing
import VaultCore

@testable import VaultDaemon

/// Issue 10: what exec helpers print never leaks, and helpers of one provider
/// cannot hold up another's. Real vaultd, real helper programs.
@Suite("exec helper security", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct HelperSecurityTests {
    /// The access token the leaky helper's login hands out (a known secret).
    static let accessToken = "known_access_token_0123456789ABCDEF"

    /// Writes `text` as an executable helper `name` in `directory`; returns its path.
    func helper(_ directory: TemporaryDirectory, _ name: String, _ text: String) throws -> String {
        let path = directory.path(name)
        try writeExecutable(text, to: path)
        return path
    }

    @Test("Should never log, keep as last error or answer a secret a failing helper prints on stdout or stderr")
    func failingHelperLeaksNothing() throws {
        let helpers = try TemporaryDirectory()
        // Login of alice works; her refresh and bob's login fail, printing
        // secrets on stdout (token fields, the message) and on stderr, one
        // of them across byte 2,048 (where vaultd cuts what it logs).
        let path = try helper(
            helpers, "leaky-helper",
            """
            #!/usr/bin/python3
            import json, sys
            request = json.load(sys.stdin)
            if request["action"] == "login" and request["user"] == "alice":
                print(json.dumps({"access_token": "\(HelperSecurityTests.accessToken)"}))
                sys.exit(0)
            if request["action"] == "revoke":
                print("{}")
                sys.exit(0)
            head = "apiKey=SECRETMARKERapikey0123456789 connecting\\n"
            if request["user"] == "alice":
                straddling = request["accessToken"]
            else:
                straddling = '"refresh_token": "SECRETMARKERstderr0123456789abcdef"'
            sys.stderr.write(head + "x" * (2040 - len(head)) + straddling + " tail\\n")
            message = "bad token %s (password: SECRETMARKERpassword99)" % (
                request.get("accessToken") or "abcdSECRETMARKERmessage0123456789")
            print(json.dumps({"error": "x", "message": message, "access_token": "SECRETMARKERstdout0123456789"}))
            sys.exit(1)
            """)
        let fixture = try ConfiguredDaemon(config: "[Provider leaky]\nType=exec\nCommand=\(path)\n")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "leaky", "alice", "--from-provider"]))
        let refresh = try expectFailure(vaultctl(fixture.socketPath, ["refresh", "leaky", "alice"]))
        let failedLogin = try expectFailure(vaultctl(fixture.socketPath, ["login", "leaky", "bob", "--from-provider"]))
        let status = try vaultctl(fixture.socketPath, ["--json", "status", "leaky", "alice"])
        #expect(status.stdout.contains("lastError"), "the failed refresh is reported: \(status.stdout)")
        #expect(status.stdout.contains("bad token"), "the masked message is kept: \(status.stdout)")
        _ = try vaultctl(fixture.socketPath, ["logout", "leaky", "alice"])
        // Stopped, so that every line it logged is written.
        fixture.daemon.stop()
        let everything = [
            ("vaultd's log", fixture.daemon.allOutput), ("status", status.stdout), ("refresh", refresh.stderr),
            ("login", failedLogin.stderr),
        ]
        for (name, text) in everything {
            #expect(!text.contains("SECRETMARKER"), "\(name) shows a secret the helper printed:\n\(text)")
            #expect(!text.contains("known_access_token_0"), "\(name) shows the session's token:\n\(text)")
        }
        #expect(fixture.daemon.allOutput.contains("helper stderr"), "the helper's stderr is logged, masked")
    }

    @Test("Should answer another user's login through a fast provider while a slow provider's helpers hang")
    func slowProviderDoesNotDelayAnother() throws {
        try TestUsers.ensure()
        let helpers = try TemporaryDirectory()
        chmod(helpers.url.path, 0o755)
        let release = helpers.path("release")
        // Blocks until the release file appears (at most a minute), after
        // telling the test it started.
        let slow = try helper(
            helpers, "slow-helper",
            """
            #!/usr/bin/python3
            import json, os, sys, time
            request = json.load(sys.stdin)
            open("\(helpers.path("started-"))" + request["user"], "w").close()
            for _ in range(1200):
                if os.path.exists("\(release)"):
                    break
                time.sleep(0.05)
            print(json.dumps({"access_token": "slow_token_%s_abcdefghijkl" % request["user"]}))
            """)
        let fast = try helper(
            helpers, "fast-helper",
            """
            #!/bin/sh
            cat >/dev/null
            echo '{"access_token":"fast_token_abcdefghijklmnop"}'
            """)
        let fixture = try ConfiguredDaemon(
            config: """
                [Vault]
                SocketMode=0666

                [Provider slow]
                Type=exec
                Command=\(slow)
                Timeout=5min

                [Provider fast]
                Type=exec
                Command=\(fast)
                MintUsers=\(TestUsers.a)
                """)
        func started() -> Int {
            ((try? FileManager.default.contentsOfDirectory(atPath: helpers.url.path)) ?? [])
                .filter { $0.hasPrefix("started-") }.count
        }
        // 40 logins through the slow provider, in flight at once.
        var slowLogins: [Process] = []
        defer {
            FileManager.default.createFile(atPath: release, contents: nil)
            for process in slowLogins where process.isRunning { kill(process.processIdentifier, SIGKILL) }
            for process in slowLogins { _ = try? reap(process, seconds: 60) }
        }
        for index in 0..<40 {
            let process = Process()
            process.executableURL = Binaries.vaultctl
            process.arguments = ["--socket", fixture.socketPath, "login", "slow", "user\(index)", "--from-provider"]
            process.standardInput = FileHandle.nullDevice
            process.standardOutput = FileHandle.nullDevice
            process.standardError = FileHandle.nullDevice
            try process.run()
            slowLogins.append(process)
        }
        for _ in 0..<400 where started() < 4 { usleep(50_000) }
        try #require(started() >= 4, "the slow helpers did not start")

        // Another user's login through the fast provider: answered at once,
        // well within the bound (before the fix it waited for libdispatch to
        // grow a thread per hanging helper, about a second each).
        guard let uid = TestUsers.uid(TestUsers.a), let gid = TestUsers.gid(TestUsers.a) else {
            throw HarnessError("no user \(TestUsers.a)")
        }
        try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/setpriv"),
                [
                    "--reuid=\(uid)", "--regid=\(gid)", "--init-groups", Binaries.vaultctl.path, "--socket",
                    fixture.socketPath, "login", "fast", "alice", "--from-provider",
                ], seconds: 15))
        #expect(slowLogins.allSatisfy { $0.isRunning }, "the slow logins are still in flight")
        #expect(started() == 4, "MaxConcurrentHelpers defaults to 4: \(started()) slow helpers started")

        FileManager.default.createFile(atPath: release, contents: nil)
        for process in slowLogins {
            #expect(try reap(process, seconds: 60) == 0, "each slow login ends once released")
        }
        #expect(started() == 40)
    }

    @Test(
        "Should fail a run that waited its whole timeout for a free helper slot, saying so, while the slot holder hangs"
    )
    func queueTimeout() async throws {
        let helpers = try TemporaryDirectory()
        let release = helpers.path("release")
        let hanging = try helper(
            helpers, "hanging-helper",
            """
            #!/bin/sh
            cat >/dev/null
            touch \(helpers.path("started"))
            for i in $(seq 600); do [ -e \(release) ] && break; sleep 0.1; done
            echo '{"access_token":"late_token_abcdefghijklmnop"}'
            """)
        defer { FileManager.default.createFile(atPath: release, contents: nil) }
        let pool = WorkerPool(workers: [.helper: 2])
        let holder = Task {
            await ExecProvider.spawn(
                ExecSettings(command: [hanging], timeoutSeconds: 120, maxConcurrentHelpers: 1), provider: "p",
                input: ["action": "login"], pool: pool)
        }
        for _ in 0..<400 where !FileManager.default.fileExists(atPath: helpers.path("started")) {
            try await Task.sleep(for: .milliseconds(50))
        }
        try #require(FileManager.default.fileExists(atPath: helpers.path("started")))
        let waited = await ExecProvider.spawn(
            ExecSettings(command: [hanging], timeoutSeconds: 1, maxConcurrentHelpers: 1), provider: "p",
            input: ["action": "login"], pool: pool)
        let failure = try #require(waited.failure)
        #expect(failure.contains("waited the whole time for a free helper slot"), "\(failure)")
        #expect(failure.contains("MaxConcurrentHelpers="), "\(failure)")
        FileManager.default.createFile(atPath: release, contents: nil)
        let held = await holder.value
        #expect(held.failure == nil && held.status == 0, "the slot holder finished once released")
    }
}
