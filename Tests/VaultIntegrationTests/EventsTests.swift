import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// A Subscribe stream on a connection of its own: the snapshot, then events.
/// Every read is bounded by SO_RCVTIMEO.
final class EventStream {
    let fd: Int32
    private var decoder = VarlinkFrameDecoder(maximumSize: 16 << 20)
    /// Every reply read so far, serialized as it came: for "no secret" checks.
    private(set) var rawText = ""

    /// Connects to `path`; `receiveBuffer` sets SO_RCVBUF before connecting.
    init(_ path: String, receiveBuffer: Int32? = nil, timeoutSeconds: Int = 10) throws {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket") }
        if var size = receiveBuffer {
            setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        do {
            try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
                while Glibc.connect(fd, address, length) != 0 {
                    if errno == EINTR { continue }
                    throw SystemError("connect")
                }
            }
        } catch {
            close(fd)
            throw error
        }
        self.fd = fd
    }

    deinit { close(fd) }

    /// Sends `Subscribe` with `more`, optionally filtered.
    func subscribe(provider: String? = nil, user: String? = nil, kinds: [String]? = nil) throws {
        var parameters: [String: JSON] = [:]
        if let provider { parameters["provider"] = .string(provider) }
        if let user { parameters["user"] = .string(user) }
        if let kinds { parameters["kinds"] = .array(kinds.map { .string($0) }) }
        var bytes = VarlinkCall(method: VaultMethod.subscribe.rawValue, parameters: parameters, more: true).encoded()
        bytes.append(0)
        try bytes.withUnsafeBytes { try UnixSocket.sendAll(fd, $0) }
    }

    /// Why a read ended without a reply.
    enum ReadEnd: Error, Equatable {
        case closed
        case reset
        case timedOut
    }

    /// The next reply; throws `.closed` at EOF, `.timedOut` when SO_RCVTIMEO passed.
    func receive() throws -> VarlinkReply {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            if let message = try decoder.next() {
                let reply = try VarlinkReply(message: message)
                rawText += String(decoding: message, as: UTF8.self) + "\n"
                return reply
            }
            let n = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { throw ReadEnd.closed }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { throw ReadEnd.timedOut }
                if errno == ECONNRESET { throw ReadEnd.reset }
                throw SystemError("recv")
            }
            decoder.append(buffer[0..<n])
        }
    }

    /// Bytes of an unfinished message are buffered: a stream that ends here was cut mid-message.
    var hasPartialMessage: Bool { decoder.hasPartialMessage }

    /// Reads the snapshot reply and returns its sessions.
    func snapshot() throws -> [JSON] {
        let reply = try receive()
        guard reply.error == nil else { throw HarnessError("Subscribe answered \(reply.error!): \(reply.parameters)") }
        guard reply.continues else { throw HarnessError("the snapshot reply does not continue: \(reply)") }
        guard reply.parameters["event"] == nil || reply.parameters["event"] == .null else {
            throw HarnessError("the first reply is an event, not a snapshot: \(reply.parameters)")
        }
        guard let sessions = reply.parameters["sessions"]?.arrayValue else {
            throw HarnessError("the snapshot has no sessions array: \(reply.parameters)")
        }
        return sessions
    }

    /// Reads one event reply and returns the event.
    func event() throws -> JSON {
        let reply = try receive()
        guard reply.error == nil else { throw HarnessError("instead of an event: \(reply.error!) \(reply.parameters)") }
        guard reply.continues else { throw HarnessError("an event reply that does not continue: \(reply)") }
        guard let event = reply.parameters["event"], event.objectValue != nil else {
            throw HarnessError("a reply without an event: \(reply.parameters)")
        }
        return event
    }
}

/// Reads a Subscribe stream on a thread of its own, so the subscriber keeps
/// up however fast the events come, and lets a test wait for a count.
final class BackgroundSubscriber: @unchecked Sendable {
    private let stream: EventStream
    private let condition = NSCondition()
    private var collected: [JSON] = []
    private var ended: String?

