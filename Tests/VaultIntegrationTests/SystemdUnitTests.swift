import Foundation
import Testing
import VaultClient
import VaultCore
import VaultProtocol

/// The systemd units (systemd/), scripts/install, the system instance's data
/// key (a systemd credential) and its older private keyring
/// (scripts/vaultd-system-keyring, the drop-in systemd/system/system-keyring.conf).
@Suite(.serialized, .ownThreads, .timeLimit(.minutes(5)))
struct SystemdUnitTests {
    private static let analyze = URL(fileURLWithPath: "/usr/bin/systemd-analyze")
    private static let root = Binaries.packageRoot

    @Test("Should install everything under DESTDIR and pass systemd-analyze verify on all four units")
    func verifyUnits() throws {
        let dir = try TemporaryDirectory()
        let destdir = dir.path("root")
        try install(into: destdir)
        for path in [
            "usr/local/bin/vaultd", "usr/local/bin/vaultctl", "usr/local/libexec/vaultd/vaultd-system-keyring",
            "usr/local/libexec/vaultd/keyring.sh", "etc/vaultd/vaultd.conf", "usr/local/share/doc/vaultd/vaultd.txt",
            "usr/local/share/doc/vaultd/vaultctl.txt", "usr/local/share/doc/vaultd/system-keyring.conf",
        ] {
            #expect(FileManager.default.fileExists(atPath: "\(destdir)/\(path)"), "installed \(path)")
        }
        let help = try String(contentsOfFile: "\(destdir)/usr/local/share/doc/vaultd/vaultd.txt", encoding: .utf8)
        #expect(help.contains("--config"))

        // System units: the installed copies, unchanged, verified with
        // --root=DESTDIR, so their ExecStart= paths (/usr/local/...) must
        // exist in DESTDIR. The root also needs systemd's own units (the
        // targets they name) and /bin/kill (ExecReload=).
        let base = "\(destdir)/usr/lib/systemd"
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: "/usr/lib/systemd/system", toPath: "\(base)/system")
        try FileManager.default.createDirectory(atPath: "\(destdir)/usr/bin", withIntermediateDirectories: true)
        try FileManager.default.copyItem(atPath: "/usr/bin/kill", toPath: "\(destdir)/usr/bin/kill")
        try FileManager.default.createSymbolicLink(atPath: "\(destdir)/bin", withDestinationPath: "usr/bin")
        let systemUnits = ["vaultd.service", "vaultd.socket"].map { "\(destdir)/usr/local/lib/systemd/system/\($0)" }
        // --man=no: Documentation= names man pages, which the package installs
        // (scripts/test-package verifies the packaged units with them) and
        // scripts/install does not.
        let system = try runCommand(Self.analyze, ["verify", "--man=no", "--root=\(destdir)"] + systemUnits)
        #expect(system.status == 0, "system units: \(system.stderr)")
        #expect(system.stderr.isEmpty, "system units: \(system.stderr)")

        // The unit as systemd loads it (verify's debug dump): the SQLite
        // store, vaultd itself as the main process, the data key's assertion.
        let loaded = try Self.loadedSystemService(root: destdir, units: systemUnits)
        #expect(loaded.contains("Environment: VAULTD_STORE=sqlite"), "\(loaded)")
        #expect(loaded.contains("Command Line: /usr/local/bin/vaultd --config /etc/vaultd/vaultd.conf"), "\(loaded)")
        #expect(loaded.contains("AssertFileNotEmpty: /etc/vaultd/data-key.cred"), "\(loaded)")

