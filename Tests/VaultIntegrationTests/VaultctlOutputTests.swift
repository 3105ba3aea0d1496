import Foundation
import Glibc
import Testing

/// What vaultctl prints about a real vaultd: owners by name, and a sentence
/// with a code, never a Swift value, when vaultd goes away under it.
@Suite("vaultctl output", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct VaultctlOutputTests {
    /// This process's user name, from NSS (the test is linked dynamically).
    static var myName: String {
        guard let entry = getpwuid(getuid()) else { return String(getuid()) }
        return String(cString: entry.pointee.pw_name)
    }

    @Test(
        "Should wrap help at the width of the terminal it writes to, and at 80 columns into a pipe",
        .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/script"), "needs script(1) for a terminal"))
    func helpWidth() throws {
        // script(1) gives vaultctl a terminal; stty sets its width first.
        let wide = try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/usr/bin/script"),
                ["-qec", "stty cols 150; \(Binaries.vaultctl.path) help exec", "/dev/null"]))
        // The prose between the usage and the examples, which are not broken.
        let prose = wide.stdout.replacingOccurrences(of: "\r", with: "").components(separatedBy: "\n\n").dropFirst()
            .joined(separator: "\n\n").components(separatedBy: "\nExamples:\n")[0]
        let wideLines = prose.split(separator: "\n")
        // The description's first line fills the terminal's width.
        #expect((wideLines.first?.count ?? 0) > 120, "\(wide.stdout)")
        #expect(wideLines.allSatisfy { $0.count <= 150 }, "\(wide.stdout)")

        let piped = try vaultctl("/nonexistent/socket", ["help", "exec"])
        // Examples are command lines to copy: they are not broken.
        let pipedLines = piped.stdout.components(separatedBy: "\nExamples:\n")[0].split(separator: "\n")
        #expect(pipedLines.allSatisfy { $0.count <= 80 } && pipedLines.contains { $0.count > 72 }, "\(piped.stdout)")
    }

    @Test("Should show the owner's user name in list and status")
    func ownerByName() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let user = uniqueName("owner")
        #expect(try vaultctl(d.socketPath, ["login", "demo", user], input: EventsTests.token).status == 0)
        let list = try vaultctl(d.socketPath, ["list"])
        let row = list.stdout.split(separator: "\n").first { $0.contains(user) }
        #expect(row?.split(separator: " ").last.map(String.init) == Self.myName, "\(list.stdout)")
        let status = try vaultctl(d.socketPath, ["status", "demo", user])
        let owner = status.stdout.split(separator: "\n").first { $0.hasPrefix("Owner:") }
        #expect(owner?.split(separator: " ").last.map(String.init) == Self.myName, "\(status.stdout)")
    }

    @Test("Should say in a sentence with a code that vaultd stopped under exec and watch --no-reconnect")
    func vaultdStops() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let user = uniqueName("gone")
        #expect(try vaultctl(d.socketPath, ["login", "demo", user], input: EventsTests.token).status == 0)
        let (exec, execOut, execErr) = try startInterruptible(
            Binaries.vaultctl.path,
            ["--socket", d.socketPath, "exec", "demo", user, "--", "/bin/sh", "-c", "echo started; exec sleep 3600"])
        defer { if exec.isRunning { kill(exec.processIdentifier, SIGKILL) } }
        let (watch, watchOut, watchErr) = try startInterruptible(
            Binaries.vaultctl.path, ["--socket", d.socketPath, "watch", "--no-reconnect"])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(execOut.wait(for: "started"), "\(execErr.text)")
        #expect(watchOut.wait(for: "events follow"), "\(watchErr.text)")

        #expect(d.daemon.stop() == 0)
        // vaultd ends every stream with an error reply as it stops.
        #expect(watchErr.waitForEnd(seconds: 20))
        #expect(try reap(watch) == 1, "\(watchErr.text)")
        let sentence = #/^vaultctl: [a-z][^()]+ \(ERR_[A-Z_]+\)$/#
        #expect(
            watchErr.text.split(separator: "\n").contains { $0.wholeMatch(of: sentence) != nil }, "\(watchErr.text)")
        #expect(execErr.wait(for: "reconnecting"), "\(execErr.text)")
        let lost = #/^vaultctl: lost the connection to vaultd: [a-z][^()]+ \(ERR_[A-Z_]+\); reconnecting$/#
        #expect(execErr.text.split(separator: "\n").contains { $0.wholeMatch(of: lost) != nil }, "\(execErr.text)")
        #expect(!execErr.text.contains("error("), "\(execErr.text)")
        kill(exec.processIdentifier, SIGTERM)
        #expect(try reap(exec) == 128 + SIGTERM, "\(execErr.text)")
    }

    @Test("Should say that vaultd closed the connection, and exit 3, when vaultd dies under watch --no-reconnect")
    func vaultdDies() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let (watch, watchOut, watchErr) = try startInterruptible(
            Binaries.vaultctl.path, ["--socket", d.socketPath, "watch", "--no-reconnect"])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(watchOut.wait(for: "events follow"), "\(watchErr.text)")
        _ = d.daemon.stop(signal: SIGKILL)
        #expect(watchErr.waitForEnd(seconds: 20))
        #expect(try reap(watch) == 3, "\(watchErr.text)")
        #expect(watchErr.text.hasPrefix("vaultctl: vaultd closed the connection"), "\(watchErr.text)")
    }
}
