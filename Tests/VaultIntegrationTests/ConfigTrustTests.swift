import Foundation
import Glibc
import Testing

/// Nobody but root and vaultd's user can change what a system instance reads
/// its configuration from: a drop-in another user wrote into a world-writable
/// `vaultd.conf.d`, or one symlinked into their own directory, would grant
/// them another user's tokens (`TokenReadUsers=`). The real `vaultd
/// --check-config`, as root, with a real second uid (setpriv) as the attacker.
@Suite(
    "Configuration files no one else can change", .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root and a second user"))
struct ConfigTrustTests {
    /// `vaultd.conf` and `vaultd.conf.d/` in a private directory of root's.
    final class Setup {
        let directory: TemporaryDirectory
        let config: String
        let dropIns: String
        let uid: uid_t
        let gid: gid_t

        init() throws {
            try TestUsers.ensure()
            uid = try #require(TestUsers.uid(TestUsers.a))
            gid = try #require(TestUsers.gid(TestUsers.a))
            directory = try TemporaryDirectory()
            #expect(chmod(directory.url.path, 0o755) == 0)
            config = directory.path("vaultd.conf")
            dropIns = config + ".d"
            try "[Provider demo]\nType=static\n\n[Account demo alice]\nOwner=0\n".write(
                toFile: config, atomically: true, encoding: .utf8)
            #expect(chmod(config, 0o644) == 0)
            #expect(mkdir(dropIns, 0o755) == 0)
        }

        /// `vaultd --config vaultd.conf --check-config`, as root.
        func check() throws -> CommandResult {
            try runCommand(Binaries.vaultd, ["--config", config, "--check-config"])
        }

        /// Runs `script` with sh as the test user, `input` on its standard input.
        func asUser(_ script: String, input: String? = nil) throws -> CommandResult {
            try runCommand(
                URL(fileURLWithPath: "/usr/bin/setpriv"),
                ["--reuid=\(uid)", "--regid=\(gid)", "--clear-groups", "/bin/sh", "-c", script], input: input)
        }
    }

    /// The drop-in another user wants read: a reader of root's session.
    static let grant = "[Account demo alice]\nTokenReadUsers=\(TestUsers.a)\n"

    @Test("Should refuse a drop-in another user wrote into a world-writable vaultd.conf.d, naming both")
    func worldWritableDropIns() throws {
        let setup = try Setup()
        #expect(try setup.check().status == 0)
        #expect(chmod(setup.dropIns, 0o1777) == 0)
        try expectSuccess(setup.asUser("umask 0; cat > \(setup.dropIns)/50-mine.conf", input: Self.grant))
        let refused = try setup.check()
        #expect(refused.status == 1, "\(refused.stdout)")
        #expect(
            refused.stderr.contains(
                "refusing to read the configuration \(setup.dropIns): \(setup.dropIns) is writable by others (mode 1777)"
            ),
            "\(refused.stderr)")

        // The directory put right, the file itself (0666, of the other user) is still refused.
        #expect(chmod(setup.dropIns, 0o755) == 0)
        let file = try expectFailure(setup.check())
        #expect(
            file.stderr.contains(
                "refusing to read the configuration \(setup.dropIns)/50-mine.conf: \(setup.dropIns)/50-mine.conf belongs to uid \(setup.uid)"
            ),
            "\(file.stderr)")
        #expect(chown(setup.dropIns + "/50-mine.conf", 0, 0) == 0)
        let writable = try setup.check()
        #expect(writable.stderr.contains("50-mine.conf is writable by others (mode 666)"), "\(writable.stderr)")
        #expect(chmod(setup.dropIns + "/50-mine.conf", 0o644) == 0)
        let fixed = try setup.check()
        #expect(fixed.status == 0, "root's own 0644 drop-in is read: \(fixed.stderr)")
        #expect(fixed.stdout.contains("read: \(setup.dropIns)/50-mine.conf"), "\(fixed.stdout)")
    }

    @Test("Should refuse a drop-in that is another user's symlink, or root's symlink into another user's directory")
    func symlinkedDropIns() throws {
        let setup = try Setup()
        let home = setup.directory.path("home")
        #expect(mkdir(home, 0o755) == 0 && chown(home, setup.uid, setup.gid) == 0)
        try expectSuccess(setup.asUser("cat > \(home)/mine.conf", input: Self.grant))
        // Root's own symlink into the user's directory: the file is theirs.
        #expect(Glibc.symlink(home + "/mine.conf", setup.dropIns + "/50-link.conf") == 0)
        try expectFailure(setup.check(), saying: "50-link.conf: \(home) belongs to uid \(setup.uid)")

        // A symlink of theirs, to a file of root's: they could point it anywhere.
        #expect(unlink(setup.dropIns + "/50-link.conf") == 0)
        try "[Provider other]\nType=static\n".write(
            toFile: setup.directory.path("roots.conf"), atomically: true, encoding: .utf8)
        #expect(Glibc.symlink(setup.directory.path("roots.conf"), setup.dropIns + "/50-link.conf") == 0)
        #expect(lchown(setup.dropIns + "/50-link.conf", setup.uid, setup.gid) == 0)
        let theirs = try expectFailure(setup.check())
        #expect(
            theirs.stderr.contains(
                "\(setup.dropIns)/50-link.conf is a symlink of uid \(setup.uid), who could point it elsewhere"),
            "\(theirs.stderr)")

        // Root's symlink to root's file is followed.
        #expect(lchown(setup.dropIns + "/50-link.conf", 0, 0) == 0)
        let roots = try expectSuccess(setup.check())
        #expect(roots.stdout.contains("configuration is valid: 2 provider(s)"), "\(roots.stdout)")
    }

    @Test("Should refuse at reload a drop-in another user wrote, keep the old configuration, and serve them no token")
    func reloadRefusesTheirDropIn() throws {
        let setup = try Setup()
        let user = uniqueName("trust")
        try "[Vault]\nSocketMode=0666\n\n[Provider demo]\nType=static\n\n[Account demo \(user)]\n".write(
            toFile: setup.config, atomically: true, encoding: .utf8)
        let socket = setup.directory.path("vaultd.sock")
        let notify = try NotifyListener(path: setup.directory.path("notify"))
        let daemon = try RunningDaemon(
            socketPath: socket, configPath: setup.config, environment: ["NOTIFY_SOCKET": notify.path])
        defer { daemon.stop() }
        let token = "tok_trust_\(UUID().uuidString)"
        #expect(try vaultctl(socket, ["login", "demo", user], input: token).status == 0)
        #expect(notify.wait(for: "READY=1") != nil)

        #expect(chmod(setup.dropIns, 0o1777) == 0)
        let grant = "[Account demo \(user)]\nTokenReadUsers=\(TestUsers.a)\n"
        #expect(try setup.asUser("cat > \(setup.dropIns)/50-mine.conf", input: grant).status == 0)
        kill(daemon.process.processIdentifier, SIGHUP)
        let ready = try #require(notify.wait(for: "READY=1"))
        #expect(ready.contains("last reload failed"), "\(ready)")
        #expect(daemon.output.wait(for: "reload refused"), "\(daemon.output.text)")
        #expect(
            daemon.output.text.contains(
                "refusing to read the configuration \(setup.dropIns): \(setup.dropIns) is writable"),
            "\(daemon.output.text)")
        let theirs = try expectFailure(
            vaultctl(as: TestUsers.a, socket, ["token", "demo", user]), saying: "ERR_ACCESS_DENIED")
        #expect(!theirs.stdout.contains(token))
    }

    @Test("Should read a user instance's own files, owned by the user")
    func userInstanceOwnFiles() throws {
        let setup = try Setup()
        let xdg = setup.directory.path("xdg")
        #expect(mkdir(xdg, 0o755) == 0 && chown(xdg, setup.uid, setup.gid) == 0)
        try expectSuccess(
            setup.asUser(
                "mkdir -m 700 \(xdg)/vaultd && printf '[Provider mine]\\nType=static\\n' > \(xdg)/vaultd/vaultd.conf"))
        let check = try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/setpriv"),
                [
                    "--reuid=\(setup.uid)", "--regid=\(setup.gid)", "--clear-groups", Binaries.vaultd.path,
                    "--check-config",
                ], environment: ["VAULTD_SYSTEM_CONFIG_DIR": setup.directory.url.path, "XDG_CONFIG_HOME": xdg]))
        #expect(check.stdout.contains("read: \(xdg)/vaultd/vaultd.conf"), "\(check.stdout)")
    }
}
