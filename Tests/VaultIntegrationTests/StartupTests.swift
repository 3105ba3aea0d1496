import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultProtocol
import VaultSystem

/// How vaultd starts, and how it refuses to. In the SQLite run the tests of
/// an unreachable or locked keyring take the database's key from the keyring,
/// so they check that the SQLite engine refuses to start without its key.
@Suite("vaultd start-up", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct StartupTests {
    @Test("Should refuse to start, in one line, when no Secret Service is reachable")
    func noSecretService() throws {
        let dir = try TemporaryDirectory()
        let daemon = try RunningDaemon(
            socketPath: dir.path("s"), configPath: nil,
            environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(dir.path("no-bus"))"], waitForReady: false,
            dataKey: .secretService)
        #expect(daemon.waitForExit() == 1)
        let lines = daemon.output.text.split(separator: "\n").filter { $0.contains("error:") }
        #expect(lines.count == 1, "\(daemon.output.text)")
        #expect(lines.first?.contains("no Secret Service reachable on the session bus unix:path=") == true)
        #expect(lines.first?.contains("ERR_SECRET_STORE_UNAVAILABLE") == true)
        #expect(!Files.exists(dir.path("s")), "no socket without a store")
    }

    @Test("Should refuse to start when the default collection is locked")
    func lockedCollection() throws {
        let dir = try TemporaryDirectory()
        let script = Binaries.packageRoot.appendingPathComponent("scripts/lib/keyring.sh").path
        // A keyring of its own, locked over D-Bus, so the shared one stays unlocked.
        // system() waits for the script alone; the daemons it forks hold no pipe of ours.
        let outputFile = dir.path("setup.out")
        let command = """
            VAULTD_KEYRING_PASSWORD=test-password bash -c 'set -e
            source "\(script)"
            keyring_start "\(dir.path("keyring"))" >/dev/null
            dbus-send --session --print-reply --dest=org.freedesktop.secrets /org/freedesktop/secrets \
              org.freedesktop.Secret.Service.Lock array:objpath:/org/freedesktop/secrets/aliases/default >/dev/null
            echo "$DBUS_SESSION_BUS_ADDRESS"
            echo "$VAULTD_KEYRING_BUS_PID"' >"\(outputFile)" 2>&1 </dev/null
            """
        let status = system(command)
        let setup = CommandResult(
            status: status, stdout: (try? String(contentsOfFile: outputFile, encoding: .utf8)) ?? "", stderr: "")
        #expect(setup.status == 0, "\(setup.stdout)")
        let lines = setup.stdout.split(separator: "\n").map(String.init)
        let bus = try #require(lines.first)
        // SIGKILL: the bus inherits this test runner's blocked SIGTERM.
        defer { if let pid = Int32(lines.last ?? "") { kill(pid, SIGKILL) } }
        let daemon = try RunningDaemon(
            socketPath: dir.path("s"), configPath: nil, environment: ["DBUS_SESSION_BUS_ADDRESS": bus],
            waitForReady: false, dataKey: .secretService)
        #expect(daemon.waitForExit() == 1)
        #expect(daemon.output.text.contains("is locked"), "\(daemon.output.text)")
        #expect(daemon.output.text.contains("ERR_SECRET_STORE_LOCKED"))
    }

    // On SQLite a second vaultd on the same store is refused earlier, at the
    // database's lock (StoreJobTests, MigrationTests), before it looks at the socket.
    @Test("Should replace a stale socket file and refuse to take a live daemon's socket", .secretServiceOnly)
    func staleAndLiveSockets() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path("vaultd.sock")
        // A socket file nobody listens on: bound, then closed.
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
            guard bind(fd, address, length) == 0 else { throw SystemError("bind") }
        }
        close(fd)
        #expect(Files.exists(path))
        let first = try RunningDaemon(socketPath: path, configPath: nil)
        #expect(try VarlinkClient(path: path, timeoutSeconds: 60).call(ServiceMethod.getInfo.rawValue).error == nil)

        let second = try RunningDaemon(socketPath: path, configPath: nil, waitForReady: false)
        #expect(second.waitForExit() == 1)
        #expect(second.output.text.contains("another vaultd is already listening on \(path)"))
        #expect(try VarlinkClient(path: path, timeoutSeconds: 60).call(ServiceMethod.getInfo.rawValue).error == nil)
        #expect(first.stop() == 0)
        #expect(!Files.exists(path), "the socket is removed at exit")
    }

    @Test("Should make the socket 0600 in a 0700 directory")
    func socketPermissions() throws {
        let dir = try TemporaryDirectory()
        let path = dir.path("run/vaultd/socket")
        try FileManager.default.createDirectory(atPath: dir.path("run"), withIntermediateDirectories: true)
        let daemon = try RunningDaemon(socketPath: path, configPath: nil)
        var st = stat()
        #expect(stat(path, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        #expect(stat(dir.path("run/vaultd"), &st) == 0)
        #expect(st.st_mode & 0o777 == 0o700)
        daemon.stop()
    }

    @Test("Should name file, line and key of a bad configuration and exit non-zero")
    func badConfig() throws {
        let dir = try TemporaryDirectory()
        let config = dir.path("bad.conf")
        try "[Provider demo]\nType=static\nColour=blue\n".write(toFile: config, atomically: true, encoding: .utf8)
        let daemon = try RunningDaemon(socketPath: dir.path("s"), configPath: config, waitForReady: false)
        #expect(daemon.waitForExit() == 1)
        #expect(daemon.output.text.contains("\(config):3: unknown key 'Colour'"), "\(daemon.output.text)")
        try expectFailure(runCommand(Binaries.vaultd, ["--check-config", "--config", config]))
        let shipped = Binaries.packageRoot.appendingPathComponent("config/vaultd.conf").path
        try expectSuccess(runCommand(Binaries.vaultd, ["--check-config", "--config", shipped]))
    }

    @Test("Should compute the same default socket in vaultd and vaultctl")
    func sameDefaultSocket() throws {
        let dir = try TemporaryDirectory()
        let runtime = dir.path("xdg")
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true)
        let process = Process()
        process.executableURL = Binaries.vaultd
        process.arguments = []
        var environment = ProcessInfo.processInfo.environment
        environment["XDG_RUNTIME_DIR"] = runtime
        environment["VAULTD_SOCKET"] = nil
        process.environment = environment
        let err = Pipe()
        process.standardError = err
        let collector = OutputCollector(err)
        try process.run()
        defer {
            kill(process.processIdentifier, SIGTERM)
            _ = try? reap(process)
        }
        #expect(collector.wait(for: "notice: ready"), "\(collector.text)")
        #expect(collector.text.contains("socket=\(runtime)/vaultd/socket"))
        // An empty VAULTD_SOCKET counts as unset.
        try expectSuccess(
            runCommand(Binaries.vaultctl, ["list"], environment: ["XDG_RUNTIME_DIR": runtime, "VAULTD_SOCKET": ""]))
    }

    @Test("Should exit 3 from vaultctl, naming the socket, when vaultd is not running")
    func vaultctlUnreachable() throws {
        let dir = try TemporaryDirectory()
        let result = try runCommand(Binaries.vaultctl, ["--socket", dir.path("none"), "status"])
        #expect(result.status == 3)
        #expect(result.stderr.contains("vaultd is not reachable at \(dir.path("none"))"))
        let usage = try runCommand(Binaries.vaultctl, ["login", "demo"])
        #expect(usage.status == 2)
        let help = try runCommand(Binaries.vaultctl, ["token", "--help"])
        #expect(help.status == 0)
        #expect(help.stdout.contains("Usage: vaultctl token PROVIDER USER"))
    }
}
