import Foundation
import Testing

/// A D-Bus session bus and a gnome-keyring of one test's own, at a fixed
/// address under a temporary directory, each a child process that the test
/// can SIGKILL and start again on its own: the bus at the same address, the
/// keyring with the same files (and password), as a user's would come back.
///
/// The bus runs with a configuration of its own that activates no services:
/// the standard session configuration would start a gnome-keyring (with the
/// user's files) the moment vaultd asked for the Secret Service while the
/// test's is down. The keyring runs in the foreground (`--foreground`), so
/// its pid is the daemon's own.
final class PrivateKeyring: @unchecked Sendable {
    let directory: TemporaryDirectory
    /// The bus address, the same across restarts.
    let address: String
    private let password: String
    private(set) var bus: Process?
    private(set) var keyring: Process?

    /// Starts the bus and an unlocked keyring.
    init() throws {
        directory = try TemporaryDirectory()
        for name in ["data", "runtime"] {
            try FileManager.default.createDirectory(
                atPath: directory.path(name), withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700])
        }
        address = "unix:path=\(directory.path("runtime/bus"))"
        password = "pw-" + UUID().uuidString.prefix(12)
        let config = """
            <!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
             "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
            <busconfig>
              <type>session</type>
              <listen>\(address)</listen>
              <auth>EXTERNAL</auth>
              <policy context="default">
                <allow send_destination="*" eavesdrop="true"/>
                <allow eavesdrop="true"/>
                <allow own="*"/>
              </policy>
            </busconfig>
            """
        try config.write(toFile: directory.path("bus.conf"), atomically: true, encoding: .utf8)
        try startBus()
        try startKeyring()
    }

    /// The environment a vaultd on this keyring runs with.
    var environment: [String: String] { ["DBUS_SESSION_BUS_ADDRESS": address] }

    /// Starts the bus (again) at `address`; waits (bounded) until it answers.
    func startBus() throws {
        let path = directory.path("runtime/bus")
        unlink(path)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/dbus-daemon")
        process.arguments = ["--config-file=\(directory.path("bus.conf"))", "--nofork", "--nopidfile"]
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        bus = process
        let up = try waitUntil {
            self.answers("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.GetId")
        }
        guard up else { throw HarnessError("the private bus did not answer on \(address)") }
    }

    /// Starts gnome-keyring (again) on the bus with the same files, unlocked
    /// with the same password; waits (bounded) until it owns the Secret Service.
    func startKeyring() throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/gnome-keyring-daemon")
        process.arguments = ["--foreground", "--unlock", "--components=secrets"]
        var env = ProcessInfo.processInfo.environment
        env["DBUS_SESSION_BUS_ADDRESS"] = address
        env["XDG_DATA_HOME"] = directory.path("data")
        env["XDG_RUNTIME_DIR"] = directory.path("runtime")
        process.environment = env
        let input = Pipe()
        process.standardInput = input
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        // The password on stdin, never on the command line.
        feed(input.fileHandleForWriting, password)
        try input.fileHandleForWriting.close()
        keyring = process
        let up = try waitUntil { self.secretsOwned() }
        guard up else { throw HarnessError("gnome-keyring did not take org.freedesktop.secrets on \(address)") }
    }

    /// SIGKILLs the keyring and waits for it to be gone from the bus (when the bus is up).
    func killKeyring() throws {
        guard let process = keyring else { return }
        kill(process.processIdentifier, SIGKILL)
        _ = try reap(process)
        keyring = nil
        if bus != nil { _ = try waitUntil { !self.secretsOwned() } }
    }

    /// SIGKILLs the bus. The keyring, which exits when its bus goes away, is
    /// killed too when `keyringToo` (it is started again after the bus).
    func killBus(keyringToo: Bool = true) throws {
        guard let process = bus else { return }
        kill(process.processIdentifier, SIGKILL)
        _ = try reap(process)
        bus = nil
        if keyringToo { try killKeyring() }
    }

    /// True when the Secret Service answers on the bus.
    func secretsOwned() -> Bool {
        answers("org.freedesktop.secrets", "/org/freedesktop/secrets", "org.freedesktop.DBus.Peer.Ping")
    }

    /// Locks the default collection through the Secret Service's own `Lock` (no prompt needed).
    func lockDefaultCollection() throws {
        let alias = try runCommand(
            URL(fileURLWithPath: "/usr/bin/dbus-send"),
            [
                "--bus=\(address)", "--print-reply", "--dest=org.freedesktop.secrets",
                "/org/freedesktop/secrets", "org.freedesktop.Secret.Service.ReadAlias", "string:default",
            ], seconds: 10)
        guard let path = alias.stdout.split(separator: "\"").dropFirst().first.map(String.init),
            path.hasPrefix("/org/freedesktop/secrets/collection/")
        else { throw HarnessError("no default collection: \(alias.stdout) \(alias.stderr)") }
        let locked = try runCommand(
            URL(fileURLWithPath: "/usr/bin/dbus-send"),
            [
                "--bus=\(address)", "--print-reply", "--dest=org.freedesktop.secrets",
                "/org/freedesktop/secrets", "org.freedesktop.Secret.Service.Lock", "array:objpath:\(path)",
            ], seconds: 10)
        guard locked.status == 0, locked.stdout.contains(path) else {
            throw HarnessError("locking \(path) failed: \(locked.stdout) \(locked.stderr)")
        }
    }

    /// True when `destination` answers a method call on the bus (dbus-send's
    /// exit status; no service is ever activated on this bus).
    private func answers(_ destination: String, _ path: String, _ method: String) -> Bool {
        PrivateKeyring.exitStatus([
            "/usr/bin/dbus-send", "--bus=\(address)", "--print-reply", "--reply-timeout=2000",
            "--dest=\(destination)", path, method,
        ]) == 0
    }

    /// Runs a program with nothing on stdin, stdout or stderr and returns its
    /// exit status (nil when it did not start, or ran past 10 s and was
    /// killed). posix_spawn and waitpid, not Foundation's Process: the soak
    /// form polls thousands of times, and a test process that started that
    /// many Processes (a pipe, a reader thread each) was seen to crash in
    /// Process.run().
    static func exitStatus(_ arguments: [String]) -> Int32? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        let argv = arguments.map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid: pid_t = 0
        guard posix_spawn(&pid, arguments[0], &actions, nil, argv, environ) == 0 else { return nil }
        var status: Int32 = 0
        for _ in 0..<1000 {
            let result = waitpid(pid, &status, WNOHANG)
            if result == pid { return (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f) }
            if result < 0 { return nil }
            usleep(10_000)
        }
        kill(pid, SIGKILL)
        _ = waitpid(pid, &status, 0)
        return nil
    }

    /// Polls `done` every 50 ms for at most 10 s.
    private func waitUntil(_ done: () -> Bool) throws -> Bool {
        for _ in 0..<200 {
            if done() { return true }
            usleep(50_000)
        }
        return done()
    }

    deinit {
        for process in [keyring, bus].compactMap({ $0 }) where process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            _ = try? reap(process)
        }
    }
}
