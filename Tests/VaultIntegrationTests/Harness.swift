import Foundation
import Synchronization
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// Where the binaries under test are: `VAULTD_BIN_DIR` (set by scripts/test),
/// else the debug build of this checkout.
enum Binaries {
    static let directory: URL = {
        if let dir = ProcessInfo.processInfo.environment["VAULTD_BIN_DIR"] { return URL(fileURLWithPath: dir) }
        return packageRoot.appendingPathComponent(".build/debug")
    }()

    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    static var vaultd: URL { directory.appendingPathComponent("vaultd") }
    static var vaultctl: URL { directory.appendingPathComponent("vaultctl") }
}

/// Collects a pipe's output on a background reader and lets a test wait,
/// bounded in time, until some text shows up.
final class OutputCollector: @unchecked Sendable {
    private let lock = NSCondition()
    private var data = Data()
    private var closed = false

    init(_ pipe: Pipe) {
        let handle = pipe.fileHandleForReading
        Thread.detachNewThread { [self] in
            while true {
                let chunk = handle.availableData
                lock.lock()
                if chunk.isEmpty { closed = true } else { data.append(chunk) }
                lock.broadcast()
                lock.unlock()
                if chunk.isEmpty { return }
            }
        }
    }

    var text: String {
        lock.lock()
        defer { lock.unlock() }
        return String(decoding: data, as: UTF8.self)
    }

    /// Waits until the output contains `needle` or the stream ends; false on timeout or end.
    func wait(for needle: String, seconds: Double = 20) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        lock.lock()
        defer { lock.unlock() }
        while true {
            if String(decoding: data, as: UTF8.self).contains(needle) { return true }
            if closed { return false }
            if !lock.wait(until: deadline) { return false }
        }
    }

    /// Waits until the stream ends (the process closed it).
    func waitForEnd(seconds: Double = 20) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        lock.lock()
        defer { lock.unlock() }
        while !closed {
            if !lock.wait(until: deadline) { return false }
        }
        return true
    }
}

/// A temporary directory removed at the end of a test.
final class TemporaryDirectory {
    let url: URL