    /// Subscribes, reads the snapshot here, then reads events in the background.
    init(_ path: String, provider: String? = nil, user: String? = nil, kinds: [String]? = nil) throws {
        stream = try EventStream(path, timeoutSeconds: 120)
        try stream.subscribe(provider: provider, user: user, kinds: kinds)
        _ = try stream.snapshot()
        Thread.detachNewThread { [self] in
            while true {
                do {
                    let event = try stream.event()
                    condition.lock()
                    collected.append(event)
                    condition.broadcast()
                    condition.unlock()
                } catch {
                    condition.lock()
                    ended = "\(error)"
                    condition.broadcast()
                    condition.unlock()
                    return
                }
            }
        }
    }

    var events: [JSON] {
        condition.lock()
        defer { condition.unlock() }
        return collected
    }

    /// Why the reader stopped, if it did.
    var end: String? {
        condition.lock()
        defer { condition.unlock() }
        return ended
    }

    /// Waits until `count` events arrived or the stream ended; the events so far.
    func wait(count: Int, seconds: Double = 20) -> [JSON] {
        let deadline = Date().addingTimeInterval(seconds)
        condition.lock()
        defer { condition.unlock() }
        while collected.count < count && ended == nil {
            if !condition.wait(until: deadline) { break }
        }
        return collected
    }

    /// Stops the reader thread by shutting the connection down.
    func close() { shutdown(stream.fd, Int32(SHUT_RDWR)) }

    deinit { shutdown(stream.fd, Int32(SHUT_RDWR)) }
}

/// A vaultd started on a config text of the test's own.
final class ConfiguredDaemon {
    let directory: TemporaryDirectory
    let socketPath: String
    let configPath: String
    let daemon: RunningDaemon

    init(config: String) throws {
        directory = try TemporaryDirectory()
        // Other uids (AccessTests) must reach the socket inside.
        chmod(directory.url.path, 0o755)
        socketPath = directory.path("vaultd.sock")
        configPath = directory.path("vaultd.conf")
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
        daemon = try RunningDaemon(socketPath: socketPath, configPath: configPath)
    }

    func client() throws -> VarlinkClient { try VarlinkClient(path: socketPath, timeoutSeconds: 60) }

    deinit { daemon.stop() }
}

extension VarlinkClient {
    func login(_ provider: String, _ user: String, token: String, expiresAt: Int64? = nil) throws -> VarlinkReply {
        var parameters: [String: JSON] = [
            "provider": .string(provider), "user": .string(user), "token": .string(token),
        ]
        if let expiresAt { parameters["expiresAt"] = .int(expiresAt) }
        return try call(VaultMethod.login.rawValue, parameters)
    }

    func logout(_ provider: String, _ user: String) throws -> VarlinkReply {
        try call(VaultMethod.logout.rawValue, ["provider": .string(provider), "user": .string(user)])
    }

    func forceLogout(_ provider: String, _ user: String, reason: String? = nil) throws -> VarlinkReply {
        var parameters: [String: JSON] = ["provider": .string(provider), "user": .string(user)]
        if let reason { parameters["reason"] = .string(reason) }
        return try call(VaultMethod.forceLogout.rawValue, parameters)
    }

    func getToken(_ provider: String, _ user: String) throws -> VarlinkReply {
        try call(VaultMethod.getToken.rawValue, ["provider": .string(provider), "user": .string(user)])
    }
}

/// Starts a long-running command that SIGINT ends, as from a shell. A child
/// that Foundation spawns from a test's (Dispatch) thread inherits that
/// thread's signal mask, with SIGINT and SIGTERM blocked, so the command is
/// started through a tiny exec wrapper that unblocks every signal and puts
/// SIGINT and SIGTERM back to their defaults.
func startInterruptible(_ executable: String, _ arguments: [String]) throws -> (
    Process, OutputCollector, OutputCollector
) {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
    process.arguments =
        [
            "-c",
            "import os, signal, sys; signal.pthread_sigmask(signal.SIG_SETMASK, []); "
                + "signal.signal(signal.SIGINT, signal.SIG_DFL); signal.signal(signal.SIGTERM, signal.SIG_DFL); "
                + "os.execv(sys.argv[1], sys.argv[1:])",
            executable,
        ] + arguments
    let out = Pipe()
    let err = Pipe()
    process.standardOutput = out
    process.standardError = err
    process.standardInput = FileHandle.nullDevice
    let collector = OutputCollector(out)
    let errors = OutputCollector(err)
    try process.run()
    return (process, collector, errors)
}

