import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore
import VaultProtocol

/// True when process `pid` exists and is no zombie (dead, not yet reaped).
func processAlive(_ pid: Int32) -> Bool {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return false }
    // The state follows the command name: "PID (comm) S ...".
    return stat[stat.index(after: close)...].dropFirst().first != "Z"
}

/// The processes alive (not zombies) whose command line holds `marker`.
func livingProcesses(marked marker: String) -> [Int32] {
    let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
    return entries.compactMap { name -> Int32? in
        guard let pid = Int32(name),
            let cmdline = FileManager.default.contents(atPath: "/proc/\(name)/cmdline"),
            String(decoding: cmdline, as: UTF8.self).contains(marker), processAlive(pid)
        else { return nil }
        return pid
    }
}

/// A daemon and the directory of its helper, which must outlive it.
struct HelperDaemon {
    let fixture: ConfiguredDaemon
    let helpers: TemporaryDirectory
    /// Marks the grandchildren of this daemon's helpers in their command lines.
    let marker: String
    var socketPath: String { fixture.socketPath }
    var daemon: RunningDaemon { fixture.daemon }
    func client() throws -> VarlinkClient { try fixture.client() }
}

/// Issue 13, "exec helper": helpers that hang, crash, print garbage or
/// megabytes, leave a child holding the pipes, or exit non-zero with secrets
/// on stderr. Each run is killed at its time limit (with all it started), its
/// output is bounded, secrets are masked, the error says what happened, and
/// vaultd keeps serving. Real vaultd, real helper processes.
@Suite("exec helper outages", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct HelperOutageTests {
    /// The helper's time limit (`Timeout=`): a Python helper may take
    /// seconds just to start on a loaded machine.
    static let timeout = 10

    /// A daemon with a static provider `demo` and an exec provider `broken`
    /// whose helper logs every user in, and fails each refresh the way the
    /// user's name starts: hang, segv, abort, garbage, mega, fork, exit3.
    func start() throws -> HelperDaemon {
        let helpers = try TemporaryDirectory()
        let helper = helpers.path("broken-helper")
        // The helpers' grandchildren are found in /proc by this mark, one per
        // test: a grandchild of an earlier test's helper (a hanging one's,
        // killed at its time limit or with its daemon) is not this test's.
        let marker = "vaultd-outage-grandchild-\(UUID().uuidString.prefix(8))"
        try writeExecutable(
            """
            #!/usr/bin/python3
            import json, os, signal, subprocess, sys, time
            request = json.load(sys.stdin)
            user = request["user"]
            mode = user.split("-")[0]
            def answer(token, code=0):
                sys.stdout.write(json.dumps({"access_token": token, "expires_in": 3600}))
                sys.stdout.flush()
                sys.exit(code)
            def grandchild():
                # Inherits stdout and stderr: the pipes stay open while it lives.
                subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", "\(marker)"])
            if request["action"] != "refresh":
                answer("tok_%s_abcdefghijklmnop" % user)
            if mode == "hang":
                grandchild()
                time.sleep(300)
            elif mode == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif mode == "abort":
                os.abort()
            elif mode == "garbage":
                sys.stdout.buffer.write(bytes(range(256)) * 12)
            elif mode == "mega":
                chunk = b"m" * 65536
                while True:
                    sys.stdout.buffer.write(chunk)
            elif mode == "fork":
                grandchild()
                answer("tok_forked_%s_abcdefghijklmnop" % user)
            elif mode == "exit3":
                sys.stderr.write("refresh failed for %s password=SECRETMARKERpassword0123\\n" % request["accessToken"])
                answer("SECRETMARKERanswer0123456789abcdef", 3)
            """, to: helper)
        let fixture = try ConfiguredDaemon(
            config: """
                [Provider demo]
                Type=static

                [Provider broken]
                Type=exec
                Command=\(helper)
                Timeout=\(HelperOutageTests.timeout)s
                """)
        return HelperDaemon(fixture: fixture, helpers: helpers, marker: marker)
    }

    /// Logs `user` in through the broken provider, then asks for a refresh;
    /// returns the refresh's result and how long it took.
    func failRefresh(_ fixture: HelperDaemon, _ user: String) throws -> (CommandResult, Double) {
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "broken", user, "--from-provider"]))
        let started = Date()
        let refresh = try vaultctl(fixture.socketPath, ["refresh", "broken", user])
        return (refresh, Date().timeIntervalSince(started))
    }

    /// Waits, bounded, until no grandchild of `fixture`'s helpers is alive; returns those still alive.
    func grandchildrenLeft(_ fixture: HelperDaemon) async throws -> [Int32] {
        try await eventually(
            tries: 100, interval: .milliseconds(50), { livingProcesses(marked: fixture.marker) },
            until: { $0.isEmpty })
    }

    @Test("Should kill a hanging helper and its grandchild at Timeout=, while another client's GetToken answers")
    func hangingHelper() async throws {
        let fixture = try start()
        let other = uniqueName("other")
        try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60).login(
            provider: "demo", user: other, token: "demo_token_abcdefghijklmnop")
        let user = "hang-" + uniqueName("u")
        #expect(try vaultctl(fixture.socketPath, ["login", "broken", user, "--from-provider"]).status == 0)
        // The refresh runs in a process of its own: no thread of this test waits for it.
        let refresh = Process()
        refresh.executableURL = Binaries.vaultctl
        refresh.arguments = ["--socket", fixture.socketPath, "refresh", "broken", user]
        let errors = Pipe()
        refresh.standardError = errors
        refresh.standardOutput = FileHandle.nullDevice
        refresh.standardInput = FileHandle.nullDevice
        let refreshErrors = OutputCollector(errors)
        let started = Date()
        try refresh.run()
        // While the helper hangs, another client's GetToken keeps answering.
        let client = try fixture.client()
        var slowest = 0.0
        var answered = 0
        let until = started.addingTimeInterval(Double(HelperOutageTests.timeout) - 0.5)
        for _ in 0..<10_000 where Date() < until {
            let asked = Date()
            let reply = try client.call(VaultMethod.getToken.rawValue, ["provider": "demo", "user": .string(other)])
            slowest = max(slowest, Date().timeIntervalSince(asked))
            if reply.parameters["token"]?.stringValue == "demo_token_abcdefghijklmnop" { answered += 1 }
            usleep(20_000)
        }
        let status = try reap(refresh, seconds: 30)
        let seconds = Date().timeIntervalSince(started)
        _ = refreshErrors.waitForEnd()
        let result = CommandResult(status: status, stdout: "", stderr: refreshErrors.text)
        #expect(result.status == 1)
        #expect(result.stderr.contains("ERR_NETWORK_ERROR"), "\(result.stderr)")
        #expect(
            result.stderr.contains("did not finish within \(HelperOutageTests.timeout)s and was killed"),
            "\(result.stderr)")
        #expect(seconds >= Double(HelperOutageTests.timeout) - 0.5 && seconds < Double(HelperOutageTests.timeout) + 5)
        #expect(answered >= 10, "GetToken answered \(answered) times during the hang")
        #expect(slowest < 1, "the slowest GetToken during the hang took \(slowest)s")
        print("OUTAGE helper=hang refresh=\(seconds)s getTokenAnswers=\(answered) slowestGetToken=\(slowest)s")
        #expect(try vaultctl(fixture.socketPath, ["token", "broken", user]).status == 0, "the old token is served")
        _ = try vaultctl(fixture.socketPath, ["logout", "broken", user])
        // Retries after the failure run (and are killed) the same way; after
        // the logout none is left once the last one's time limit passed.
        let left = try await eventually(
            tries: 200, interval: .milliseconds(50), { livingProcesses(marked: fixture.marker) },
            until: { $0.isEmpty })
        #expect(left.isEmpty, "grandchildren of killed helpers still run: \(left)")
    }

    @Test("Should take a helper's answer at once and kill the child it left holding the pipes")
    func lingeringGrandchild() async throws {
        let fixture = try start()
        for round in 0..<Soak.size(short: 2, long: 20) {
            let user = "fork-\(round)-" + uniqueName("u")
            let (result, seconds) = try failRefresh(fixture, user)
            #expect(result.status == 0, "\(result.stderr)")
            #expect(
                seconds < Double(HelperOutageTests.timeout),
                "the answer is taken when the helper exits, not when its child does: \(seconds)s")
            let token = try vaultctl(fixture.socketPath, ["token", "broken", user]).stdout
            #expect(token.hasPrefix("tok_forked_"))
            let left = try await grandchildrenLeft(fixture)
            #expect(left.isEmpty, "the helper's child still runs: \(left)")
            _ = try vaultctl(fixture.socketPath, ["logout", "broken", user])
        }
    }

    @Test(
        "Should report a crashed, garbage-printing, flooding or failing helper with a clear error, masking its secrets")
    func failingHelpers() async throws {
        let fixture = try start()
        let cases: [(mode: String, expected: String)] = [
            ("segv", "crashed (signal 11, Segmentation fault) without a JSON answer"),
            ("abort", "crashed (signal 6, Aborted) without a JSON answer"),
            ("garbage", "exited 0 without a JSON answer"),
            ("mega", "wrote more than 65536 bytes to its output and was killed"),
            ("exit3", "exited 3; an answer is taken only from a helper that exits 0"),
        ]
        var messages: [String] = []
        var sessionTokens: [String] = []
        for round in 0..<Soak.size(short: 1, long: 10) {
            for (mode, expected) in cases {
                let user = "\(mode)-\(round)-" + uniqueName("u")
                let (result, seconds) = try failRefresh(fixture, user)
                #expect(result.status == 1, "\(mode)")
                #expect(result.stderr.contains("ERR_NETWORK_ERROR"), "\(mode): \(result.stderr)")
                #expect(result.stderr.contains(expected), "\(mode): \(result.stderr)")
                #expect(seconds < Double(HelperOutageTests.timeout), "\(mode) ended before its time limit: \(seconds)s")
                if round == 0 {
                    messages.append(result.stderr.trimmingCharacters(in: .whitespacesAndNewlines))
                    print("OUTAGE helper=\(mode) refresh=\(seconds)s error=\(messages.last ?? "")")
                }
                // The session keeps its token, and reports the failure.
                let token = try vaultctl(fixture.socketPath, ["token", "broken", user])
                #expect(token.stdout.hasPrefix("tok_\(user)"), "\(mode): \(token.stderr)")
                sessionTokens.append(token.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
                let status = try vaultctl(fixture.socketPath, ["--json", "status", "broken", user]).stdout
                #expect(status.contains(expected), "\(mode): \(status)")
                messages.append(status)
                _ = try vaultctl(fixture.socketPath, ["logout", "broken", user])
            }
        }
        // Still serving after all that.
        #expect(try vaultctl(fixture.socketPath, ["list"]).status == 0)
        fixture.daemon.stop()
        for text in messages + [fixture.daemon.allOutput] {
            #expect(!text.contains("SECRETMARKER"), "a secret the helper printed shows:\n\(text)")
            for token in sessionTokens {
                #expect(!text.contains(token), "the session's token shows:\n\(text)")
            }
        }
        #expect(fixture.daemon.allOutput.contains("helper stderr"), "the exit3 helper's stderr is logged, masked")
        #expect(fixture.daemon.allOutput.contains("helper stdout"), "the garbage is logged, masked")
    }
}
