import Foundation
import Glibc
import Testing
import VaultCLI

/// A Unix socket that listens and never accepts: the kernel completes the
/// connect from its backlog, and nothing ever answers.
final class SilentListener {
    let path: String
    private let directory: String
    private let fd: Int32

    init() throws {
        directory = NSTemporaryDirectory() + "vaultctl-silent-" + UUID().uuidString.prefix(8)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        path = directory + "/socket"
        fd = try listeningSocket(at: path, backlog: 16, flags: Int32(SOCK_CLOEXEC.rawValue))
    }

    deinit {
        close(fd)
        try? FileManager.default.removeItem(atPath: directory)
    }
}

@Suite("vaultctl time limits", .timeLimit(.minutes(5)))
struct TimeoutTests {
    /// Should give up on a vaultd that accepts and never answers, after
    /// `--timeout`, with exit status 3 and a message saying it timed out.
    @Test func silentDaemon() throws {
        let silent = try SilentListener()
        let started = Date()
        let result = ctl(["--socket", silent.path, "--timeout", "1", "token", "demo", "alice"])
        let elapsed = Date().timeIntervalSince(started)
        #expect(result.status == .unreachable, "\(result)")
        #expect(result.stderr.contains("wait") || result.stderr.contains("time"), "\(result.stderr)")
        #expect(elapsed < 30, "took \(elapsed) s")
    }

    /// Should refuse a --timeout that is not a positive number of seconds.
    @Test(arguments: ["0", "-1", "soon", "86401"])
    func badTimeout(value: String) {
        let result = ctl(["--socket", noSocket, "--timeout", value, "token", "demo", "alice"])
        #expect(result.status == .usage)
        #expect(result.stderr.contains("--timeout"), "\(result.stderr)")
    }
}
