import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultProtocol
import VaultSystem

/// vaultd never hangs at start-up or reload on a configuration "file" that is
/// not one, and stops promptly on SIGTERM or SIGINT while it is still starting.
@Suite("vaultd start-up robustness", .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct StartupRobustnessTests {
    /// Runs `vaultd --check-config --config path`, bounded: a hang is killed
    /// and shows as a status other than 1.
    func checkConfig(_ path: String, _ dir: TemporaryDirectory) throws -> (status: Int32, output: String) {
        let daemon = try RunningDaemon(
            socketPath: dir.path("s"), configPath: path, waitForReady: false, extraArguments: ["--check-config"])
        let status = daemon.waitForExit(seconds: 10)
        return (status, daemon.output.text)
    }

    @Test("Should refuse a FIFO, a device or a directory as the configuration, naming it, at once")
    func configThatIsNoRegularFile() throws {
        let dir = try TemporaryDirectory()
        let fifo = dir.path("fifo.conf")
        #expect(mkfifo(fifo, 0o600) == 0)
        let directory = dir.path("dir.conf")
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        // /dev/null (0666) is refused first as a file anyone may write (see ConfigTrustTests).
        for (path, problem) in [
            (fifo, "is a FIFO, not a regular file"), ("/dev/null", "is writable by others (mode 666)"),
            (directory, "is a directory, not a regular file"),
        ] {
            let (status, output) = try checkConfig(path, dir)
            #expect(status == 1, "\(path): \(output)")
            #expect(output.contains("\(path) \(problem)"), "\(output)")
            #expect(output.contains("ERR_INVALID_CONFIG"), "\(output)")
        }
    }

    @Test("Should refuse a drop-in that is a FIFO, naming it")
    func dropInFIFO() throws {
        let dir = try TemporaryDirectory()
        let config = dir.path("vaultd.conf")
        try "[Provider demo]\nType=static\n".write(toFile: config, atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: config + ".d", withIntermediateDirectories: false)
        let fifo = config + ".d/10-late.conf"
        #expect(mkfifo(fifo, 0o600) == 0)
        let (status, output) = try checkConfig(config, dir)
        #expect(status == 1, "\(output)")
        #expect(output.contains("\(fifo) is a FIFO, not a regular file"), "\(output)")
    }

    @Test("Should refuse a reload whose drop-in became a FIFO and keep serving")
    func reloadWithFIFO() throws {
        let dir = try TemporaryDirectory()
        let config = dir.path("vaultd.conf")
        try "[Provider demo]\nType=static\n".write(toFile: config, atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: config + ".d", withIntermediateDirectories: false)
        let daemon = try RunningDaemon(
            socketPath: dir.path("s"), configPath: config, extraArguments: ["--memory-store"])
        let fifo = config + ".d/10-late.conf"
        #expect(mkfifo(fifo, 0o600) == 0)
        kill(daemon.process.processIdentifier, SIGHUP)
        #expect(daemon.output.wait(for: "reload refused", seconds: 10), "\(daemon.output.text)")
        #expect(daemon.output.text.contains("\(fifo) is a FIFO, not a regular file"), "\(daemon.output.text)")
        #expect(
            try VarlinkClient(path: dir.path("s"), timeoutSeconds: 60).call(ServiceMethod.getInfo.rawValue).error == nil
        )
        #expect(daemon.stop() == 0)
    }

    @Test("Should name file and line of a file that is no configuration, never quoting its text")
    func foreignFileIsNotQuoted() throws {
        let dir = try TemporaryDirectory()
        let secret = "root:$y$j9T$Sup3rS3cretHashMarker$Qx:19000:0:99999:7:::"
        let shadowLike = dir.path("shadow")
        try "\(secret)\ndaemon:*:19000:0:99999:7:::\n".write(toFile: shadowLike, atomically: true, encoding: .utf8)
        let (status, output) = try checkConfig(shadowLike, dir)
        #expect(status == 1, "\(output)")
        #expect(output.contains("\(shadowLike):1: expected a Key=value line"), "\(output)")
        #expect(!output.contains("Sup3rS3cret"), "\(output)")
        let daemon = try RunningDaemon(
            socketPath: dir.path("s"), configPath: shadowLike, waitForReady: false, extraArguments: ["--memory-store"])
        #expect(daemon.waitForExit(seconds: 10) == 1)
        #expect(daemon.output.text.contains("\(shadowLike):1: "), "\(daemon.output.text)")
        #expect(!daemon.allOutput.contains("Sup3rS3cret"), "\(daemon.allOutput)")
    }

    /// A "session bus" that takes connections and never answers, so vaultd's
    /// start-up blocks in the secret store; prints ACCEPTED per connection.
    final class SilentBus {
        let process = Process()
        let output: OutputCollector
        let path: String

        init(_ dir: TemporaryDirectory) throws {
            path = dir.path("bus")
            let script = dir.path("bus.py")
            try #"""
            import socket, sys
            s = socket.socket(socket.AF_UNIX)
            s.bind(sys.argv[1])
            s.listen(8)
            s.settimeout(60)
            print("LISTENING", flush=True)
            held = []
            while True:
                conn, _ = s.accept()
                held.append(conn)
                print("ACCEPTED", flush=True)
            """#.write(toFile: script, atomically: true, encoding: .utf8)
            process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
            process.arguments = [script, path]
            let out = Pipe()
            process.standardOutput = out
            process.standardError = FileHandle.nullDevice
            output = OutputCollector(out)
            try process.run()
            guard output.wait(for: "LISTENING") else { throw HarnessError("the silent bus did not start") }
        }

        deinit {
            kill(process.processIdentifier, SIGKILL)
            _ = try? reap(process)
        }
    }

    @Test("Should stop at once, with a log line, on SIGTERM or SIGINT while start-up blocks")
    func signalDuringStartup() throws {
        for (signal, name) in [(SIGTERM, "SIGTERM"), (SIGINT, "SIGINT")] {
            let dir = try TemporaryDirectory()
            let bus = try SilentBus(dir)
            let daemon = try RunningDaemon(
                socketPath: dir.path("s"), configPath: nil,
                environment: ["DBUS_SESSION_BUS_ADDRESS": "unix:path=\(bus.path)"], waitForReady: false,
                dataKey: .secretService)
            #expect(bus.output.wait(for: "ACCEPTED"), "vaultd never reached the store: \(daemon.output.text)")
            kill(daemon.process.processIdentifier, signal)
            #expect(daemon.waitForExit(seconds: 10) == 0, "\(daemon.output.text)")
            #expect(
                daemon.output.text.contains("notice: stopped by \(name) during start-up, before serving"),
                "\(daemon.output.text)")
            #expect(!Files.exists(dir.path("s")))
        }
    }
}
