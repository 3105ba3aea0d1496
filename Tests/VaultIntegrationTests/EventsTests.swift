import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// A `Subscribe` stream of the client library on a connection of its own,
/// recording every message vaultd sent on it, for "no raw token" checks.
final class RecordedStream {
    let stream: VaultEventStream
    private let recorder: MessageRecorder

    /// Connects to `path` (reads bounded by `timeoutSeconds`), shrinks the
    /// socket's receive buffer to `receiveBuffer` bytes if given, subscribes
    /// with the filters, and reads the snapshot.
    init(
        _ path: String, provider: String? = nil, user: String? = nil, kinds: [EventKind] = [],
        receiveBuffer: Int32? = nil, timeoutSeconds: Int = 10
    ) throws {
        let client = try VarlinkClient(path: path, timeoutSeconds: timeoutSeconds)
        if var size = receiveBuffer {
            setsockopt(client.fileDescriptor, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        let recorder = MessageRecorder()
        client.messageObserver = { recorder.append($0) }
        self.recorder = recorder
        stream = try VaultEventStream(client, provider: provider, user: user, kinds: kinds)
    }

    /// The sessions of the snapshot.
    var snapshot: [VaultClient.Session] { stream.snapshot }

    /// The next event; fails the read when the stream ended instead.
    func event() throws -> VaultEvent {
        guard let event = try stream.next() else {
            throw HarnessError("the stream ended instead of sending an event: \(String(describing: stream.end))")
        }
        return event
    }

    /// Every message received so far, as text.
    var rawText: String { recorder.text }
}

/// Collects the messages a client received (from the thread that reads them).
final class MessageRecorder: @unchecked Sendable {
    private let lock = NSLock()
    private var messages: [String] = []

    func append(_ message: ArraySlice<UInt8>) {
        let text = String(decoding: message, as: UTF8.self)
        lock.withLock { messages.append(text) }
    }

    var text: String { lock.withLock { messages.joined(separator: "\n") } }
}

/// Reads a Subscribe stream on a thread of its own, so the subscriber keeps
/// up however fast the events come, and lets a test wait for a count.
final class BackgroundSubscriber: @unchecked Sendable {
    private let stream: VaultEventStream
    private let condition = NSCondition()
    private var collected: [VaultEvent] = []
    private var ended: String?

    /// Subscribes and reads the snapshot here, then reads events in the background.
    init(_ path: String, provider: String? = nil, user: String? = nil, kinds: [EventKind] = []) throws {
        stream = try VaultEventStream(
            try VarlinkClient(path: path, timeoutSeconds: 120), provider: provider, user: user, kinds: kinds)
        Thread.detachNewThread { [self] in
            while true {
                let event: VaultEvent?
                do { event = try stream.next() } catch {
                    finish("\(error)")
                    return
                }
                guard let event else {
                    finish("ended: \(String(describing: stream.end))")
                    return
                }
                condition.lock()
                collected.append(event)
                condition.broadcast()
                condition.unlock()
            }
        }
    }

    private func finish(_ why: String) {
        condition.lock()
        ended = why
        condition.broadcast()
        condition.unlock()
    }

    var events: [VaultEvent] {
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
    func wait(count: Int, seconds: Double = 20) -> [VaultEvent] {
        let deadline = Date().addingTimeInterval(seconds)
        condition.lock()
        defer { condition.unlock() }
        while collected.count < count && ended == nil {
            if !condition.wait(until: deadline) { break }
        }
        return collected
    }

    /// Stops the reader thread by shutting the connection down.
    func close() { shutdown(stream.raw.fileDescriptor, Int32(SHUT_RDWR)) }

    deinit { shutdown(stream.raw.fileDescriptor, Int32(SHUT_RDWR)) }
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

    /// A typed connection of the client library.
    func connection() throws -> VaultConnection { try VaultConnection(path: socketPath, timeoutSeconds: 60) }

    /// A reader of what this daemon's store holds.
    var store: StoreReader { StoreReader(socketPath: socketPath) }

    deinit { daemon.stop() }
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
func describeEvent(_ event: VaultEvent) -> String {
    "\(event.kind.rawValue) \(event.account.provider)/\(event.account.user)"
}

/// The same description of an event as vaultctl's JSON output prints it.
func describeEvent(_ event: JSON) -> String {
    "\(event["kind"]?.stringValue ?? "?") \(event["provider"]?.stringValue ?? "?")/\(event["user"]?.stringValue ?? "?")"
}

/// The error a typed call threw, if it was a vaultd error reply.
func replyError(_ call: () throws -> some Any) -> VaultClientError? {
    do {
        _ = try call()
        return nil
    } catch let error as VaultClientError {
        return error
    } catch {
        return .unexpectedReply(method: "?", detail: "\(error)")
    }
}

/// Subscribe, the events it streams, ForceLogout and `vaultctl watch`/`kick`,
/// against the real daemon and keyring.
@Suite("Events and forced logout", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct EventsTests {
    static let token = "tok_events_4k2m9q7w1e5r4t6y0u8i"
    static let config = "[Provider demo]\nType=static\n\n[Provider other]\nType=static\n"

    @Test("Should send a snapshot, then the events of a login, a failed login, a kick and a logout in order")
    func snapshotThenEventsInOrder() throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let vault = try d.connection()
        let user = uniqueName("ev")
        let bystander = uniqueName("by")
        try vault.login(provider: "demo", user: user, token: EventsTests.token)

        let filtered = try RecordedStream(d.socketPath, provider: "demo", user: user)
        let sessions = filtered.snapshot
        #expect(sessions.count == 1, "only the filtered account: \(sessions)")
        #expect(sessions.first?.account.user == user)
        #expect(sessions.first?.state == .logged)
        #expect(sessions.first?.maskedToken == Secret.mask(EventsTests.token))

        let everything = try RecordedStream(d.socketPath)
        #expect(everything.snapshot.contains { $0.account.user == user })

        let kicksOnly = try RecordedStream(d.socketPath, provider: "demo", user: user, kinds: [.kickedOffline])

        let before = Int64(Date().timeIntervalSince1970)
        try vault.logout(provider: "demo", user: user)
        try vault.login(provider: "demo", user: bystander, token: EventsTests.token)
        try vault.login(provider: "demo", user: user, token: EventsTests.token)
        try vault.forceLogout(provider: "demo", user: user, reason: "revoked")
        let expired = replyError {
            try vault.login(
                provider: "demo", user: user, token: EventsTests.token, expiresAt: UnixTime(seconds: before - 60))
        }
        #expect(expired?.code == "ERR_TOKEN_EXPIRED")
        try vault.login(provider: "demo", user: user, token: EventsTests.token)
        try vault.logout(provider: "demo", user: user)
        try vault.logout(provider: "demo", user: bystander)
        let after = Int64(Date().timeIntervalSince1970)

        var got: [VaultEvent] = []
        for _ in 0..<6 { got.append(try filtered.event()) }
        #expect(
            got.map(\.kind) == [
                .logoutSuccess, .loginSuccess, .kickedOffline, .loginFailed, .loginSuccess, .logoutSuccess,
            ],
            "\(got.map(describeEvent))")
        #expect(got.allSatisfy { $0.account == Account(provider: "demo", user: user) })
        #expect(got.allSatisfy { $0.time.seconds >= before - 1 && $0.time.seconds <= after + 1 })
        #expect(got[2].reason == "revoked")
        #expect(got[3].code == "ERR_TOKEN_EXPIRED")

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
        #expect(kick.reason == "revoked")

        // Nothing more is pending on the filtered streams: a marker event of another account is not sent to them.
        try vault.login(provider: "other", user: user, token: EventsTests.token)
        #expect(describeEvent(try everything.event()) == "loginSuccess other/\(user)")
        try vault.logout(provider: "other", user: user)
        #expect(describeEvent(try everything.event()) == "logoutSuccess other/\(user)")
        for stream in [filtered, everything, kicksOnly] {
            #expect(stream.rawText.contains("kickedOffline"), "the recorder saw the stream")
            #expect(!stream.rawText.contains(EventsTests.token), "no raw token in any reply")
        }
    }

    @Test(
        "Should clear a session at once on ForceLogout: kickedOffline with reason kicked, NotLoggedIn, nothing stored")
    func forceLogout() async throws {
        let d = try ConfiguredDaemon(config: EventsTests.config)
        let vault = try d.connection()
        let user = uniqueName("kick")
        try vault.login(provider: "demo", user: user, token: EventsTests.token)
        #expect(try await d.store.holds(provider: "demo", user: user))
        let stream = try RecordedStream(d.socketPath, provider: "demo", user: user)

        try vault.forceLogout(provider: "demo", user: user)
        let event = try stream.event()
        #expect(describeEvent(event) == "kickedOffline demo/\(user)")
        #expect(event.reason == "kicked")

        let token = replyError { try vault.token(provider: "demo", user: user) }
        #expect(token?.varlinkName == "io.vaultd.Vault.NotLoggedIn")
        #expect(token?.code == "ERR_NOT_LOGGED_IN")
        let session = replyError { try vault.session(provider: "demo", user: user) }
        #expect(session?.varlinkName == "io.vaultd.Vault.NotLoggedIn")
        #expect(try await d.store.holds(provider: "demo", user: user) == false)
        // Gone for good: a restarted daemon does not bring it back.
        d.daemon.stop()
        let again = try RunningDaemon(socketPath: d.socketPath, configPath: d.configPath)
        defer { again.stop() }
        let restarted = replyError { try d.connection().token(provider: "demo", user: user) }
        #expect(restarted?.varlinkName == "io.vaultd.Vault.NotLoggedIn")
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
        try expectSuccess(vaultctl(d.socketPath, ["kick", "demo", user, "--reason", "admin"]))
        try expectFailure(vaultctl(d.socketPath, ["status", "demo", user]), saying: "ERR_NOT_LOGGED_IN")
        try expectFailure(vaultctl(d.socketPath, ["kick", "demo", user]), saying: "ERR_NOT_LOGGED_IN")
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
        let slow = try RecordedStream(d.socketPath, provider: "demo", receiveBuffer: 4096, timeoutSeconds: 10)
        let good = try BackgroundSubscriber(d.socketPath, provider: "demo")

        let vault = try d.connection()
        let started = Date()
        var failures: [String] = []
        for i in 0..<cycles {
            let user = "\(prefix)-\(i)"
            let login = replyError { try vault.login(provider: "demo", user: user, token: EventsTests.token) }
            let logout = replyError { try vault.logout(provider: "demo", user: user) }
            if login != nil || logout != nil {
                failures.append("\(i): \(String(describing: login)) \(String(describing: logout))")
                if failures.count > 5 { break }
            }
        }
        let past = UnixTime(seconds: Int64(Date().timeIntervalSince1970) - 60)
        for i in 0..<refused {
            let login = replyError {
                try vault.login(provider: "demo", user: "\(prefix)-f\(i)", token: EventsTests.token, expiresAt: past)
            }
            if login?.code != "ERR_TOKEN_EXPIRED" {
                failures.append("f\(i): \(String(describing: login))")
                if failures.count > 5 { break }
            }
        }
        let elapsed = Date().timeIntervalSince(started)
        #expect(failures.isEmpty, "\(failures)")
        print("slow-subscriber test: \(cycles) login/logout cycles and \(refused) refused logins in \(elapsed)s")

        let expected =
            (0..<cycles).flatMap { ["loginSuccess demo/\(prefix)-\($0)", "logoutSuccess demo/\(prefix)-\($0)"] }
            + (0..<refused).map { "loginFailed demo/\(prefix)-f\($0)" }

        // The slow one first, as soon as the changes are made (vaultd keeps a
        // dropped subscriber's final error for a bounded time): snapshot, a
        // prefix of the events, then SubscriberTooSlow, then EOF.
        var slowEvents: [String] = []
        for _ in 0..<(expected.count + 10) {
            guard let event = try slow.stream.next() else { break }
            slowEvents.append(describeEvent(event))
        }
        let dropLog = d.daemon.output.text.split(separator: "\n").filter {
            $0.contains("subscriber") && !$0.contains("audit")
        }.prefix(3)
        if case .error(let last) = slow.stream.end {
            #expect(
                last.name == "io.vaultd.Vault.SubscriberTooSlow", "the final reply: \(last); vaultd said: \(dropLog)")
            #expect(last.code?.isEmpty == false)
            // After the error, the connection closes, on a message boundary (a cut message is an error here).
            #expect(try slow.stream.raw.nextReply() == nil, "the slow subscriber was disconnected")
        } else {
            Issue.record(
                "the stream ended with \(String(describing: slow.stream.end)), not an error; vaultd said: \(dropLog)")
        }
        #expect(slowEvents.count < expected.count, "dropped before the end")
        #expect(Array(expected.prefix(slowEvents.count)) == slowEvents, "what it got is in order, without gaps")
        #expect(!slow.rawText.contains(EventsTests.token))

        // The reading one got every event.
        let received = good.wait(count: expected.count, seconds: 60).map(describeEvent)
        #expect(
            received.count == expected.count,
            "the reading subscriber got \(received.count) of \(expected.count); \(good.end ?? "")")
        #expect(received == expected, "in the order of the changes")
        good.close()
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
        let vault = try d.connection()
        let user = uniqueName("many")
        try vault.login(provider: "demo", user: user, token: EventsTests.token)

        let count = 1000
        var streams: [RecordedStream] = []
        for i in 0..<count {
            // Half filtered to the account, half unfiltered.
            streams.append(
                i % 2 == 0
                    ? try RecordedStream(d.socketPath, provider: "demo", user: user, timeoutSeconds: 20)
                    : try RecordedStream(d.socketPath, timeoutSeconds: 20))
        }
        let snapshotsWithSession = streams.filter { $0.snapshot.contains { $0.account.user == user } }.count
        #expect(snapshotsWithSession == count)

        try vault.forceLogout(provider: "demo", user: user, reason: "admin")
        var kicked = 0
        var problems: [String] = []
        for (i, stream) in streams.enumerated() {
            do {
                let event = try stream.event()
                if describeEvent(event) == "kickedOffline demo/\(user)" && event.reason == "admin" {
                    kicked += 1
                } else {
                    problems.append("\(i): \(event)")
                }
            } catch {
                problems.append("\(i): \(error)")
                // One subscriber timing out means the rest would too; stop waiting.
                if case .client(.timedOut) = error as? VaultClientError { break }
            }
            if problems.count > 5 { break }
        }
        #expect(kicked == count, "\(problems)")
        #expect(
            replyError { try vault.token(provider: "demo", user: user) }?.varlinkName == "io.vaultd.Vault.NotLoggedIn")
    }
}