/// A short description of an event for messages: "kind provider/user".
func describeEvent(_ event: JSON) -> String {
    "\(event["kind"]?.stringValue ?? "?") \(event["provider"]?.stringValue ?? "?")/\(event["user"]?.stringValue ?? "?")"
}

/// Subscribe, the events it streams, ForceLogout and `vaultctl watch`/`kick`,
/// against the real daemon and keyring.
@Suite("Events and forced logout", .requiresKeyring, .timeLimit(.minutes(5)), .serialized)
struct EventsTests {
    static let token = "tok_events_4k2m9q7w1e5r4t6y0u8i"
    static let config = "[Provider demo]\nType=static\n\n[Provider other]\nType=static\n"

    @Test("Should send a snapshot, then the events of a login, a failed login, a kick and a logout in order")
    func snapshotThenEventsInOrder() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let client = try d.client()
        let user = uniqueName("ev")
        let bystander = uniqueName("by")
        #expect(try client.login("demo", user, token: EventsTests.token).error == nil)

        let filtered = try EventStream(d.socketPath)
        try filtered.subscribe(provider: "demo", user: user)
        let sessions = try filtered.snapshot()
        #expect(sessions.count == 1, "only the filtered account: \(sessions)")
        #expect(sessions.first?["user"]?.stringValue == user)
        #expect(sessions.first?["state"]?.stringValue == "logged")
        #expect(sessions.first?["token"]?.stringValue == Secret.mask(EventsTests.token))

        let everything = try EventStream(d.socketPath)
        try everything.subscribe()
        let all = try everything.snapshot()
        #expect(all.contains { $0["user"]?.stringValue == user })

        let kicksOnly = try EventStream(d.socketPath)
        try kicksOnly.subscribe(provider: "demo", user: user, kinds: ["kickedOffline"])
        _ = try kicksOnly.snapshot()

        let before = Int64(Date().timeIntervalSince1970)
        #expect(try client.logout("demo", user).error == nil)
        #expect(try client.login("demo", bystander, token: EventsTests.token).error == nil)
        #expect(try client.login("demo", user, token: EventsTests.token).error == nil)
        #expect(try client.forceLogout("demo", user, reason: "revoked").error == nil)
        let expired = try client.login("demo", user, token: EventsTests.token, expiresAt: before - 60)
        #expect(expired.parameters["code"]?.stringValue == "ERR_TOKEN_EXPIRED")
        #expect(try client.login("demo", user, token: EventsTests.token).error == nil)
        #expect(try client.logout("demo", user).error == nil)
        #expect(try client.logout("demo", bystander).error == nil)
        let after = Int64(Date().timeIntervalSince1970)

