import Foundation
import Synchronization
import VaultCLI
import VaultSystem

/// What one in-process vaultctl run printed and returned.
struct CtlResult {
    var status: VaultCtl.ExitCode
    var stdout: String
    var stderr: String
}

/// Lines written through an `Output`, kept for the test to read.
private final class Capture: Sendable {
    let out = Mutex<[String]>([])
    let err = Mutex<[String]>([])

    func output(columns: Int) -> Output {
        Output(
            out: { line in self.out.withLock { $0.append(line) } },
            err: { line in self.err.withLock { $0.append(line) } }, columns: { columns })
    }
}

/// A socket path nothing listens on, so no test reaches a real vaultd.
let noSocket = "/nonexistent/vaultctl-tests/socket"

/// Runs vaultctl in this process with `arguments`, its output captured, as
/// on a terminal `columns` wide.
func ctl(_ arguments: [String], columns: Int = 80) -> CtlResult {
    let capture = Capture()
    var vaultctl = VaultCtl(output: capture.output(columns: columns))
    let status = vaultctl.run(arguments)
    return CtlResult(
        status: status,
        stdout: capture.out.withLock { $0.joined(separator: "\n") },
        stderr: capture.err.withLock { $0.joined(separator: "\n") })
}

/// Words that fill a command's positional arguments validly: every required
/// one and, with `optional`, the optional ones too.
func validArguments(_ spec: CommandSpec, optional: Bool = false) -> [String] {
    (spec.required + (optional ? spec.optional : [])).map { argument in
        switch argument.kind {
        case .provider: return "demo"
        case .user: return "alice"
        case .command: return "login"
        case .oneOf(let words): return words[0]
        default: return "x"
        }
    }
}

/// The first executable called `name` on PATH (or in /usr/bin, /bin).
func findProgram(_ name: String) -> String? {
    let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
    for directory in path.split(separator: ":").map(String.init) + ["/usr/bin", "/bin"] {
        let candidate = directory + "/" + name
        if FileManager.default.isExecutableFile(atPath: candidate) { return candidate }
    }
    return nil
}

/// The result of running a program to its end.
struct ProgramResult {
    var status: Int32
    var stdout: String
    var stderr: String
}

/// Runs `program` with `arguments` and the given extra environment; stdin is empty.
func runProgram(_ program: String, _ arguments: [String], environment: [String: String] = [:]) throws
    -> ProgramResult
{
    let process = Process()
    process.executableURL = URL(fileURLWithPath: program)
    process.arguments = arguments
    process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    try process.run()
    // The scripts' output is small: read both to the end, then reap.
    let outData = out.fileHandleForReading.readDataToEndOfFile()
    let errData = err.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    return ProgramResult(
        status: process.terminationStatus, stdout: String(decoding: outData, as: UTF8.self),
        stderr: String(decoding: errData, as: UTF8.self))
}

/// A temporary directory removed at the end of a test.
final class TemporaryDirectory {
    let url: URL

    init() throws {
        url = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent(
            "vaultctl-test-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    /// Writes `text` to `name` in the directory, executable when asked, and returns its path.
    @discardableResult
    /// Not through Foundation, whose writes open files without O_CLOEXEC: a
    /// child another test spawns meanwhile would hold the file open for
    /// writing, and running it would fail with ETXTBSY while that child lives.
    func write(_ name: String, _ text: String, executable: Bool = false) throws -> String {
        let path = url.appendingPathComponent(name).path
        let mode: mode_t = executable ? 0o755 : 0o644
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode)
        guard fd >= 0 else { throw SystemError("open \(path)") }
        defer { close(fd) }
        let bytes = Array(text.utf8)
        var written = 0
        while written < bytes.count {
            let n = bytes[written...].withUnsafeBytes { Glibc.write(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { throw SystemError("write \(path)") }
            written += n
        }
        guard fchmod(fd, mode) == 0 else { throw SystemError("chmod \(path)") }
        return path
    }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// A Unix socket bound to `path` and listening with `backlog`, for the test
/// servers here; throws with the failing call's errno.
func listeningSocket(at path: String, backlog: Int32, flags: Int32 = 0) throws -> Int32 {
    let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | flags, 0)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    do {
        try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
            guard bind(fd, address, length) == 0 else { throw SystemError("bind") }
        }
    } catch {
        close(fd)
        throw POSIXError(POSIXErrorCode(rawValue: error.errno) ?? .EIO)
    }
    guard listen(fd, backlog) == 0 else {
        let failure = POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO)
        close(fd)
        throw failure
    }
    return fd
}