        // The older keyring, as a drop-in from share/doc: verify stays clean,
        // and the drop-in switches the store, the main process and drops the
        // data key's assertion.
        let dropIns = "\(destdir)/etc/systemd/system/vaultd.service.d"
        try FileManager.default.createDirectory(atPath: dropIns, withIntermediateDirectories: true)
        try FileManager.default.copyItem(
            atPath: "\(destdir)/usr/local/share/doc/vaultd/system-keyring.conf",
            toPath: "\(dropIns)/system-keyring.conf")
        let keyring = try runCommand(Self.analyze, ["verify", "--man=no", "--root=\(destdir)"] + systemUnits)
        #expect(keyring.status == 0, "with the keyring drop-in: \(keyring.stderr)")
        #expect(keyring.stderr.isEmpty, "with the keyring drop-in: \(keyring.stderr)")
        let switched = try Self.loadedSystemService(root: destdir, units: systemUnits)
        #expect(switched.contains("DropIn Path: \(dropIns)/system-keyring.conf"), "\(switched)")
        #expect(switched.contains("Environment: VAULTD_STORE=secret-service"), "\(switched)")
        #expect(
            switched.contains(
                "Command Line: /usr/local/libexec/vaultd/vaultd-system-keyring /usr/local/bin/vaultd --config /etc/vaultd/vaultd.conf"
            ), "\(switched)")
        #expect(!switched.contains("AssertFileNotEmpty"), "\(switched)")

        // --root does check the ExecStart= paths inside the root: without the
        // wrapper the drop-in names, verification fails.
        try FileManager.default.removeItem(atPath: "\(destdir)/usr/local/libexec/vaultd/vaultd-system-keyring")
        let missing = try runCommand(Self.analyze, ["verify", "--man=no", "--root=\(destdir)"] + systemUnits)
        #expect(missing.status != 0)
        #expect(missing.stderr.contains("vaultd-system-keyring is not executable"), "\(missing.stderr)")

        // User units: systemd 252 has no --root for --user, so the installed
        // copies are verified in the user scope with only DESTDIR put in
        // front of /usr/local/ (ExecStart= names the installed vaultd).
        let userDir = dir.path("user")
        let runtime = dir.path("runtime")
        try FileManager.default.createDirectory(atPath: userDir, withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: runtime, withIntermediateDirectories: true)
        var userUnits: [String] = []
        for name in ["vaultd.service", "vaultd.socket"] {
            let text = try String(
                contentsOfFile: "\(destdir)/usr/local/lib/systemd/user/\(name)", encoding: .utf8)
            if name == "vaultd.service" { #expect(text.contains("\nExecStart=/usr/local/bin/vaultd\n")) }
            let path = "\(userDir)/\(name)"
            try text.replacingOccurrences(of: "/usr/local/", with: "\(destdir)/usr/local/")
                .write(toFile: path, atomically: true, encoding: .utf8)
            userUnits.append(path)
        }
        let user = try runCommand(
            Self.analyze, ["--user", "verify", "--man=no"] + userUnits, environment: ["XDG_RUNTIME_DIR": runtime])
        #expect(user.status == 0, "user units: \(user.stderr)")
        #expect(user.stderr.isEmpty, "user units: \(user.stderr)")
    }

    @Test("Should rate the system service 2.0 or lower in systemd-analyze security, as its comment records")
    func securityExposure() throws {
        let unit = Self.root.appendingPathComponent("systemd/system/vaultd.service").path
        let result = try expectSuccess(runCommand(Self.analyze, ["security", "--offline=true", "--no-pager", unit]))
        let score = try #require(Self.exposure(in: result.stdout), "no overall exposure in:\n\(result.stdout)")
        #expect(score <= 2.0, "\(result.stdout)")
        // The score written at the top of the unit is the one measured.
        let text = try String(contentsOfFile: unit, encoding: .utf8)
        let recorded = try #require(Self.exposure(in: text), "the unit records no score")
        #expect(recorded == score, "the unit records \(recorded), systemd-analyze says \(score)")
    }

    @Test("Should run the system unit on the SQLite store with its data key from an encrypted credential, no keyring")
    func sqliteStoreWithCredential() throws {
        let text = try String(
            contentsOfFile: Self.root.appendingPathComponent("systemd/system/vaultd.service").path, encoding: .utf8)
        let settings = text.split(separator: "\n").filter { !$0.hasPrefix("#") }.map(String.init)
        for line in [
            "ExecStart=/usr/local/bin/vaultd --config /etc/vaultd/vaultd.conf", "Environment=VAULTD_STORE=sqlite",
            "LoadCredentialEncrypted=data-key:/etc/vaultd/data-key.cred",
            "AssertFileNotEmpty=/etc/vaultd/data-key.cred", "StateDirectory=vaultd", "DynamicUser=yes",
        ] {
            #expect(settings.contains(line), "systemd/system/vaultd.service has no '\(line)'")
        }
        // No keyring and no bus: the wrapper and its password belong to the drop-in.
        for word in ["vaultd-system-keyring", "keyring-password", "DBUS"] {
            #expect(!settings.contains { $0.contains(word) }, "the unit still names \(word)")
        }
    }

    @Test("Should create a 32-byte data key with the one-liner the unit, scripts/install and vaultd(8) give")
    func dataKeyOneLiner() throws {
        let dir = try TemporaryDirectory()
        let unit = try String(
            contentsOfFile: Self.root.appendingPathComponent("systemd/system/vaultd.service").path, encoding: .utf8)
        let line = try #require(
            unit.split(separator: "\n").first { $0.contains("systemd-creds encrypt --name=data-key") },
            "the unit's comment gives no one-liner")
        let command = String(line.drop { $0 == "#" || $0 == " " })
        #expect(command.hasSuffix(" /etc/vaultd/data-key.cred)"), "\(command)")
        let page = try String(
            contentsOfFile: Self.root.appendingPathComponent("man/vaultd.8.scd").path, encoding: .utf8)
        #expect(page.contains(command), "man/vaultd.8.scd gives another command than the unit: \(command)")
        let install = try runCommand(
            Self.root.appendingPathComponent("scripts/install"), [],
            environment: [
                "DESTDIR": dir.path("root"), "PREFIX": "/usr/local", "VAULTD_BIN_DIR": Binaries.directory.path,
            ],
            seconds: 60)
        #expect(install.stdout.contains(command), "scripts/install prints another command:\n\(install.stdout)")

        // Run it as written, with /etc/vaultd in the test's directory and the
        // host's credential secret (normally /var/lib/systemd/credential.secret)
        // in the test's directory too: nothing of the machine is touched.
        let etc = dir.path("etc")
        try FileManager.default.createDirectory(atPath: etc, withIntermediateDirectories: true)
        let environment = ["SYSTEMD_CREDENTIAL_SECRET": dir.path("credential.secret")]
        try expectSuccess(
            runCommand(
                URL(fileURLWithPath: "/bin/sh"),
                ["-c", command.replacingOccurrences(of: "/etc/vaultd/", with: "\(etc)/")], environment: environment))
        let credential = "\(etc)/data-key.cred"
        let attributes = try FileManager.default.attributesOfItem(atPath: credential)
        #expect((attributes[.posixPermissions] as? Int) == 0o600, "\(attributes)")
        // systemd decrypts it (as LoadCredentialEncrypted= does) into exactly 32 bytes.
        let plain = dir.path("data-key")
        try expectSuccess(
            runCommand(Self.creds, ["decrypt", "--name=data-key", credential, plain], environment: environment))
        #expect(FileManager.default.contents(atPath: plain)?.count == 32)
        // Under another name (the unit's ID must be data-key) it is refused.
        let renamed = try runCommand(
            Self.creds, ["decrypt", "--name=data-key.previous", credential, dir.path("other")],
            environment: environment)
        #expect(renamed.status != 0)
    }

    @Test("Should keep the system instance's sessions in its own keyring under STATE_DIRECTORY across restarts")
    func systemKeyringPersists() throws {
        let dir = try TemporaryDirectory()
        defer { Self.killProcesses(mentioning: dir.url.path) }
        let credentials = dir.path("credentials")
        let state = dir.path("state")
        for path in [credentials, state, dir.path("runtime")] {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        }
        try "system-keyring-password-1234\n".write(
            toFile: "\(credentials)/keyring-password", atomically: true, encoding: .utf8)
        let socket = dir.path("s")
        let user = uniqueName("sys")
        let token = "sys_token_abcdefghijklmnopqrstuvwxyz"

        let first = try SystemInstance(directory: dir, socket: socket)
        let login = try VarlinkClient(path: socket, timeoutSeconds: 60).call(
            VaultMethod.login.rawValue, ["provider": "demo", "user": .string(user), "token": .string(token)])
        #expect(login.error == nil, "\(login)")
        #expect(login.parameters["session"]?["state"]?.stringValue == "logged")
        #expect(first.stop() == 0, "\(first.output.text)")
        #expect(FileManager.default.fileExists(atPath: "\(state)/keyring/keyrings/login.keyring"))
        // Outside systemd nothing stops the bus and the keyring daemon with
        // vaultd (under systemd, the cgroup does): stop them here, so the
        // second run has to open the keyring again from STATE_DIRECTORY.
        Self.killProcesses(mentioning: dir.url.path)

        let second = try SystemInstance(directory: dir, socket: socket)
        let session = try VarlinkClient(path: socket, timeoutSeconds: 60).call(
            VaultMethod.getSession.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(session.error == nil, "\(session)")
        #expect(session.parameters["session"]?["state"]?.stringValue == "logged")
        let stored = try VarlinkClient(path: socket, timeoutSeconds: 60).call(
            VaultMethod.getToken.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(stored.parameters["token"]?.stringValue == token)
        #expect(second.stop() == 0, "\(second.output.text)")
        #expect(!second.output.text.contains(token))
        #expect(!first.output.text.contains("system-keyring-password"))
    }

    @Test("Should refuse to start, in one line, without the keyring password credential")
    func missingPasswordCredential() throws {
        let dir = try TemporaryDirectory()
        defer { Self.killProcesses(mentioning: dir.url.path) }
        for name in ["credentials", "state", "runtime"] {
            try FileManager.default.createDirectory(atPath: dir.path(name), withIntermediateDirectories: true)
        }
        let result = try runCommand(
            Self.wrapper, [Binaries.vaultd.path, "--socket", dir.path("s")],
            environment: SystemInstance.environment(dir), seconds: 20)
        #expect(result.status != 0)
        let lines = result.stderr.split(separator: "\n")
        #expect(lines.count == 1, "\(result.stderr)")
        #expect(result.stderr.contains("keyring-password"), "\(result.stderr)")
        #expect(Self.processes(mentioning: dir.url.path).isEmpty, "no bus or keyring was started")
        #expect(!FileManager.default.fileExists(atPath: dir.path("s")))
    }

    static let wrapper = root.appendingPathComponent("scripts/vaultd-system-keyring")
    private static let creds = URL(fileURLWithPath: "/usr/bin/systemd-creds")

    /// vaultd.service as systemd 252 loads it under `root`, drop-ins applied:
    /// the unit dump `systemd-analyze verify` writes at debug level.
    private static func loadedSystemService(root: String, units: [String]) throws -> String {
        let result = try runCommand(
            analyze, ["verify", "--man=no", "--root=\(root)"] + units, environment: ["SYSTEMD_LOG_LEVEL": "debug"])
        // The dump is on stdout, the debug log on stderr.
        guard let start = result.stdout.range(of: "Description: vaultd credential vault (system instance)") else {
            throw HarnessError("no dump of vaultd.service in:\n\(result.stdout)")
        }
        return String(result.stdout[start.lowerBound...])
    }

    /// Runs scripts/install into `destdir` with the binaries already built.
    private func install(into destdir: String) throws {
        let result = try runCommand(
            Self.root.appendingPathComponent("scripts/install"), [],
            environment: ["DESTDIR": destdir, "PREFIX": "/usr/local", "VAULTD_BIN_DIR": Binaries.directory.path],
            seconds: 60)
        #expect(result.status == 0, "scripts/install: \(result.stderr)")
        #expect(result.stdout.contains("systemctl --user enable --now vaultd.socket"))
    }

    /// The number in "Overall exposure level for vaultd.service: 1.1".
    private static func exposure(in text: String) -> Double? {
        let marker = "Overall exposure level for vaultd.service: "
        guard let range = text.range(of: marker) else { return nil }
        let number = text[range.upperBound...].prefix { $0.isNumber || $0 == "." }
        return Double(number)
    }

    /// Live processes whose environment mentions `marker` (a test's own
    /// temporary directory): vaultd, and the bus and keyring daemon the
    /// wrapper started, which detach from it.
    static func processes(mentioning marker: String) -> [pid_t] {
        let me = getpid()
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { pid_t($0) }.filter { pid in
            guard pid != me, let environ = FileManager.default.contents(atPath: "/proc/\(pid)/environ") else {
                return false
            }
            return String(decoding: environ, as: UTF8.self).contains(marker)
        }
    }

    /// Stops (SIGTERM, then SIGKILL after 2 s) every process `processes(mentioning:)` finds.
    /// (Started from a test, the daemons may inherit a signal mask that blocks SIGTERM.)
    static func killProcesses(mentioning marker: String) {
        var pids = processes(mentioning: marker)
        for pid in pids { kill(pid, SIGTERM) }
        let deadline = Date().addingTimeInterval(2)
        while !pids.isEmpty && Date() < deadline {
            usleep(20_000)
            pids = processes(mentioning: marker)
        }
        for pid in pids { kill(pid, SIGKILL) }
        let killed = Date().addingTimeInterval(5)
        while !processes(mentioning: marker).isEmpty && Date() < killed { usleep(20_000) }
    }
}

/// scripts/vaultd-system-keyring running vaultd as the system unit would,
/// with the systemd-provided directories in a test's temporary directory.
private final class SystemInstance {
    let process = Process()
    let output: OutputCollector
    private let stdout: OutputCollector
    private let directory: TemporaryDirectory

    static func environment(_ dir: TemporaryDirectory) -> [String: String] {
        [
            "CREDENTIALS_DIRECTORY": dir.path("credentials"), "STATE_DIRECTORY": dir.path("state"),
            "RUNTIME_DIRECTORY": dir.path("runtime"),
        ]
    }

    /// Starts the wrapper and waits (bounded) for vaultd's ready line.
    init(directory: TemporaryDirectory, socket: String) throws {
        self.directory = directory
        process.executableURL = SystemdUnitTests.wrapper
        process.arguments = [
            Binaries.vaultd.path, "--socket", socket, "--log-level", "debug", "--config",
            Binaries.packageRoot.appendingPathComponent("config/vaultd.conf").path,
        ]
        var env = ProcessInfo.processInfo.environment
        // Its own bus, not the test's keyring.
        env["DBUS_SESSION_BUS_ADDRESS"] = nil
        env["VAULTD_KEYRING_PASSWORD"] = nil
        // As the drop-in system-keyring.conf sets it.
        env["VAULTD_STORE"] = "secret-service"
        for (key, value) in Self.environment(directory) { env[key] = value }
        process.environment = env
        let errPipe = Pipe()
        let outPipe = Pipe()
        process.standardError = errPipe
        process.standardOutput = outPipe
        process.standardInput = FileHandle.nullDevice
        output = OutputCollector(errPipe)
        stdout = OutputCollector(outPipe)
        try process.run()
        guard output.wait(for: "notice: ready", seconds: 30) else {
            kill(process.processIdentifier, SIGKILL)
            throw HarnessError("vaultd-system-keyring did not become ready:\n\(output.text)")
        }
    }

    /// Sends SIGTERM and waits (bounded) for the exit; returns the exit status.
    /// The wrapper's bus and keyring outlive vaultd (under systemd the cgroup
    /// ends them) and may hold its output open, and Foundation reports the
    /// exit only once the output closed: so once vaultd itself has exited
    /// (a zombie, or reaped), they are stopped too.
    func stop() -> Int32 {
        let pid = process.processIdentifier
        if process.isRunning { kill(pid, SIGTERM) }
        for _ in 0..<2000 where !Self.hasExited(pid) { usleep(10_000) }
        SystemdUnitTests.killProcesses(mentioning: directory.url.path)
        _ = output.waitForEnd(seconds: 20)
        let deadline = Date().addingTimeInterval(20)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            let killed = Date().addingTimeInterval(5)
            while process.isRunning && Date() < killed { usleep(10_000) }
        }
        return process.isRunning ? -1 : process.terminationStatus
    }

    deinit { if process.isRunning { _ = stop() } }

    /// True when `pid` has exited: no longer in /proc, or a zombie.
    static func hasExited(_ pid: Int32) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return true }
        return stat[stat.index(after: close)...].trimmingCharacters(in: .whitespaces).hasPrefix("Z")
    }
}
