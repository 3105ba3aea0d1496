import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// The service manager's side of sd_notify: a datagram socket that a thread
/// reads at once, as systemd does, so the daemon never waits on it.
final class NotifyListener: @unchecked Sendable {
    let path: String
    private let fd: Int32
    private let condition = NSCondition()
    private var received: [String] = []
    private var consumed = 0
    private var closed = false

    init(path: String) throws {
        self.path = path
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
            guard bind(fd, address, length) == 0 else { throw SystemError("bind") }
        }
        var timeout = timeval(tv_sec: 0, tv_usec: 200_000)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        Thread.detachNewThread { [self] in
            var buffer = [UInt8](repeating: 0, count: 4096)
            while true {
                condition.lock()
                let stop = closed
                condition.unlock()
                if stop { return }
                let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard n > 0 else { continue }
                condition.lock()
                received.append(String(decoding: buffer[0..<n], as: UTF8.self))
                condition.broadcast()
                condition.unlock()
            }
        }
    }

    deinit {
        condition.lock()
        closed = true
        condition.unlock()
    }

    /// Every message received so far.
    var messages: [String] {
        condition.lock()
        defer { condition.unlock() }
        return received
    }

    /// The next message not yet consumed that contains `needle`, waiting at most
    /// `seconds`; messages before it are consumed too.
    func wait(for needle: String, seconds: Double = 20) -> String? {
        let deadline = Date().addingTimeInterval(seconds)
        condition.lock()
        defer { condition.unlock() }
        while true {
            while consumed < received.count {
                let message = received[consumed]
                consumed += 1
                if message.contains(needle) { return message }
            }
            if !condition.wait(until: deadline) { return nil }
        }
    }
}