        var got: [JSON] = []
        for _ in 0..<6 { got.append(try filtered.event()) }
        #expect(
            got.map { $0["kind"]?.stringValue ?? "?" } == [
                "logoutSuccess", "loginSuccess", "kickedOffline", "loginFailed", "loginSuccess", "logoutSuccess",
            ], "\(got.map(describeEvent))")
        #expect(got.allSatisfy { $0["provider"]?.stringValue == "demo" && $0["user"]?.stringValue == user })
        #expect(got.allSatisfy { ($0["time"]?.integerValue).map { $0 >= before - 1 && $0 <= after + 1 } ?? false })
        #expect(got[2]["reason"]?.stringValue == "revoked")
        #expect(got[3]["code"]?.stringValue == "ERR_TOKEN_EXPIRED")

        // The unfiltered subscriber also sees the bystander, interleaved in the order of the changes.
        var seen: [String] = []
        for _ in 0..<8 { seen.append(describeEvent(try everything.event())) }
        #expect(
            seen == [
                "logoutSuccess demo/\(user)", "loginSuccess demo/\(bystander)", "loginSuccess demo/\(user)",
                "kickedOffline demo/\(user)", "loginFailed demo/\(user)", "loginSuccess demo/\(user)",
                "logoutSuccess demo/\(user)", "logoutSuccess demo/\(bystander)",
            ])

        let kick = try kicksOnly.event()
        #expect(describeEvent(kick) == "kickedOffline demo/\(user)")
        #expect(kick["reason"]?.stringValue == "revoked")

        // Nothing more is pending on the filtered streams: a marker event of another account is not sent to them.
        #expect(try client.login("other", user, token: EventsTests.token).error == nil)
        #expect(describeEvent(try everything.event()) == "loginSuccess other/\(user)")
        #expect(try client.logout("other", user).error == nil)
        #expect(describeEvent(try everything.event()) == "logoutSuccess other/\(user)")
        for stream in [filtered, everything, kicksOnly] {
            #expect(!stream.rawText.contains(EventsTests.token), "no raw token in any reply")
        }
    }

    @Test(
        "Should clear a session at once on ForceLogout: kickedOffline with reason kicked, NotLoggedIn, no keyring item")
    func forceLogout() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let client = try d.client()
        let user = uniqueName("kick")
        #expect(try client.login("demo", user, token: EventsTests.token).error == nil)
        #expect(try secretToolSearch(provider: "demo", user: user).contains("label ="))
        let stream = try EventStream(d.socketPath)
        try stream.subscribe(provider: "demo", user: user)
        _ = try stream.snapshot()

        let reply = try client.forceLogout("demo", user)
        #expect(reply.error == nil, "\(reply)")
        let event = try stream.event()
        #expect(describeEvent(event) == "kickedOffline demo/\(user)")
        #expect(event["reason"]?.stringValue == "kicked")

        let token = try client.getToken("demo", user)
        #expect(token.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(token.parameters["code"]?.stringValue == "ERR_NOT_LOGGED_IN")
        let session = try client.call(VaultMethod.getSession.rawValue, ["provider": "demo", "user": .string(user)])
        #expect(session.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(try secretToolSearch(provider: "demo", user: user).contains("label =") == false)
        // Gone for good: a restarted daemon does not bring it back.
        d.daemon.stop()
        let again = try RunningDaemon(socketPath: d.socketPath, configPath: d.configPath)
        defer { again.stop() }
        let restarted = try VarlinkClient(path: d.socketPath, timeoutSeconds: 60).getToken("demo", user)
        #expect(restarted.error == "io.vaultd.Vault.NotLoggedIn")
    }

    @Test("Should kick with vaultctl kick and print events with vaultctl watch, as text and as JSON lines")
    func vaultctlKickAndWatch() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let user = uniqueName("watch")
        let other = uniqueName("quiet")

        func startWatch(_ arguments: [String]) throws -> (Process, OutputCollector, OutputCollector) {
            try startInterruptible(Binaries.vaultctl.path, ["--socket", d.socketPath] + arguments)
        }

        // A JSON watcher of the one account, and a text watcher of two kinds of every account.
        let (jsonWatch, jsonOut, jsonErr) = try startWatch(["--json", "watch", "demo", user])
        let (textWatch, textOut, textErr) = try startWatch([
            "watch", "--kind", "kickedOffline", "--kind", "loginSuccess",
        ])
        defer {
            for p in [jsonWatch, textWatch] where p.isRunning { kill(p.processIdentifier, SIGKILL) }
        }
        #expect(jsonOut.wait(for: "{\"sessions\":"), "snapshot line: \(jsonOut.text) \(jsonErr.text)")
        // The text watcher says it is watching once its snapshot arrived.
        #expect(textOut.wait(for: "events follow"), "\(textOut.text) \(textErr.text)")
        #expect(try vaultctl(d.socketPath, ["login", "demo", other], input: EventsTests.token).status == 0)
        #expect(textOut.wait(for: other), "\(textOut.text) \(textErr.text)")

        #expect(try vaultctl(d.socketPath, ["login", "demo", user], input: EventsTests.token).status == 0)
        let kick = try vaultctl(d.socketPath, ["kick", "demo", user, "--reason", "admin"])
        #expect(kick.status == 0, "\(kick.stderr)")
        let status = try vaultctl(d.socketPath, ["status", "demo", user])
        #expect(status.status == 1)
        #expect(status.stderr.contains("ERR_NOT_LOGGED_IN"))
        let again = try vaultctl(d.socketPath, ["kick", "demo", user])
        #expect(again.status == 1)
        #expect(again.stderr.contains("ERR_NOT_LOGGED_IN"), "\(again.stderr)")
        #expect(try vaultctl(d.socketPath, ["logout", "demo", other]).status == 0)

        #expect(jsonOut.wait(for: "kickedOffline"), "\(jsonOut.text) \(jsonErr.text)")
        #expect(textOut.wait(for: "kickedOffline"), "\(textOut.text) \(textErr.text)")
        let rawLines = jsonOut.text.split(separator: "\n", omittingEmptySubsequences: true).map(String.init)
        let lines = rawLines.compactMap { try? JSON.parse($0) }
        #expect(lines.count == rawLines.count, "every line is one JSON object: \(jsonOut.text)")
        #expect(lines.first?["sessions"]?.arrayValue != nil, "the first line is the snapshot: \(jsonOut.text)")
        let events = lines.compactMap { $0["event"] }
        #expect(
            events.map(describeEvent) == ["loginSuccess demo/\(user)", "kickedOffline demo/\(user)"],
            "\(jsonOut.text)")
        #expect(events.last?["reason"]?.stringValue == "admin")
        #expect(!jsonOut.text.contains(other))

        // The text watcher: one line per event of the two kinds, nothing else.
        let textLines = textOut.text.split(separator: "\n").map(String.init)
        let userLines = textLines.filter { $0.contains(user) }
        #expect(userLines.count == 2, "\(textOut.text)")
        #expect(userLines.first?.contains("loginSuccess") == true)
        #expect(userLines.last?.contains("kickedOffline") == true)
        #expect(userLines.last?.contains("admin") == true)
        #expect(textLines.filter { $0.contains(other) }.count == 1, "only the login: \(textOut.text)")
        #expect(!textOut.text.contains("logoutSuccess"))
        #expect(!jsonOut.text.contains(EventsTests.token) && !textOut.text.contains(EventsTests.token))

        // Until interrupted.
        #expect(jsonWatch.isRunning && textWatch.isRunning)
        kill(jsonWatch.processIdentifier, SIGINT)
        kill(textWatch.processIdentifier, SIGINT)
        #expect(jsonOut.waitForEnd(seconds: 10) && textOut.waitForEnd(seconds: 10), "vaultctl watch ends on SIGINT")
        _ = try reap(jsonWatch)
        _ = try reap(textWatch)
    }

    @Test("Should drop a subscriber that does not read with SubscriberTooSlow while another gets every event")
    func slowSubscriberIsDropped() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let prefix = uniqueName("slow") + String(repeating: "x", count: 120)
        // A few real login/logout cycles, then many refused logins (an expired
        // token): each is a loginFailed event of ~300 bytes that touches no
        // keyring, so 6,000 of them pass the 1 MiB queue in a few seconds.
        let cycles = 20
        let refused = 6000

        // Subscribed first, never read until the end.
        let slow = try EventStream(d.socketPath, receiveBuffer: 4096, timeoutSeconds: 10)
        try slow.subscribe(provider: "demo")
        let good = try BackgroundSubscriber(d.socketPath, provider: "demo")

        let client = try d.client()
        let started = Date()
        var failures: [String] = []
        for i in 0..<cycles {
            let user = "\(prefix)-\(i)"
            let login = try client.login("demo", user, token: EventsTests.token)
            let logout = try client.logout("demo", user)
            if login.error != nil || logout.error != nil {
                failures.append("\(i): \(login.error ?? "-") \(logout.error ?? "-")")
                if failures.count > 5 { break }
            }
        }
        let past = Int64(Date().timeIntervalSince1970) - 60
        for i in 0..<refused {
            let login = try client.login("demo", "\(prefix)-f\(i)", token: EventsTests.token, expiresAt: past)
            if login.parameters["code"]?.stringValue != "ERR_TOKEN_EXPIRED" {
                failures.append("f\(i): \(login.error ?? "-")")
                if failures.count > 5 { break }
            }
        }
        let elapsed = Date().timeIntervalSince(started)
        #expect(failures.isEmpty, "\(failures)")
        print("slow-subscriber test: \(cycles) login/logout cycles and \(refused) refused logins in \(elapsed)s")

        let expected =
            (0..<cycles).flatMap { ["loginSuccess demo/\(prefix)-\($0)", "logoutSuccess demo/\(prefix)-\($0)"] }
            + (0..<refused).map { "loginFailed demo/\(prefix)-f\($0)" }
        let received = good.wait(count: expected.count, seconds: 60).map(describeEvent)
        #expect(
            received.count == expected.count,
            "the reading subscriber got \(received.count) of \(expected.count); \(good.end ?? "")")
        #expect(received == expected, "in the order of the changes")
        good.close()

        // The slow one: snapshot, a prefix of the events, then SubscriberTooSlow, then EOF.
        var replies: [VarlinkReply] = []
        var end: EventStream.ReadEnd?
        for _ in 0..<(expected.count + 10) {
            do { replies.append(try slow.receive()) } catch let e as EventStream.ReadEnd {
                end = e
                break
            }
        }
        let dropLog = d.daemon.output.text.split(separator: "\n").filter {
            $0.contains("subscriber") && !$0.contains("audit")
        }.prefix(3)
        #expect(
            end == .closed,
            "the slow subscriber was disconnected (got \(replies.count) replies, then \(String(describing: end)))")
        #expect(!slow.hasPartialMessage, "the stream ends on a message boundary, not inside an event")
        let last = replies.last
        #expect(
            last?.error == "io.vaultd.Vault.SubscriberTooSlow",
            "the final reply: \(String(describing: last)); vaultd said: \(dropLog)")
        #expect(last?.parameters["code"]?.stringValue?.isEmpty == false)
        let slowEvents = replies.dropFirst().compactMap { $0.parameters["event"] }.map(describeEvent)
        #expect(slowEvents.count < expected.count, "dropped before the end")
        #expect(Array(expected.prefix(slowEvents.count)) == slowEvents, "what it got is in order, without gaps")
        #expect(!slow.rawText.contains(EventsTests.token))
    }

    @Test("Should deliver one kick to 1,000 subscribers")
    func thousandSubscribers() throws {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < 4096 {
            limit.rlim_cur = min(4096, limit.rlim_max)
            setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        }
        // The daemon inherits the raised limit.
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let client = try d.client()
        let user = uniqueName("many")
        #expect(try client.login("demo", user, token: EventsTests.token).error == nil)

        let count = 1000
        var streams: [EventStream] = []
        for i in 0..<count {
            let stream = try EventStream(d.socketPath, timeoutSeconds: 20)
            // Half filtered to the account, half unfiltered.
            if i % 2 == 0 { try stream.subscribe(provider: "demo", user: user) } else { try stream.subscribe() }
            streams.append(stream)
        }
        var snapshotsWithSession = 0
        for stream in streams {
            let sessions = try stream.snapshot()
            if sessions.contains(where: { $0["user"]?.stringValue == user }) { snapshotsWithSession += 1 }
        }
        #expect(snapshotsWithSession == count)

        #expect(try client.forceLogout("demo", user, reason: "admin").error == nil)
        var kicked = 0
        var problems: [String] = []
        for (i, stream) in streams.enumerated() {
            do {
                let event = try stream.event()
                if describeEvent(event) == "kickedOffline demo/\(user)" && event["reason"]?.stringValue == "admin" {
                    kicked += 1
                } else {
                    problems.append("\(i): \(event)")
                }
            } catch {
                problems.append("\(i): \(error)")
                // One subscriber timing out means the rest would too; stop waiting.
                if error as? EventStream.ReadEnd == .timedOut { break }
            }
            if problems.count > 5 { break }
        }
        #expect(kicked == count, "\(problems)")
        #expect(try client.getToken("demo", user).error == "io.vaultd.Vault.NotLoggedIn")
    }
}
