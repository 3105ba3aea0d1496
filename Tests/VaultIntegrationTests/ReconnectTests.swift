import Foundation
import Glibc
import Synchronization
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultSystem

/// Clients that outlive a restart of vaultd: `vaultctl watch` and the Swift
/// client's reconnecting subscriptions, against a real vaultd stopped and
/// started again on the same socket and store.
@Suite("Reconnecting clients", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ReconnectTests {
    /// Logs `user` in at `demo` through vaultctl.
    func login(_ fixture: DaemonFixture, _ user: String) throws {
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "demo", user], input: EventsTests.token))
    }

    @Test(
        "Should keep watch running across a restart of vaultd: the lost and back lines, a catch-up, then new events",
        arguments: [SIGTERM, SIGKILL])
    func watchOutlivesARestart(signal: Int32) throws {
        let fixture = try DaemonFixture()
        let before = uniqueName("before")
        try login(fixture, before)
        let (watch, out, err) = try startInterruptible(
            Binaries.vaultctl.path, ["--socket", fixture.socketPath, "watch"])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(out.wait(for: "events follow"), "\(err.text)")

        fixture.daemon?.stop(signal: signal)
        #expect(err.wait(for: "; reconnecting"), "\(err.text)")
        // A sentence: why, and vaultd's code when it said one (it does as it stops).
        let lost =
            signal == SIGTERM
            ? #/^vaultctl: lost the connection to vaultd: [a-z][^()]+ \(ERR_[A-Z_]+\); reconnecting$/#
            : #/^vaultctl: lost the connection to vaultd: [a-z].+; reconnecting$/#
        #expect(err.text.split(separator: "\n").contains { $0.wholeMatch(of: lost) != nil }, "\(err.text)")
        #expect(watch.isRunning, "watch ended when vaultd went away:\n\(err.text)")

        try fixture.start()
        #expect(err.wait(for: "vaultctl: connected to vaultd again"), "\(err.text)")
        #expect(out.wait(for: "caught up: 1 session now; events follow"), "\(out.text)\n\(err.text)")
        // Each line of the catch-up is a write of its own: wait for the session's.
        #expect(out.wait(for: "\(before) @ demo  state="), "\(out.text)")
        // The catch-up names the session that outlived the restart, with its state.
        let session = #/^[0-9-]+ [0-9:]+ UTC  session +(?<user>\S+) @ demo  state=logged/#
        #expect(
            out.text.split(separator: "\n").contains { $0.prefixMatch(of: session)?.output.user == before[...] },
            "\(out.text)")

        let after = uniqueName("after")
        try login(fixture, after)
        #expect(out.wait(for: "\(after) @ demo"), "no event after the restart:\n\(out.text)\n\(err.text)")
        let lines = out.text.split(separator: "\n")
        let caughtUp = try #require(lines.firstIndex { $0.hasPrefix("caught up:") })
        let event = try #require(lines.firstIndex { $0.contains("loginSuccess") && $0.contains(after) }, "\(out.text)")
        #expect(caughtUp < event, "\(out.text)")
        #expect(watch.isRunning)
        kill(watch.processIdentifier, SIGINT)
        _ = try reap(watch)
    }

    @Test("Should catch up in JSON after a restart, naming a session that ended while vaultd was away as gone")
    func watchJSONCatchUp() throws {
        let fixture = try DaemonFixture()
        let stays = uniqueName("stays")
        let leaves = uniqueName("leaves")
        try login(fixture, stays)
        try login(fixture, leaves)
        let (watch, out, err) = try startInterruptible(
            Binaries.vaultctl.path, ["--socket", fixture.socketPath, "--json", "watch", "--kind", "loginSuccess"])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(out.wait(for: "{\"sessions\":"), "\(err.text)")
        // Logged out while watch is not looking (--kind leaves the event out), then vaultd restarts.
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", leaves]).status == 0)
        fixture.daemon?.stop()
        #expect(err.wait(for: "; reconnecting"), "\(err.text)")
        try fixture.start()
        // The whole line: it ends with the last array and the two objects around it.
        #expect(out.wait(for: "]}}\n"), "\(out.text)\n\(err.text)")
        let line = try #require(out.text.split(separator: "\n").first { $0.hasPrefix("{\"reconnected\":") })
        let caughtUp = try #require(try JSON.parse(String(line))["reconnected"])
        let users = (caughtUp["sessions"]?.arrayValue ?? []).compactMap { $0["user"]?.stringValue }
        #expect(users.contains(stays) && !users.contains(leaves), "\(line)")
        let gone = (caughtUp["gone"]?.arrayValue ?? []).compactMap { $0["user"]?.stringValue }
        #expect(gone == [leaves], "\(line)")
        kill(watch.processIdentifier, SIGINT)
        _ = try reap(watch)
    }

    @Test("Should end watch --no-reconnect with status 3 when vaultd is killed")
    func watchNoReconnect() throws {
        let fixture = try DaemonFixture()
        let (watch, out, err) = try startInterruptible(
            Binaries.vaultctl.path, ["--socket", fixture.socketPath, "watch", "--no-reconnect"])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(out.wait(for: "events follow"), "\(err.text)")
        fixture.daemon?.stop(signal: SIGKILL)
        #expect(err.waitForEnd(seconds: 20))
        #expect(try reap(watch) == 3, "\(err.text)")
        #expect(!err.text.contains("reconnecting"), "\(err.text)")
    }

    @Test(
        "Should resubscribe a Swift client stream with a reconnect policy across a restart and deliver the events after",
        arguments: [SIGTERM, SIGKILL])
    func swiftClientResubscribes(signal: Int32) throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("swift-back")
        let vault = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60)
        let stream = try vault.subscribe(
            provider: "demo", reconnect: ReconnectPolicy(firstDelaySeconds: 0.1, maxDelaySeconds: 1, maxAttempts: 200))
        var lost: [String] = []
        var snapshots: [[VaultClient.Session]] = []
        var startError: (any Error)?
        stream.onDisconnect = { why in
            // vaultd is gone: start it again before the first attempt is due.
            lost.append(why)
            do { try fixture.start() } catch { startError = error }
        }
        stream.onReconnect = { sessions in
            // Subscribed again: a login now can reach the stream only as an event.
            snapshots.append(sessions)
            do {
                try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60).login(
                    provider: "demo", user: user, token: EventsTests.token)
            } catch { startError = error }
        }

        fixture.daemon?.stop(signal: signal)
        let event = try stream.next()
        #expect(startError == nil, "\(String(describing: startError))")
        #expect(lost.count == 1, "\(lost)")
        if signal == SIGTERM { #expect(lost.first?.contains("ERR_INTERNAL") == true, "\(lost)") }
        #expect(snapshots.count == 1 && !(snapshots.first?.contains { $0.account.user == user } ?? true))
        #expect(event?.kind == .loginSuccess && event?.account == Account(provider: "demo", user: user))
        #expect(stream.reconnections == 1 && stream.end == nil)
    }

    @Test("Should bound a resubscription by the connection's timeout when the socket accepts and never answers")
    func resubscriptionIsBounded() throws {
        let fixture = try DaemonFixture()
        let stream = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 1).subscribe(
            provider: "demo", reconnect: ReconnectPolicy(firstDelaySeconds: 0.1, maxDelaySeconds: 0.2, maxAttempts: 2))
        // The reader waits for events without limit; the subscription must not.
        stream.setReceiveTimeout(seconds: 0)
        let silent = Mutex<Int32>(-1)
        var bindError: (any Error)?
        stream.onDisconnect = { _ in
            // In vaultd's place: a socket whose backlog completes connects and that never answers.
            unlink(fixture.socketPath)
            do { try silent.withLock { $0 = try Self.silentListener(at: fixture.socketPath) } } catch {
                bindError = error
            }
        }
        fixture.daemon?.stop(signal: SIGKILL)
        let done = DispatchSemaphore(value: 0)
        let outcome = Mutex<Result<VaultEvent?, VaultClientError>?>(nil)
        let handedOver = StreamHandover(stream)
        let reader = Thread {
            let result = Result { () throws(VaultClientError) in try handedOver.stream.next() }
            outcome.withLock { $0 = result }
            done.signal()
        }
        reader.start()
        let finished = done.wait(timeout: .now() + 30) == .success
        // Unblocks a reader stuck on the silent socket, so the thread ends either way.
        silent.withLock { fd in if fd >= 0 { close(fd) } }
        #expect(bindError == nil, "\(String(describing: bindError))")
        #expect(finished, "next() still waiting on a socket that never answers")
        if finished {
            let result = try #require(outcome.withLock { $0 })
            #expect((try? result.get()) == .some(nil), "\(result)")
            #expect(stream.reconnections == 0)
        } else {
            _ = done.wait(timeout: .now() + 30)
        }
    }

    /// A Unix socket listening at `path` that nobody accepts from.
    static func silentListener(at path: String) throws -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: errno \(errno)") }
        do {
            try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
                guard bind(fd, address, length) == 0 else { throw SystemError("bind") }
            }
        } catch {
            close(fd)
            throw HarnessError("bind \(path): \(error)")
        }
        guard listen(fd, 16) == 0 else {
            close(fd)
            throw HarnessError("listen \(path): errno \(errno)")
        }
        return fd
    }

    @Test("Should end a Swift client stream without a reconnect policy when vaultd is killed")
    func swiftClientWithoutPolicyEnds() throws {
        let fixture = try DaemonFixture()
        let stream = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60).subscribe(provider: "demo")
        fixture.daemon?.stop(signal: SIGKILL)
        #expect(try stream.next() == nil)
        #expect(stream.end == .closed && stream.reconnections == 0)
    }
}

/// A stream handed to the one thread that reads it while the test waits:
/// the test touches it again only after that thread is done.
private final class StreamHandover: @unchecked Sendable {
    let stream: VaultEventStream
    init(_ stream: VaultEventStream) { self.stream = stream }
}
