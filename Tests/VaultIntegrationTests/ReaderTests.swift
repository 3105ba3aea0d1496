import Foundation
import Glibc
import Testing
import Varlink
import VaultCore
import VaultProtocol

/// vaultd on a 0666 socket with the in-memory store, the static provider
/// `demo`, and `[Account demo shared]` owned by vaultd-test-b and read by
/// vaultd-test-a: what a declared reader gets of a session it may read.
final class ReaderDaemon {
    let directory: TemporaryDirectory
    let socketPath: String
    let daemon: RunningDaemon
    /// The declared account's user.
    let shared = uniqueName("shared")

    init() throws {
        directory = try TemporaryDirectory()
        chmod(directory.url.path, 0o755)
        socketPath = directory.path("vaultd.sock")
        let configPath = directory.path("vaultd.conf")
        try """
        [Vault]
        SocketMode=0666

        [Provider demo]
        Type=static

        [Account demo \(shared)]
        Owner=\(TestUsers.b)
        TokenReadUsers=\(TestUsers.a)

        """.write(toFile: configPath, atomically: true, encoding: .utf8)
        daemon = try RunningDaemon(socketPath: socketPath, configPath: configPath, extraArguments: ["--memory-store"])
    }

    /// Runs vaultctl as the owner, vaultd-test-b.
    func asOwner(_ arguments: [String], input: String? = nil) throws -> CommandResult {
        try vaultctl(as: TestUsers.b, socketPath, arguments, input: input)
    }

    /// Starts vaultctl as the reader, vaultd-test-a, in the background.
    func startAsReader(_ arguments: [String]) throws -> (Process, OutputCollector, OutputCollector) {
        let (uid, gid) = (TestUsers.uid(TestUsers.a)!, TestUsers.gid(TestUsers.a)!)
        return try startInterruptible(
            "/usr/bin/setpriv",
            ["--reuid=\(uid)", "--regid=\(gid)", "--init-groups", Binaries.vaultctl.path, "--socket", socketPath]
                + arguments)
    }

    deinit { daemon.stop() }
}

