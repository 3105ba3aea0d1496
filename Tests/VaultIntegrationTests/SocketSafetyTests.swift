import Foundation
import Glibc
import Testing
import VaultClient
import VaultSystem

/// Nobody but vaultd's user and root can stand in for vaultd's socket: vaultd
/// refuses a socket directory others could write, sets the socket's mode
/// without a chmod by path, and vaultctl sends nothing to a socket served by
/// another uid. Real vaultd, real sockets, a real second uid.
@Suite(
    "The socket on a shared host", .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root to create users"))
struct SocketSafetyTests {
    init() throws { try TestUsers.ensure() }

    /// Starts vaultd on `directory/vaultd.sock` and expects it to refuse, naming the directory.
    func expectRefusal(_ directory: String, _ problem: String) throws {
        let daemon = try RunningDaemon(
            socketPath: directory + "/vaultd.sock", configPath: nil, waitForReady: false,
            extraArguments: ["--memory-store"])
        #expect(daemon.waitForExit() == 1, "\(daemon.output.text)")
        let text = daemon.output.text
        #expect(text.contains("the socket directory \(directory) is not safe: \(problem)"), "\(text)")
        #expect(text.contains("only its owner may write"), "\(text)")
        #expect(!text.contains("notice: ready"))
        #expect(!Files.exists(directory + "/vaultd.sock"))
    }

    @Test("Should refuse a socket directory owned by another user")
    func directoryOfAnotherUser() throws {
        let dir = try TemporaryDirectory()
        let run = dir.path("run")
        try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: false)
        let uid = try #require(TestUsers.uid(TestUsers.a))
        #expect(chown(run, uid, TestUsers.gid(TestUsers.a)!) == 0)
        #expect(chmod(run, 0o700) == 0)
        try expectRefusal(run, "\(run) belongs to uid \(uid)")
    }

    @Test("Should refuse a world-writable socket directory, sticky bit or not")
    func worldWritableDirectory() throws {
        for mode: mode_t in [0o777, 0o1777, 0o770] {
            let dir = try TemporaryDirectory()
            let run = dir.path("run")
            try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: false)
            #expect(chmod(run, mode) == 0)
            let who = mode & 0o002 != 0 ? "others" : "its group"
            try expectRefusal(run, "\(run) is writable by \(who) (mode \(String(mode, radix: 8)))")
        }
    }

    @Test("Should refuse a good socket directory inside one another user could change")
    func writableAncestor() throws {
        let dir = try TemporaryDirectory()
        let shared = dir.path("shared")
        let run = shared + "/run"
        try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: true)
        #expect(chmod(run, 0o700) == 0)
        // Group-writable without the sticky bit: its group could rename run away.
        #expect(chmod(shared, 0o775) == 0)
        let daemon = try RunningDaemon(
            socketPath: run + "/vaultd.sock", configPath: nil, waitForReady: false,
            extraArguments: ["--memory-store"])
        #expect(daemon.waitForExit() == 1, "\(daemon.output.text)")
        let text = daemon.output.text
        #expect(text.contains("\(shared) is writable by its group (mode 775) without the sticky bit"), "\(text)")
        #expect(!Files.exists(run + "/vaultd.sock"))
        // Owned by another user, even 0755: refused too.
        #expect(chmod(shared, 0o755) == 0)
        let uid = try #require(TestUsers.uid(TestUsers.a))
        #expect(chown(shared, uid, TestUsers.gid(TestUsers.a)!) == 0)
        let again = try RunningDaemon(
            socketPath: run + "/vaultd.sock", configPath: nil, waitForReady: false,
            extraArguments: ["--memory-store"])
        #expect(again.waitForExit() == 1, "\(again.output.text)")
        #expect(again.output.text.contains("\(shared) belongs to uid \(uid)"), "\(again.output.text)")
    }

    @Test("Should refuse a socket directory that is a symlink, even to a good directory")
    func symlinkDirectory() throws {
        let dir = try TemporaryDirectory()
        try FileManager.default.createDirectory(atPath: dir.path("real"), withIntermediateDirectories: false)
        #expect(chmod(dir.path("real"), 0o700) == 0)
        #expect(symlink(dir.path("real"), dir.path("link")) == 0)
        try expectRefusal(dir.path("link"), "\(dir.path("link")) is a symlink")
    }

    @Test("Should walk the socket path as given: refuse a symlink of another user above the directory, follow root's")
    func symlinkAboveOfAnotherUser() throws {
        let dir = try TemporaryDirectory()
        #expect(chmod(dir.url.path, 0o755) == 0)
        let run = dir.path("real/run")
        try FileManager.default.createDirectory(atPath: run, withIntermediateDirectories: true)
        #expect(chmod(dir.path("real"), 0o755) == 0 && chmod(run, 0o700) == 0)
        // The resolved path is all root's: only the path as given shows the other user's symlink.
        #expect(Glibc.symlink(dir.path("real"), dir.path("via")) == 0)
        let uid = try #require(TestUsers.uid(TestUsers.a))
        #expect(lchown(dir.path("via"), uid, TestUsers.gid(TestUsers.a)!) == 0)
        try expectRefusal(
            dir.path("via/run"), "\(dir.path("via")) is a symlink of uid \(uid), who could point it elsewhere")

        // A socket directory still to make: not made through their symlink.
        let made = try RunningDaemon(
            socketPath: dir.path("via/new/vaultd.sock"), configPath: nil, waitForReady: false,
            extraArguments: ["--memory-store"])
        #expect(made.waitForExit() == 1, "\(made.output.text)")
        #expect(
            made.output.text.contains(
                "cannot create the socket directory \(dir.path("via/new")): \(dir.path("via")) is a symlink of uid \(uid)"
            ),
            "\(made.output.text)")
        #expect(!Files.exists(dir.path("real/new")), "no directory made where their symlink points")

        // The same symlink given to root: followed, and vaultd listens.
        #expect(lchown(dir.path("via"), 0, 0) == 0)
        let daemon = try RunningDaemon(
            socketPath: dir.path("via/run/vaultd.sock"), configPath: nil, extraArguments: ["--memory-store"])
        #expect(Files.exists(run + "/vaultd.sock"))
        #expect(daemon.stop() == 0)
    }

    @Test("Should give the socket its configured mode, 0600 or 0666, in a directory vaultd made")
    func configuredModes() throws {
        for (mode, directoryMode): (mode_t, mode_t) in [(0o600, 0o700), (0o666, 0o755)] {
            let dir = try TemporaryDirectory()
            let config = dir.path("vaultd.conf")
            try "[Vault]\nSocketMode=0\(String(mode, radix: 8))\n".write(
                toFile: config, atomically: true, encoding: .utf8)
            let path = dir.path("run/socket")
            let daemon = try RunningDaemon(socketPath: path, configPath: config, extraArguments: ["--memory-store"])
            var st = stat()
            #expect(lstat(path, &st) == 0)
            #expect(st.st_mode & S_IFMT == S_IFSOCK)
            #expect(st.st_mode & 0o7777 == mode)
            #expect(lstat(dir.path("run"), &st) == 0)
            #expect(st.st_mode & 0o7777 == directoryMode)
            #expect(daemon.stop() == 0)
        }
    }

    @Test("Should never chmod the target of a symlink put at the socket path while vaultd binds")
    func symlinkAtSocketPath() throws {
        let dir = try TemporaryDirectory()
        let config = dir.path("vaultd.conf")
        try "[Vault]\nSocketMode=0666\n".write(toFile: config, atomically: true, encoding: .utf8)
        let target = dir.path("precious")
        try "root's file\n".write(toFile: target, atomically: true, encoding: .utf8)
        #expect(chmod(target, 0o600) == 0)
        let path = dir.path("vaultd.sock")
        let moved = dir.path("moved.sock")
        // strace holds every chmod of vaultd half a second, the window an
        // attacker would race for; the test swaps a symlink in as soon as the
        // socket file appears. vaultd must not chmod by path at all.
        let daemon = try RunningDaemon(
            socketPath: path, configPath: config, waitForReady: false, extraArguments: ["--memory-store"],
            launcher: [
                "/usr/bin/strace", "-f", "-qq", "-o", "/dev/null", "-e", "trace=chmod,fchmodat",
                "-e", "inject=chmod,fchmodat:delay_enter=500000",
            ])
        defer {
            // SIGTERM to vaultd itself, strace's child: strace then exits with it.
            let strace = daemon.process.processIdentifier
            let children = (try? String(contentsOfFile: "/proc/\(strace)/task/\(strace)/children", encoding: .utf8))
            for child in children?.split(separator: " ").compactMap({ Int32($0) }) ?? [] { kill(child, SIGTERM) }
            #expect(daemon.waitForExit() == 0)
        }
        let deadline = Date().addingTimeInterval(20)
        var st = stat()
        var swapped = false
        while Date() < deadline, daemon.process.isRunning {
            if lstat(path, &st) == 0, st.st_mode & S_IFMT == S_IFSOCK {
                #expect(rename(path, moved) == 0)
                #expect(symlink(target, path) == 0)
                swapped = true
                break
            }
            usleep(200)
        }
        #expect(swapped, "the socket never appeared: \(daemon.output.text)")
        #expect(daemon.output.wait(for: "notice: ready"), "\(daemon.output.text)")
        #expect(stat(target, &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o600, "the symlink's target was chmod-ed")
        #expect(lstat(moved, &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o666, "the socket itself has the configured mode")
    }

    @Test("Should make root's vaultctl refuse, sending nothing, a socket served by another uid")
    func fakeServerOfAnotherUser() throws {
        let dir = try TemporaryDirectory()
        #expect(chmod(dir.url.path, 0o755) == 0)
        let home = dir.path("a")
        try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: false)
        let uid = try #require(TestUsers.uid(TestUsers.a))
        let gid = try #require(TestUsers.gid(TestUsers.a))
        #expect(chown(home, uid, gid) == 0)
        let socketPath = home + "/vaultd.sock"
        // A stand-in: takes one connection, reads until the first message ends
        // or the client hangs up, closes, and reports how many bytes it got.
        let script = dir.path("fake.py")
        try #"""
        import socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.bind(sys.argv[1])
        s.listen(1)
        s.settimeout(30)
        print("LISTENING", flush=True)
        conn, _ = s.accept()
        conn.settimeout(30)
        got = b""
        while not got.endswith(b"\0"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            got += chunk
        conn.close()
        print("RECEIVED", len(got), flush=True)
        """#.write(toFile: script, atomically: true, encoding: .utf8)
        let fake = Process()
        fake.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        fake.arguments = ["--reuid=\(uid)", "--regid=\(gid)", "--init-groups", "/usr/bin/python3", script, socketPath]
        let out = Pipe()
        fake.standardOutput = out
        fake.standardError = FileHandle.nullDevice
        let collector = OutputCollector(out)
        try fake.run()
        defer {
            kill(fake.processIdentifier, SIGKILL)
            _ = try? reap(fake)
        }
        #expect(collector.wait(for: "LISTENING"), "\(collector.text)")

        let login = try vaultctl(socketPath, ["login", "demo", "alice"], input: "tok_fake_server_must_not_see_1234")
        #expect(login.status == 3, "\(login.stderr)")
        #expect(
            login.stderr.contains(
                "the socket \(socketPath) is served by uid \(uid), not by root or you; refusing to send credentials"),
            "\(login.stderr)")
        // Its last line whole: waiting for "RECEIVED" alone once checked the
        // text before the count had arrived (a fresh-clone run saw "RECEIVED").
        #expect(collector.waitForEnd(), "the stand-in ended: \(collector.text)")
        #expect(collector.text.contains("RECEIVED 0\n"), "the stand-in got bytes: \(collector.text)")
    }

    @Test("Should trust root, the caller's own uid and the system service user, nobody else")
    func trustDecision() {
        #expect(VarlinkClient.trusts(peer: 0, euid: 1000, serviceUID: { nil }))
        #expect(VarlinkClient.trusts(peer: 1000, euid: 1000, serviceUID: { nil }))
        #expect(VarlinkClient.trusts(peer: 61234, euid: 1000, serviceUID: { 61234 }))
        #expect(!VarlinkClient.trusts(peer: 1001, euid: 1000, serviceUID: { 61234 }))
        #expect(!VarlinkClient.trusts(peer: 1001, euid: 0, serviceUID: { nil }))
    }
}