/// vaultd under a service manager: sd_notify, socket activation, the watchdog,
/// SIGTERM and SIGHUP.
@Suite("vaultd under systemd", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ServiceManagerTests {
    /// The fixture's daemon, started with NOTIFY_SOCKET pointing at a listener the test reads.
    func startNotified(_ fixture: DaemonFixture) throws -> (NotifyListener, RunningDaemon) {
        let notify = try NotifyListener(path: fixture.directory.path("notify"))
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath,
            environment: ["NOTIFY_SOCKET": notify.path])
        return (notify, daemon)
    }

    @Test("Should take its socket from systemd-socket-activate and say READY only with sessions restored")
    func socketActivationAndReady() throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("act")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token).status == 0)
        fixture.daemon?.stop()

        let dir = try TemporaryDirectory()
        let notify = try NotifyListener(path: dir.path("notify"))
        let socketPath = dir.path("activated.sock")
        let bus = ProcessInfo.processInfo.environment["DBUS_SESSION_BUS_ADDRESS"] ?? ""
        let activator = Process()
        activator.executableURL = URL(fileURLWithPath: "/usr/bin/systemd-socket-activate")
        activator.arguments =
            [
                "-l", socketPath, "-E", "NOTIFY_SOCKET=\(notify.path)", "-E", "DBUS_SESSION_BUS_ADDRESS=\(bus)",
            ]
            + (try fixture.storeEnvironment()).sorted { $0.key < $1.key }.flatMap { ["-E", "\($0.key)=\($0.value)"] }
            + [Binaries.vaultd.path, "--config", fixture.configPath]
        let err = Pipe()
        activator.standardError = err
        activator.standardOutput = FileHandle.nullDevice
        let output = OutputCollector(err)
        try activator.run()
        defer {
            if activator.isRunning { kill(activator.processIdentifier, SIGKILL) }
        }
        #expect(output.wait(for: "Listening on"), "\(output.text)")

        // The first connection starts vaultd; the call waits in the socket until it serves.
        let reply = try VarlinkClient(path: socketPath, timeoutSeconds: 60).call(
            VaultMethod.getSession.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(reply.parameters["session"]?["state"]?.stringValue == "logged")
        let ready = try #require(notify.wait(for: "READY=1"))
        let restored = notify.messages.joined(separator: "\n")
        #expect(ready.contains("STATUS="))
        #expect(!ready.contains("STATUS=0 sessions"), "sessions are restored before READY: \(restored)")
        #expect(output.wait(for: "socket=\"passed by systemd\""), "\(output.text)")

        // STATUS follows the sessions.
        #expect(try vaultctl(socketPath, ["logout", "demo", user]).status == 0)
        #expect(notify.wait(for: "STATUS=") != nil)

        kill(activator.processIdentifier, SIGTERM)
        #expect(notify.wait(for: "STOPPING=1") != nil)
        #expect(output.waitForEnd())
        #expect(try reap(activator) == 0)
    }

    @Test("Should send WATCHDOG=1 at half of WATCHDOG_USEC")
    func watchdog() throws {
        let dir = try TemporaryDirectory()
        let notify = try NotifyListener(path: dir.path("notify"))
        let daemon = try RunningDaemon(
            socketPath: dir.path("s"), configPath: nil,
            environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "2000000"])
        defer { daemon.stop() }
        var times: [Date] = []
        for _ in 0..<3 {
            guard notify.wait(for: "WATCHDOG=1", seconds: 5) != nil else { break }
            times.append(Date())
        }
        #expect(times.count == 3, "three pings: \(notify.messages)")
        for (a, b) in zip(times, times.dropFirst()) {
            // Sent every second; systemd would act after two.
            #expect(b.timeIntervalSince(a) < 2.0)
        }
    }

    @Test("Should send STOPPING on SIGTERM, answer the calls in flight, keep every acknowledged login, exit 0")
    func stopWithCallsInFlight() throws {
        let fixture = try DaemonFixture(start: false)
        let (notify, daemon) = try startNotified(fixture)
        let users = (0..<20).map { uniqueName("stop\($0)") }
        let connections = try users.map { _ in try VarlinkClient.raw(fixture.socketPath) }
        for (connection, user) in zip(connections, users) {
            try connection.send(
                JSON.object([
                    "method": .string(VaultMethod.login.rawValue),
                    "parameters": ["provider": "demo", "user": .string(user), "token": .string(DaemonTests.token)],
                ]).text)
        }
        #expect(daemon.output.wait(for: "call in flight"))
        kill(daemon.process.processIdentifier, SIGTERM)
        var acknowledged: [String] = []
        for (connection, user) in zip(connections, users) {
            if let reply = try? connection.nextReply(), reply.error == nil { acknowledged.append(user) }
        }
        #expect(daemon.waitForExit() == 0)
        #expect(notify.wait(for: "STOPPING=1") != nil)
        #expect(!acknowledged.isEmpty, "the call in flight was answered")

        try fixture.start()
        for user in acknowledged {
            let status = try vaultctl(fixture.socketPath, ["--json", "status", "demo", user])
            #expect(status.status == 0, "acknowledged login of \(user) survived the stop")
            _ = try vaultctl(fixture.socketPath, ["logout", "demo", user])
        }
        for user in users where !acknowledged.contains(user) {
            _ = try vaultctl(fixture.socketPath, ["logout", "demo", user])
        }
    }

    @Test("Should answer on SIGTERM every call a client sent, even one that had not read its replies yet")
    func stopAnswersEverythingSent() throws {
        let fixture = try DaemonFixture()
        let daemon = try #require(fixture.daemon)
        let user = uniqueName("drain")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token).status == 0)
        // Pipelined calls, none of whose replies is read yet: vaultd answers
        // until about 1 MiB of replies waits, then stops reading.
        let connection = try VarlinkClient.raw(fixture.socketPath)
        let call =
            Array(
                JSON.object([
                    "method": .string(VaultMethod.getSession.rawValue),
                    "parameters": ["provider": "demo", "user": .string(user)],
                ]).text.utf8) + [0]
        // One buffer of many calls, sent as fast as vaultd reads it, until it
        // stops reading (its queue of replies is full) or all is sent.
        let calls = Array([[UInt8]](repeating: call, count: 12_000).joined())
        var sentBytes = 0
        while sentBytes < calls.count {
            var ready = pollfd(fd: connection.fileDescriptor, events: Int16(POLLOUT), revents: 0)
            // Generous: on a loaded machine vaultd may read late; it stops for good only when its replies queue up.
            guard poll(&ready, 1, 3000) > 0 else { break }
            let n = calls[sentBytes...].withUnsafeBytes {
                Glibc.send(connection.fileDescriptor, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT))
            }
            if n > 0 { sentBytes += n } else if errno != EAGAIN && errno != EINTR { break }
        }
        let sent = sentBytes / call.count
        // A call cut in half is never answered: end the input there.
        if sentBytes % call.count != 0 { shutdown(connection.fileDescriptor, Int32(SHUT_WR)) }
        #expect(sent > 4000, "enough calls to queue more than vaultd's 1 MiB of replies")
        #expect(daemon.output.wait(for: "audit action=Login"))
        kill(daemon.process.processIdentifier, SIGTERM)
        var answered = 0
        var stopping = 0
        var otherErrors: [String] = []
        while let reply = try connection.nextReply() {
            answered += 1
            if reply.parameters["message"]?.stringValue?.hasPrefix("vaultd is stopping") == true {
                stopping += 1
            } else if let error = reply.error {
                otherErrors.append(error)
            }
        }
        #expect(answered == sent, "\(answered) of \(sent) calls answered, \(stopping) with 'stopping'")
        #expect(stopping > 0, "calls not started when SIGTERM came are answered 'stopping'")
        #expect(otherErrors.isEmpty, "\(otherErrors.prefix(3))")
        #expect(daemon.waitForExit() == 0)
        try fixture.start()
        _ = try vaultctl(fixture.socketPath, ["logout", "demo", user])
    }

    @Test("Should apply a good configuration on SIGHUP and keep sessions of removed providers")
    func reloadGoodConfig() throws {
        let fixture = try DaemonFixture(start: false)
        let (notify, daemon) = try startNotified(fixture)
        defer { daemon.stop() }
        let user = uniqueName("reload")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token).status == 0)

        try fixture.configure("[Provider second]\nType=static\n")
        kill(daemon.process.processIdentifier, SIGHUP)
        #expect(notify.wait(for: "RELOADING=1") != nil)
        #expect(notify.wait(for: "READY=1") != nil)
        #expect(daemon.output.wait(for: "configuration reloaded"))

        try expectSuccess(vaultctl(fixture.socketPath, ["login", "second", user], input: DaemonTests.token))
        let gone = try vaultctl(fixture.socketPath, ["login", "demo", uniqueName("new")], input: DaemonTests.token)
        #expect(gone.stderr.contains("ERR_PROVIDER_NOT_FOUND"))
        let kept = try vaultctl(fixture.socketPath, ["token", "demo", user])
        #expect(kept.stdout == DaemonTests.token + "\n", "the removed provider's session is kept")
        #expect(daemon.output.text.contains("the provider of a session was removed"))
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
        #expect(try vaultctl(fixture.socketPath, ["logout", "second", user]).status == 0)
    }

    @Test("Should decide a GetToken sent again on one connection anew after a reload changes who may read the token")
    func repeatedGetTokenAfterReload() throws {
        let fixture = try DaemonFixture(start: false)
        let user = uniqueName("reloadrepeat")
        let declared = { (owner: String) in
            "[Provider demo]\nType=static\n\n[Account demo \(user)]\nOwner=\(owner)\n"
        }
        try fixture.configure(declared("root"))
        let (notify, daemon) = try startNotified(fixture)
        defer { daemon.stop() }
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token).status == 0)
        let asker = try VarlinkClient.raw(fixture.socketPath)
        let getToken = #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"\#(user)"}}"#
        for _ in 0..<3 {
            try asker.send(getToken)
            #expect(try asker.nextReply()?.parameters["token"]?.stringValue == DaemonTests.token)
        }
        // The account now belongs to another user: root's calls address that
        // user's session, whose token is handed to its owner alone.
        try fixture.configure(declared("nobody"))
        kill(daemon.process.processIdentifier, SIGHUP)
        #expect(notify.wait(for: "RELOADING=1") != nil)
        #expect(notify.wait(for: "READY=1") != nil)
        #expect(daemon.output.wait(for: "configuration reloaded"))
        try asker.send(getToken)
        let refused = try #require(try asker.nextReply())
        #expect(refused.error == "io.vaultd.Vault.AccessDenied", "\(refused.parameters)")
        #expect(refused.parameters["token"] == nil)

        // Root may now read the other user's session: the same bytes get that
        // session's token, and the audit trail counts those handouts under it.
        try fixture.configure(declared("nobody") + "TokenReadUsers=root\n")
        kill(daemon.process.processIdentifier, SIGHUP)
        #expect(notify.wait(for: "RELOADING=1") != nil)
        #expect(notify.wait(for: "READY=1") != nil)
        let other = "tok_reload_other_owner_abcdefgh"
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "demo", user], input: other))
        for _ in 0..<4 {
            try asker.send(getToken)
            #expect(try asker.nextReply()?.parameters["token"]?.stringValue == other)
        }
        #expect(daemon.stop() == 0)
        let handouts = AuditLine.all(in: daemon.allOutput).filter {
            $0.fields["action"] == "GetToken" && $0.fields["user"] == user && $0.fields["result"] == "ok"
        }
        func total(owner: String) -> Int {
            handouts.filter { $0.fields["owner"] == owner }.reduce(0) { $0 + (Int($1.fields["count"] ?? "1") ?? 0) }
        }
        #expect(total(owner: "0") == 3, "\(handouts.map(\.text))")
        #expect(total(owner: "65534") == 4, "\(handouts.map(\.text))")
    }

    @Test("Should refuse a broken configuration on SIGHUP and keep the old one")
    func reloadBrokenConfig() throws {
        let fixture = try DaemonFixture(start: false)
        let (notify, daemon) = try startNotified(fixture)
        defer { daemon.stop() }
        try fixture.configure("[Provider demo]\nType=static\nBogus=1\n")
        #expect(notify.wait(for: "READY=1") != nil)
        kill(daemon.process.processIdentifier, SIGHUP)
        #expect(notify.wait(for: "RELOADING=1") != nil)
        let ready = try #require(notify.wait(for: "READY=1"))
        #expect(ready.contains("last reload failed"))
        #expect(daemon.output.wait(for: "reload refused"))
        #expect(daemon.output.text.contains("\(fixture.configPath):3: unknown key 'Bogus'"))
        let user = uniqueName("still")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: DaemonTests.token).status == 0)
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should read drop-ins from vaultd.conf.d in lexical order, later wins")
    func dropIns() throws {
        let dir = try TemporaryDirectory()
        let config = dir.path("vaultd.conf")
        try "[Provider demo]\nType=static\n".write(toFile: config, atomically: true, encoding: .utf8)
        try FileManager.default.createDirectory(atPath: config + ".d", withIntermediateDirectories: true)
        try "[Provider extra]\nType=static\n[Vault]\nStoreTimeout=5s\n".write(
            toFile: config + ".d/10-extra.conf", atomically: true, encoding: .utf8)
        try "[Vault]\nStoreTimeout=7s\n".write(toFile: config + ".d/20-later.conf", atomically: true, encoding: .utf8)
        try "[Provider ignored]\n".write(toFile: config + ".d/README", atomically: true, encoding: .utf8)
        let check = try expectSuccess(runCommand(Binaries.vaultd, ["--check-config", "--config", config]))
        #expect(check.stdout.contains("2 provider(s)"))
        try "[Provider extra]\nWrong=1\n".write(toFile: config + ".d/30-bad.conf", atomically: true, encoding: .utf8)
        try expectFailure(
            runCommand(Binaries.vaultd, ["--check-config", "--config", config]),
            saying: "\(config).d/30-bad.conf:2: unknown key 'Wrong'")
    }
}