/// Issue 28, items 1 and 7: a declared reader (`TokenReadUsers=`) of another
/// uid's session is told of that session's changes as its owner is, and
/// nothing of sessions it may not read; and no connection keeps a copy of a
/// token past its session's end. Real vaultd, real second uids (setpriv).
@Suite(
    "Readers of a declared account", .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root to switch uids"))
struct ReaderTests {
    init() throws { try TestUsers.ensure() }

    /// The lines of `path` (empty while it does not exist).
    func lines(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    @Test("Should restart a reader's vaultctl exec on the owner's login --replace and stop it (75) at logout")
    func readerExecFollowsTheSession() async throws {
        let d = try ReaderDaemon()
        #expect(try d.asOwner(["login", "demo", d.shared], input: "tok_reader_exec_first_0001").status == 0)
        // A file the reader's command may append to.
        let out = d.directory.path("tokens")
        #expect(FileManager.default.createFile(atPath: out, contents: nil))
        chown(out, TestUsers.uid(TestUsers.a)!, TestUsers.gid(TestUsers.a)!)
        let marker = "4\(Int.random(in: 100...999))9"
        let (process, stdout, stderr) = try d.startAsReader([
            "exec", "--env", "TOK", "demo", d.shared, "--", "/bin/sh", "-c",
            "echo \"$TOK\" >> \(out); exec sleep \(marker)",
        ])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        let first = try await eventually(tries: 1000, { lines(out) }, until: { $0.count == 1 })
        #expect(first == ["tok_reader_exec_first_0001"], "\(stderr.text)")

        try expectSuccess(
            d.asOwner(
                ["login", "--replace", "demo", d.shared], input: "tok_reader_exec_second_002"))
        let second = try await eventually(tries: 1000, { lines(out) }, until: { $0.count == 2 })
        #expect(second.last == "tok_reader_exec_second_002", "restarted with the new token: \(second) \(stderr.text)")

        #expect(try d.asOwner(["logout", "demo", d.shared]).status == 0)
        #expect(stdout.waitForEnd(seconds: 20), "the reader's vaultctl exec ends with the session: \(stderr.text)")
        // Both streams to their end: stderr's reader may still hold the last line.
        #expect(stderr.waitForEnd(seconds: 20), "\(stderr.text)")
        #expect(try reap(process) == 75, "\(stderr.text)")
        #expect(stderr.text.contains("logoutSuccess"), "\(stderr.text)")
    }

    @Test("Should stream a reader the events of the session it may read, and none of one it may not")
    func readerSubscription() async throws {
        let d = try ReaderDaemon()
        let other = uniqueName("private")
        #expect(try d.asOwner(["login", "demo", d.shared], input: "tok_reader_watch_first_01").status == 0)
        #expect(try d.asOwner(["login", "demo", other], input: "tok_reader_private_0001").status == 0)
        let (process, stdout, stderr) = try d.startAsReader(["--json", "watch"])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        #expect(stdout.wait(for: "\n", seconds: 20), "\(stderr.text)")
        // Events of the private session come first: they would be in the
        // stream before the shared session's, which are awaited below.
        #expect(try d.asOwner(["login", "--replace", "demo", other], input: "tok_reader_private_0002").status == 0)
        #expect(try d.asOwner(["kick", "demo", other]).status == 0)
        #expect(try d.asOwner(["login", "--replace", "demo", d.shared], input: "tok_reader_watch_second").status == 0)
        #expect(try d.asOwner(["kick", "demo", d.shared]).status == 0)
        #expect(stdout.wait(for: "kickedOffline", seconds: 20), "\(stdout.text) \(stderr.text)")
        kill(process.processIdentifier, SIGTERM)
        _ = try reap(process)

        let lines = stdout.text.split(separator: "\n").compactMap { try? JSON.parse(String($0)) }
        let snapshot = lines.first?["sessions"]?.arrayValue?.compactMap { $0["user"]?.stringValue } ?? []
        #expect(snapshot == [d.shared], "the snapshot holds the readable session alone: \(stdout.text)")
        let events = lines.compactMap { $0["event"] }.map(describeEvent)
        #expect(
            events == ["tokenRefreshed demo/\(d.shared)", "kickedOffline demo/\(d.shared)"],
            "the readable session's events, none of the other: \(stdout.text)")
    }

    @Test(
        "Should keep no copy of a logged-out token in vaultd's memory while a reader's connection stays open",
        .enabled(if: geteuid() == 0, "reading vaultd's memory needs root (CAP_SYS_PTRACE)"))
    func noTokenLeftOnAReadersConnection() async throws {
        let d = try ReaderDaemon()
        let token = MemoryWipeTests.randomToken("readerwipe")
        #expect(try d.asOwner(["login", "demo", d.shared], input: token).status == 0)
        // The reader reads the token on one connection, then keeps it open, idle.
        let script = d.directory.path("reader.py")
        try #"""
        import json, socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(20)
        s.connect(sys.argv[1])
        call = {"method": "io.vaultd.Vault.GetToken", "parameters": {"provider": "demo", "user": sys.argv[2]}}
        for _ in range(2):
            s.sendall(json.dumps(call).encode() + b"\0")
            reply = b""
            while not reply.endswith(b"\0"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
            print(json.loads(reply[:-1]).get("parameters", {}).get("token", "none"), flush=True)
        sys.stdin.readline()
        """#.write(toFile: script, atomically: true, encoding: .utf8)
        let (uid, gid) = (TestUsers.uid(TestUsers.a)!, TestUsers.gid(TestUsers.a)!)
        let reader = Process()
        reader.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        reader.arguments = [
            "--reuid=\(uid)", "--regid=\(gid)", "--init-groups", "/usr/bin/python3", script, d.socketPath, d.shared,
        ]
        let input = Pipe()
        let output = Pipe()
        reader.standardInput = input
        reader.standardOutput = output
        let answers = OutputCollector(output)
        try reader.run()
        defer {
            try? input.fileHandleForWriting.close()
            _ = try? reap(reader)
        }
        #expect(answers.wait(for: "\(token)\n\(token)\n", seconds: 20), "the reader read it: \(answers.text)")
        let pid = d.daemon.process.processIdentifier
        #expect(!(try ProcessMemory.find(Array(token.utf8), in: pid)).isEmpty, "the scan finds a live token")

        #expect(try d.asOwner(["logout", "demo", d.shared]).status == 0)
        let gone = try await eventually(
            tries: 1000, { try d.asOwner(["status", "demo", d.shared]) },
            until: { $0.stderr.contains("ERR_NOT_LOGGED_IN") })
        #expect(gone.stderr.contains("ERR_NOT_LOGGED_IN"), "\(gone.stderr)")
        #expect(reader.isRunning, "the reader's connection is still open")
        let hits = try ProcessMemory.find(Array(token.utf8), in: pid)
        #expect(
            hits.isEmpty, "\(hits.count) copies survive logout:\n\(hits.map(\.description).joined(separator: "\n"))")
    }
}