    init() throws {
        url = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "vaultd-test-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func path(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// A real vaultd process on a private socket, against the keyring of the
/// session bus in the environment (scripts/test starts a private one).
final class RunningDaemon {
    let process = Process()
    let socketPath: String
    let output: OutputCollector
    private let stdout: OutputCollector

    /// Starts vaultd and waits (bounded) for its `ready` line. `environment`
    /// adds to the test's environment; `unsetEnvironment` removes variables from it.
    /// `launcher` (a program and its arguments, e.g. strace) runs vaultd when given.
    /// `engine` is the store (the run's, `TestStore.engine`, unless a test
    /// is about one); on SQLite the database and key are the socket's own
    /// (`SQLiteFiles`), the key from `dataKey`.
    init(
        socketPath: String, configPath: String?, environment: [String: String] = [:], waitForReady: Bool = true,
        extraArguments: [String] = [], unsetEnvironment: [String] = [], launcher: [String] = [],
        engine: StoreEngine = TestStore.engine, dataKey: TestDataKey = .credential
    ) throws {
        self.socketPath = socketPath
        var arguments = ["--socket", socketPath, "--log-level", "debug"]
        if let configPath { arguments += ["--config", configPath] }
        if let program = launcher.first {
            process.executableURL = URL(fileURLWithPath: program)
            arguments = launcher.dropFirst() + [Binaries.vaultd.path] + arguments
        } else {
            process.executableURL = Binaries.vaultd
        }
        process.arguments = arguments + extraArguments
        var env = ProcessInfo.processInfo.environment
        let memory = extraArguments.contains("--memory-store")
        for (key, value) in try RunningDaemon.storeEnvironment(
            socketPath: socketPath, engine: memory ? nil : engine, dataKey: dataKey)
        {
            env[key] = value
        }
        for (key, value) in environment { env[key] = value }
        for key in unsetEnvironment { env[key] = nil }
        process.environment = env
        let errPipe = Pipe()
        let outPipe = Pipe()
        process.standardError = errPipe
        process.standardOutput = outPipe
        process.standardInput = FileHandle.nullDevice
        output = OutputCollector(errPipe)
        stdout = OutputCollector(outPipe)
        try process.run()
        if waitForReady {
            guard output.wait(for: "notice: ready") else {
                process.terminate()
                throw HarnessError("vaultd did not become ready:\n\(output.text)")
            }
        }
    }

    /// The variables that start vaultd on the store of the daemons on
    /// `socketPath`: suites run in parallel on one keyring, so each daemon
    /// keeps to its own store scope, the same for every start on one socket;
    /// on SQLite its own database and key (`SQLiteFiles`), made when missing.
    static func storeEnvironment(socketPath: String, engine: StoreEngine?, dataKey: TestDataKey = .credential)
        throws -> [String: String]
    {
        var env = ["VAULTD_STORE_SCOPE": RunningDaemon.scope(for: socketPath)]
        switch engine {
        case .sqlite?:
            for (key, value) in try SQLiteFiles(socketPath: socketPath).prepare(dataKey) { env[key] = value }
        case .secretService?: env["VAULTD_STORE"] = "secret-service"
        // The etcd suites pass their fleet's configuration and key themselves.
        case .etcd?: env["VAULTD_STORE"] = "etcd"
        case nil: break
        }
        return env
    }

    /// The store scope of the daemons started on `socketPath`.
    static func scope(for socketPath: String) -> String {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in socketPath.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return "test-" + String(hash, radix: 16)
    }

    /// Everything vaultd wrote, stdout and stderr.
    var allOutput: String { stdout.text + output.text }

    /// Sends SIGTERM and waits (bounded) for the exit; returns the exit status.
    @discardableResult
    func stop(signal: Int32 = SIGTERM) -> Int32 {
        if process.isRunning { kill(process.processIdentifier, signal) }
        return waitForExit()
    }

    /// Waits (bounded) for the process to exit on its own; returns its status.
    func waitForExit(seconds: Double = 20) -> Int32 {
        _ = output.waitForEnd(seconds: seconds)
        if let status = try? reap(process, seconds: seconds) { return status }
        kill(process.processIdentifier, SIGKILL)
        return (try? reap(process, seconds: seconds)) ?? -1
    }

    deinit { if process.isRunning { stop(signal: SIGKILL) } }
}

struct HarnessError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// The result of running a command to its end.
struct CommandResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs `executable` with `arguments` and `input` on stdin, bounded in time.
func runCommand(
    _ executable: URL, _ arguments: [String], input: String? = nil, environment: [String: String] = [:],
    seconds: Double = 30
) throws -> CommandResult {
    let process = Process()
    process.executableURL = executable
    process.arguments = arguments
    var env = ProcessInfo.processInfo.environment
    for (key, value) in environment { env[key] = value }
    process.environment = env
    let outPipe = Pipe()
    let errPipe = Pipe()
    let inPipe = Pipe()
    process.standardOutput = outPipe
    process.standardError = errPipe
    process.standardInput = inPipe
    let out = OutputCollector(outPipe)
    let err = OutputCollector(errPipe)
    try process.run()
    if let input { feed(inPipe.fileHandleForWriting, input) }
    try inPipe.fileHandleForWriting.close()
    // The child's exit, not the end of its output, ends the wait: a process
    // another suite starts meanwhile can inherit the pipes (Foundation lists
    // the descriptors to close before it spawns), and would hold them open
    // long after this child exited (one `--check-config` of the config fuzz
    // "did not finish in 30s" so, in CI, status unknown).
    let status: Int32
    do {
        status = try reap(process, seconds: seconds)
    } catch {
        process.terminate()
        throw HarnessError("\(executable.lastPathComponent) \(arguments) did not exit in \(seconds)s")
    }
    // What it wrote before it exited is in the pipes: read to their end, or
    // for a moment when another process holds them.
    _ = out.waitForEnd(seconds: 5)
    _ = err.waitForEnd(seconds: 5)
    return CommandResult(status: status, stdout: out.text, stderr: err.text)
}

/// Writes `text` to a child's standard input. The child may end before it
/// reads it (vaultctl refuses a bad argument before it reads a token from
/// stdin), and the write then fails with EPIPE: no failure of the harness,
/// as the child's status and output say what happened. (FileHandle's
/// non-throwing `write(_:)` traps on it: a whole process-test step was lost
/// so once, in `ProfileTests.badProfileFiles`.)
func feed(_ handle: FileHandle, _ text: String) {
    // EPIPE, not SIGPIPE: the test process ignored SIGPIPE only when a suite
    // had started a Daemon in process (`Daemon.run`), and died of it alone.
    signal(SIGPIPE, SIG_IGN)
    try? handle.write(contentsOf: Data(text.utf8))
}

/// Checks that `result` ended with status 0, saying `comment` and its
/// standard error when not; returns it.
@discardableResult
func expectSuccess(_ result: CommandResult, _ comment: String? = nil, sourceLocation: SourceLocation = #_sourceLocation)
    -> CommandResult
{
    #expect(result.status == 0, "\(comment.map { $0 + ": " } ?? "")\(result.stderr)", sourceLocation: sourceLocation)
    return result
}

/// `vaultd --config PATH --check-config` once `text` is written to `path`.
func checkConfigText(_ text: String, at path: String) throws -> CommandResult {
    try text.write(toFile: path, atomically: true, encoding: .utf8)
    return try runCommand(Binaries.vaultd, ["--config", path, "--check-config"])
}

/// Checks that `result` ended with status 1 and that its standard error
/// says each of `words`; returns it.
@discardableResult
func expectFailure(_ result: CommandResult, saying words: String..., sourceLocation: SourceLocation = #_sourceLocation)
    -> CommandResult
{
    #expect(result.status == 1, "\(result.stderr)", sourceLocation: sourceLocation)
    for word in words { #expect(result.stderr.contains(word), "\(result.stderr)", sourceLocation: sourceLocation) }
    return result
}

/// Runs vaultctl against `socket`.
func vaultctl(_ socket: String, _ arguments: [String], input: String? = nil) throws -> CommandResult {
    try runCommand(Binaries.vaultctl, ["--socket", socket] + arguments, input: input)
}

/// `secret-tool search --all` for vaultd's items of one account: the raw output.
func secretToolSearch(provider: String, user: String) throws -> String {
    let result = try runCommand(
        URL(fileURLWithPath: "/usr/bin/secret-tool"),
        ["search", "--all", "xdg:schema", "io.vaultd.Session", "provider", provider, "user", user])
    return result.stdout + result.stderr
}

/// A test's own daemon with a config holding the given static providers.
final class DaemonFixture {
    let directory: TemporaryDirectory
    let socketPath: String
    let configPath: String
    var daemon: RunningDaemon?
    /// The store engine of this fixture's daemons.
    let engine: StoreEngine
    /// Where their data key comes from, on SQLite.
    let dataKey: TestDataKey

    init(
        providers: [String] = ["demo"], start: Bool = true, engine: StoreEngine = TestStore.engine,
        dataKey: TestDataKey = .credential
    ) throws {
        self.engine = engine
        self.dataKey = dataKey
        directory = try TemporaryDirectory()
        socketPath = directory.path("vaultd.sock")
        configPath = directory.path("vaultd.conf")
        let text = providers.map { "[Provider \($0)]\nType=static\n" }.joined(separator: "\n")
        try text.write(toFile: configPath, atomically: true, encoding: .utf8)
        if start { try self.start() }
    }

    /// A fixture (started only when `start`) whose one provider, `oauth`,
    /// refreshes at `server` (and revokes there, with `revocation`), whose
    /// clients may refresh as often as they ask (`MinRefreshInterval=0`),
    /// with `extra` configuration after the provider's section.
    convenience init(
        oauthServer server: TokenServer, revocation: Bool = false, extra: String = "", start: Bool = false,
        engine: StoreEngine = TestStore.engine, dataKey: TestDataKey = .credential
    ) throws {
        try self.init(
            config: "[Vault]\nMinRefreshInterval=0\n\n" + server.providerSection(revocation: revocation) + extra,
            start: start, engine: engine, dataKey: dataKey)
    }

    /// A fixture whose configuration is `config`, started unless `start` is false.
    convenience init(
        config: String, start: Bool = true, engine: StoreEngine = TestStore.engine, dataKey: TestDataKey = .credential
    ) throws {
        try self.init(start: false, engine: engine, dataKey: dataKey)
        try configure(config)
        if start { try self.start() }
    }

    /// Writes `text` as this fixture's configuration, for its next start or reload.
    func configure(_ text: String) throws { try text.write(toFile: configPath, atomically: true, encoding: .utf8) }

    @discardableResult
    func start() throws -> RunningDaemon {
        let d = try RunningDaemon(socketPath: socketPath, configPath: configPath, engine: engine, dataKey: dataKey)
        daemon = d
        return d
    }

    func client() throws -> VarlinkClient { try VarlinkClient(path: socketPath, timeoutSeconds: 60) }

    /// The token `vaultctl token PROVIDER USER` prints, without its newline.
    func token(_ provider: String, _ user: String) throws -> String {
        try vaultctl(socketPath, ["token", provider, user]).stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Waits (bounded) until `vaultctl token PROVIDER USER` succeeds, as for
    /// a session vaultd logs in by itself; checks that it did, and returns the token.
    func awaitToken(
        _ provider: String, _ user: String, tries: Int = 200, interval: Duration = .milliseconds(20),
        sourceLocation: SourceLocation = #_sourceLocation
    ) async throws -> String {
        let result = try await eventually(
            tries: tries, interval: interval, { try vaultctl(socketPath, ["token", provider, user]) },
            until: { $0.status == 0 })
        #expect(result.status == 0, "\(result.stderr)", sourceLocation: sourceLocation)
        return result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// The store scope of this fixture's daemons.
    var scope: String { RunningDaemon.scope(for: socketPath) }

    /// A reader of what this fixture's store holds.
    var store: StoreReader { StoreReader(self) }

    /// The variables that start vaultd on this fixture's store (for
    /// launchers that pass only what they are given, like systemd-socket-activate).
    func storeEnvironment() throws -> [String: String] {
        try RunningDaemon.storeEnvironment(socketPath: socketPath, engine: engine, dataKey: dataKey)
    }

    deinit { daemon?.stop() }
}

/// Writes `text` to `path` as an executable (0755). Not through
/// Foundation, whose writes open files without O_CLOEXEC: a child another
/// test spawns meanwhile would keep the file open for writing for as long
/// as it lives, and every exec of it would fail with ETXTBSY.
func writeExecutable(_ text: String, to path: String) throws {
    let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o755)
    guard fd >= 0 else { throw HarnessError("cannot create \(path): errno \(errno)") }
    defer { close(fd) }
    let bytes = Array(text.utf8)
    var written = 0
    while written < bytes.count {
        let n = bytes[written...].withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
        if n < 0, errno == EINTR { continue }
        guard n > 0 else { throw HarnessError("cannot write \(path): errno \(errno)") }
        written += n
    }
    guard fchmod(fd, 0o755) == 0 else { throw HarnessError("cannot chmod \(path): errno \(errno)") }
}

/// A unique name per test run, so tests never see each other's sessions.
func uniqueName(_ prefix: String) -> String { "\(prefix)-\(UUID().uuidString.prefix(8).lowercased())" }

/// Waits, bounded, for a child to exit and returns its exit status (128+N for
/// signal N). Foundation's own reaping has been seen to leave a child a zombie
/// while a socket-activated or daemonizing child runs beside it, so a child
/// Foundation has not reaped yet is reaped here with waitpid.
func reap(_ process: Process, seconds: Double = 20) throws -> Int32 {
    let deadline = Date().addingTimeInterval(seconds)
    let pid = process.processIdentifier
    while Date() < deadline {
        if !process.isRunning { return process.terminationStatus }
        var status: Int32 = 0
        let result = waitpid(pid, &status, WNOHANG)
        if result == pid {
            let signal = status & 0x7f
            return signal == 0 ? (status >> 8) & 0xff : 128 + signal
        }
        if result < 0 && errno == ECHILD {
            // Foundation reaped it between our two looks.
            if !process.isRunning { return process.terminationStatus }
        }
        usleep(2_000)
    }
    throw HarnessError("process \(pid) did not exit within \(seconds)s")
}

/// A test server written in Python (Tests/servers/), started on a free
/// loopback port; it prints `LISTENING http://127.0.0.1:PORT` when it serves.
final class PythonServer {
    let process = Process()
    let url: String
    private let output: OutputCollector

    /// `python`: the interpreter, Debian's python3 unless a server needs a
    /// venv of its own (`AuthlibServer`).
    init(_ script: String, _ arguments: [String], python: String = "/usr/bin/python3") throws {
        let path = Binaries.packageRoot.appendingPathComponent("Tests/servers/\(script)").path
        // Debian's python3 (scripts/deps test), as the other tests' scripts: a
        // `python3` on PATH may be a version manager's shim (pyenv's took 0.9 s
        // and a chain of shells per start, the interpreter 0.05 s).
        process.executableURL = URL(fileURLWithPath: python)
        process.arguments = [path, "--port", "0"] + arguments
        let out = Pipe()
        let err = Pipe()
        process.standardOutput = out
        process.standardError = err
        output = OutputCollector(out)
        let errors = OutputCollector(err)
        try process.run()
        guard output.wait(for: "LISTENING http://127.0.0.1:", seconds: 20),
            let line = output.text.split(separator: "\n").first(where: { $0.hasPrefix("LISTENING ") })
        else {
            throw HarnessError(
                "\(script) did not start in 20 s (running: \(process.isRunning)): \(output.text) \(errors.text)")
        }
        url = String(line.dropFirst("LISTENING ".count))
    }

    deinit {
        kill(process.processIdentifier, SIGKILL)
        _ = try? reap(process)
    }
}

/// A session of `provider USER` owned by this process's uid, as a store
/// holds it: created at 1 s, with `tokens`, expiring at `expiresAt`.
func storedSession(_ provider: String, _ user: String, tokens: TokenSet, expiresAt: UnixTime? = nil) -> SessionRecord {
    SessionRecord(
        account: Account(provider: provider, user: user), user: UserProfile(uid: user), tokens: tokens,
        createdAt: UnixTime(seconds: 1), expiresAt: expiresAt, ownerUID: getuid())
}

/// Writes `record` straight into the keyring with secret-tool, as vaultd would
/// have, in the store scope `scope`: for tests of what vaultd finds at start-up.
func storeRecordWithSecretTool(_ record: SessionRecord, scope: String) throws -> CommandResult {
    try runCommand(
        URL(fileURLWithPath: "/usr/bin/secret-tool"),
        [
            "store", "--label=\(record.storeLabel)", "xdg:schema", "io.vaultd.Session", "provider",
            record.account.provider, "user", record.account.user, "owner_uid", String(record.ownerUID), "scope", scope,
        ], input: record.storedJSON().text)
}

/// Asks `probe` until `done` holds for its answer, at most `tries` times,
/// `interval` apart, and returns the last answer: for waiting on another
/// process (a token server's counters, the keyring) without a fixed sleep.
func eventually<T>(
    tries: Int = 200, interval: Duration = .milliseconds(20), _ probe: () async throws -> T,
    until done: (T) -> Bool
) async throws -> T {
    var answer = try await probe()
    for _ in 1..<max(1, tries) where !done(answer) {
        try await Task.sleep(for: interval)
        answer = try await probe()
    }
    return answer
}

/// The reliability suites' two sizes: the short form runs in every
/// `scripts/test`, the long form under `scripts/test --soak` (`VAULTD_SOAK=1`).
enum Soak {
    /// True when the long forms were asked for.
    static let enabled = ProcessInfo.processInfo.environment["VAULTD_SOAK"] == "1"

    /// `short` in an ordinary run, `long` under `--soak`.
    static func size<T>(short: T, long: T) -> T { enabled ? long : short }
}

/// Whether a Secret Service answers on the session bus. The suites that store
/// sessions in it are skipped, with the reason shown, when none does (a plain
/// `swift test`); `scripts/test` starts a private gnome-keyring for them.
enum Keyring {
    static let reachable: Bool = {
        // scripts/test sets this: there a missing keyring is a failure, not a skip.
        if ProcessInfo.processInfo.environment["VAULTD_REQUIRE_KEYRING"] == "1" { return true }
        guard ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] != nil else { return false }
        let answer = try? runCommand(
            URL(fileURLWithPath: "/usr/bin/dbus-send"),
            [
                "--session", "--print-reply", "--reply-timeout=5000", "--dest=org.freedesktop.DBus",
                "/org/freedesktop/DBus", "org.freedesktop.DBus.NameHasOwner", "string:org.freedesktop.secrets",
            ], seconds: 10)
        return answer?.status == 0 && answer?.stdout.contains("boolean true") == true
    }()

    static let skipReason: Comment =
        "no Secret Service (gnome-keyring) on the session bus: run scripts/test, which starts a private one"
}

extension Trait where Self == ConditionTrait {
    /// Runs the suite only where a Secret Service answers; otherwise it is
    /// skipped with a message saying how to run it.
    static var requiresKeyring: Self { .enabled(if: Keyring.reachable, Keyring.skipReason) }
}

/// A subscription to the events of `provider USER` on `socket`, every read
/// bounded by `timeoutSeconds`; `snapshot` is its first reply.
func subscription(_ socket: String, provider: String, user: String, timeoutSeconds: Int = 10) throws -> (
    watcher: VarlinkClient, snapshot: VarlinkReply?
) {
    let watcher = try VarlinkClient(path: socket, timeoutSeconds: timeoutSeconds)
    try watcher.send(
        VarlinkCall(
            method: VaultMethod.subscribe.rawValue,
            parameters: ["provider": .string(provider), "user": .string(user)], more: true))
    return (watcher, try watcher.nextReply())
}
