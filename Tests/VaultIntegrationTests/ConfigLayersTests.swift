import Foundation
import Glibc
import Testing

/// The configuration layers of a user instance, with the real vaultd run as
/// a real second uid (setpriv): the system directory (moved by
/// VAULTD_SYSTEM_CONFIG_DIR, so nothing is written to /etc) first, then the
/// user's $XDG_CONFIG_HOME/vaultd/vaultd.conf. vaultd keeps its sessions in
/// memory here (--memory-store): the other uid cannot reach the test's
/// private keyring bus, and what is tested is which files are read.
@Suite(
    "Configuration layers of a user instance", .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "running vaultd as another uid needs root"))
struct ConfigLayersTests {
    /// A system directory declaring provider `alpha` with SingleAccount=no,
    /// and a user file that turns it to yes and adds provider `beta`.
    final class Layers {
        let directory: TemporaryDirectory
        let systemFile: String
        let userFile: String
        let socketPath: String
        let environment: [String: String]
        let uid: uid_t
        let gid: gid_t

        init() throws {
            try TestUsers.ensure()
            guard let uid = TestUsers.uid(TestUsers.a), let gid = TestUsers.gid(TestUsers.a) else {
                throw HarnessError("no user \(TestUsers.a)")
            }
            self.uid = uid
            self.gid = gid
            directory = try TemporaryDirectory()
            chmod(directory.url.path, 0o755)
            let systemDirectory = directory.path("etc")
            let userDirectory = directory.path("xdg/vaultd")
            try FileManager.default.createDirectory(atPath: systemDirectory, withIntermediateDirectories: true)
            try FileManager.default.createDirectory(atPath: userDirectory, withIntermediateDirectories: true)
            systemFile = systemDirectory + "/vaultd.conf"
            userFile = userDirectory + "/vaultd.conf"
            try "[Provider alpha]\nType=static\nSingleAccount=no\n".write(
                toFile: systemFile, atomically: true, encoding: .utf8)
            try "[Provider alpha]\nSingleAccount=yes\n\n[Provider beta]\nType=static\n".write(
                toFile: userFile, atomically: true, encoding: .utf8)
            for path in [directory.path("etc"), directory.path("xdg"), userDirectory] { chmod(path, 0o755) }
            for path in [systemFile, userFile] { chmod(path, 0o644) }
            let run = directory.path("run")
            mkdir(run, 0o700)
            chown(run, uid, gid)
            socketPath = run + "/vaultd.sock"
            environment = [
                "VAULTD_SYSTEM_CONFIG_DIR": systemDirectory, "XDG_CONFIG_HOME": directory.path("xdg"),
                "HOME": directory.path("home"),
            ]
        }

        /// setpriv's arguments that run a program as the test user.
        var asUser: [String] { ["--reuid=\(uid)", "--regid=\(gid)", "--clear-groups"] }
    }

    @Test("Should list /etc's file, then the user's, in --check-config; root reads /etc only")
    func checkConfigListsFiles() throws {
        let layers = try Layers()
        let check = try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/setpriv"), layers.asUser + [Binaries.vaultd.path, "--check-config"],
                environment: layers.environment))
        let userLines: [String] = [
            "read: \(layers.systemFile)", "read: \(layers.userFile)", "store: secret-service (scope default)",
            "configuration is valid: 2 provider(s)",
        ]
        #expect(check.stdout.split(separator: "\n").map(String.init) == userLines, "\(check.stdout)")

        let asRoot = try expectSuccess(runCommand(Binaries.vaultd, ["--check-config"], environment: layers.environment))
        let rootLines: [String] = [
            "read: \(layers.systemFile)", "store: secret-service (scope default)",
            "configuration is valid: 1 provider(s)",
        ]
        #expect(asRoot.stdout.split(separator: "\n").map(String.init) == rootLines, "\(asRoot.stdout)")
    }

    @Test("Should apply the user's override and provider, and name both files when a provider is missing")
    func userOverridesAndUnknownProvider() throws {
        let layers = try Layers()
        let daemon = try RunningDaemon(
            socketPath: layers.socketPath, configPath: nil, environment: layers.environment,
            extraArguments: ["--memory-store"], launcher: ["/usr/bin/setpriv"] + layers.asUser)
        defer { daemon.stop() }
        #expect(
            daemon.output.text.contains("config=\(layers.systemFile),\(layers.userFile)"),
            "the ready line names the files read: \(daemon.output.text)")

        let token = "tok_layers_8h3j5k7l9m1n2b4v6c"
        let first = uniqueName("first")
        let second = uniqueName("second")
        func ctl(_ arguments: [String], input: String? = nil) throws -> CommandResult {
            try vaultctl(as: TestUsers.a, layers.socketPath, arguments, input: input)
        }
        // SingleAccount=yes from the user's file: the second login switches accounts.
        #expect(try ctl(["login", "alpha", first], input: token).status == 0)
        try expectSuccess(ctl(["login", "alpha", second], input: token))
        let gone = try ctl(["status", "alpha", first])
        #expect(gone.stderr.contains("ERR_NOT_LOGGED_IN"), "the user's SingleAccount=yes is in force: \(gone)")
        // The provider only the user's file declares.
        try expectSuccess(ctl(["login", "beta", first], input: token))

        let unknown = try expectFailure(ctl(["login", "gamma", first], input: token))
        #expect(
            unknown.stderr.contains(
                "provider 'gamma' is not configured; add a [Provider gamma] section to one of: \(layers.systemFile), \(layers.userFile)"
            ), "\(unknown.stderr)")
    }

    @Test("Should warn, naming the files looked for, when no file is found and the built-in one is used")
    func builtInWarning() throws {
        let layers = try Layers()
        try FileManager.default.removeItem(atPath: layers.systemFile)
        try FileManager.default.removeItem(atPath: layers.userFile)
        let check = try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/setpriv"), layers.asUser + [Binaries.vaultd.path, "--check-config"],
                environment: layers.environment))
        #expect(check.stdout.hasPrefix("read: (built-in)\n"), "\(check.stdout)")
        #expect(
            check.stderr.contains("warning: no configuration file found")
                && check.stderr.contains("lookedFor=\(layers.systemFile),\(layers.userFile)"), "\(check.stderr)")
    }
}
