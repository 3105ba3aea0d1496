import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// The Swift client library: typed calls and the event stream against a real
/// vaultd, and the ends of a stream against a scripted server.
@Suite("Client library", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ClientLibraryTests {
    let fixture: DaemonFixture

    init() throws { fixture = try DaemonFixture() }

    func connect() throws -> VaultConnection { try VaultConnection(path: fixture.socketPath, timeoutSeconds: 30) }

    var now: Int64 { Int64(Date().timeIntervalSince1970) }

    @Test("Should log in, show the session, hand out the token and log out through typed calls")
    func typedLifecycle() throws {
        let vault = try connect()
        let user = uniqueName("typed")
        let expiresAt = UnixTime(seconds: now + 3600)
        let first = try vault.login(provider: "demo", user: user, token: DaemonTests.token, expiresAt: expiresAt)
        #expect(first.created)
        #expect(first.session.account == Account(provider: "demo", user: user))
        #expect(first.session.state == .logged)
        #expect(first.session.expiresAt == expiresAt)
        #expect(first.session.ownerUID == getuid())
        #expect(first.session.maskedToken != nil && first.session.maskedToken != DaemonTests.token)
        #expect(try vault.login(provider: "demo", user: user, token: DaemonTests.token).created == false)

        let session = try vault.session(provider: "demo", user: user)
        #expect(session.state == .logged && session.expiresAt == expiresAt && !session.hasRefreshToken)
        #expect(session.json["user"]?.stringValue == user, "the object as vaultd sent it")

        let token = try vault.token(provider: "demo", user: user, minValidSeconds: 60)
        #expect(token.value.revealed == DaemonTests.token)
        #expect(token.expiresAt == expiresAt && token.ownerUID == getuid())
        #expect(!"\(token)".contains(DaemonTests.token), "a printed Token is masked")

        let tooShort = #expect(throws: VaultClientError.self) {
            try vault.token(provider: "demo", user: user, minValidSeconds: 7200)
        }
        #expect(tooShort?.vaultCode == .tokenExpired)
        #expect(tooShort?.varlinkName == "io.vaultd.Vault.TokenExpired")
        #expect(tooShort?.code == "ERR_TOKEN_EXPIRED")

        try vault.logout(provider: "demo", user: user)
        let gone = #expect(throws: VaultClientError.self) { try vault.session(provider: "demo", user: user) }
        #expect(gone?.vaultCode == .notLoggedIn)
        #expect(gone?.code == "ERR_NOT_LOGGED_IN")
        #expect(gone?.message.contains(user) == true, "\(String(describing: gone))")
    }

    @Test("Should log in with a token response and name the owner's session with ownerUid")
    func tokenResponseAndOwner() throws {
        let vault = try connect()
        let user = uniqueName("response")
        let response: JSON = ["access_token": .string(DaemonTests.token), "expires_in": 3600, "token_type": "Bearer"]
        let login = try vault.login(provider: "demo", user: user, tokenResponse: response, ownerUID: getuid())
        #expect(login.created && login.session.tokenType == "Bearer")
        #expect(try vault.session(provider: "demo", user: user, ownerUID: getuid()).tokenType == "Bearer")
        try vault.forceLogout(provider: "demo", user: user, reason: "admin", ownerUID: getuid())
        #expect(throws: VaultClientError.self) { try vault.token(provider: "demo", user: user) }
    }

    @Test("Should follow ListSessions' pages to the last")
    func listFollowsPages() throws {
        let vault = try connect()
        let users = (0..<5).map { uniqueName("page\($0)") }.sorted()
        for user in users { try vault.login(provider: "demo", user: user, token: DaemonTests.token) }
        let page = try vault.sessionsPage(limit: 2)
        #expect(page.sessions.count == 2 && page.next != nil)
        let all = try vault.sessions(pageSize: 2).map(\.account.user).filter { users.contains($0) }
        #expect(all == users)
        for user in users { try vault.logout(provider: "demo", user: user) }
    }

    @Test("Should carry the error name, seed code and message of a refusal")
    func refusals() throws {
        let vault = try connect()
        let unknown = #expect(throws: VaultClientError.self) {
            try vault.login(provider: "nope", user: "u", token: DaemonTests.token)
        }
        #expect(unknown?.vaultCode == .unknownProvider)
        #expect(unknown?.code == "ERR_PROVIDER_NOT_FOUND")
        #expect(unknown?.message.isEmpty == false)
        let notOAuth = #expect(throws: VaultClientError.self) {
            try vault.setProviderSecret(provider: "demo", secret: Secret("s3cret"))
        }
        #expect(notOAuth?.code != nil, "\(String(describing: notOAuth))")
        let notLoggedIn = #expect(throws: VaultClientError.self) {
            try vault.refresh(provider: "demo", user: uniqueName("nobody"))
        }
        #expect(notLoggedIn?.vaultCode == .notLoggedIn)
    }

    @Test("Should stream the snapshot, then typed events, and end when vaultd goes away")
    func eventStream() throws {
        let vault = try connect()
        let user = uniqueName("stream")
        try vault.login(provider: "demo", user: "\(user)-before", token: DaemonTests.token)
        let all = try vault.subscribe(provider: "demo")
        #expect(all.snapshot.contains { $0.account.user == "\(user)-before" })
        let stream = try vault.subscribe(provider: "demo", user: user, kinds: [.loginSuccess, .kickedOffline])
        #expect(stream.snapshot.isEmpty)

        try vault.login(provider: "demo", user: user, token: DaemonTests.token)
        try vault.forceLogout(provider: "demo", user: user, reason: "revoked")
        let login = try #require(try stream.next())
        #expect(login.kind == .loginSuccess && login.account == Account(provider: "demo", user: user))
        #expect(login.ownerUID == getuid() && login.time.seconds >= now - 60)
        let kicked = try #require(try stream.next())
        #expect(kicked.kind == .kickedOffline && kicked.reason == "revoked")
        #expect(stream.end == nil)

        try vault.logout(provider: "demo", user: "\(user)-before")
        fixture.daemon?.stop()
        var events: [VaultEvent] = []
        while let event = try all.next() { events.append(event) }
        #expect(events.map(\.kind).contains(.logoutSuccess))
        #expect(all.end != nil, "the stream ended")
        #expect(try all.next() == nil, "and stays ended")
        #expect(try stream.next() == nil)
    }

    @Test("Should end a stream with the SubscriberTooSlow error that dropped it, skipping unknown event kinds")
    func droppedSubscriber() throws {
        let dir = try TemporaryDirectory()
        let event = VaultEvent(
            kind: .tokenRefreshed, account: Account(provider: "p", user: "u"), ownerUID: 7,
            time: UnixTime(seconds: 100), expiresAt: UnixTime(seconds: 200))
        let tooSlow = VaultError(.subscriberTooSlow, "read events as they come").varlinkReply
        let server = try ScriptedServer(
            path: dir.path("fake.sock"),
            replies: [
                VarlinkReply(parameters: ["sessions": []], continues: true),
                VarlinkReply(parameters: ["event": ["kind": "fromTheFuture"]], continues: true),
                VarlinkReply(parameters: ["event": event.json()], continues: true),
                tooSlow,
            ])
        let stream = try VaultEventStream(VarlinkClient(path: server.path, timeoutSeconds: 10))
        #expect(stream.snapshot.isEmpty)
        #expect(try stream.next() == event)
        #expect(try stream.next() == nil)
        guard case .error(let reply) = stream.end else {
            Issue.record("ended with \(String(describing: stream.end))")
            return
        }
        #expect(reply.vaultCode == .subscriberTooSlow)
        #expect(reply.name == "io.vaultd.Vault.SubscriberTooSlow" && reply.code == "ERR_SUBSCRIBER_TOO_SLOW")
        #expect(reply.message == "read events as they come")
    }

    @Test("Should end a stream as closed when the server closes it between messages")
    func closedStream() throws {
        let dir = try TemporaryDirectory()
        let server = try ScriptedServer(
            path: dir.path("fake.sock"), replies: [VarlinkReply(parameters: ["sessions": []], continues: true)])
        let stream = try VaultEventStream(VarlinkClient(path: server.path, timeoutSeconds: 10))
        #expect(try stream.next() == nil)
        #expect(stream.end == .closed)
    }

    @Test("Should time out a call vaultd does not answer, and a connect it does not accept")
    func timeouts() throws {
        let dir = try TemporaryDirectory()
        let silent = try ScriptedServer(path: dir.path("silent.sock"), replies: [], holdSeconds: 5)
        let vault = try VaultConnection(path: silent.path, timeoutSeconds: 1)
        let started = Date()
        let error = #expect(throws: VaultClientError.self) { try vault.session(provider: "demo", user: "u") }
        #expect(error == .client(.timedOut(path: silent.path, waiting: "a reply")))
        #expect(Date().timeIntervalSince(started) < 4)
        // Replies carry no call id: after a timed-out call the connection is not
        // used again, so a late reply can never answer the next call.
        let again = #expect(throws: VaultClientError.self) { try vault.session(provider: "demo", user: "v") }
        #expect(
            "\(String(describing: again))".contains("an earlier call on this connection"),
            "\(String(describing: again))")

        // A listener that never accepts: its backlog fills, then connect waits.
        let path = dir.path("full.sock")
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        defer { close(listener) }
        try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
            guard bind(listener, address, length) == 0, listen(listener, 0) == 0 else { throw SystemError("bind") }
        }
        var queued: [VarlinkClient] = []
        var outcome: ClientError?
        for _ in 0..<8 {
            do { queued.append(try VarlinkClient(path: path, connectTimeoutSeconds: 1)) } catch {
                outcome = error
                break
            }
        }
        #expect(outcome == .timedOut(path: path, waiting: "connect: vaultd accepts no connections"), "\(queued.count)")
    }
}

/// A Varlink server for one connection that answers whatever comes with
/// `replies`, waits `holdSeconds`, then closes: stream ends vaultd produces
/// only under load, on demand.
final class ScriptedServer {
    let path: String

    init(path: String, replies: [VarlinkReply], holdSeconds: Double = 0) throws {
        self.path = path
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard listener >= 0 else { throw SystemError("socket") }
        do {
            try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
                guard bind(listener, address, length) == 0, listen(listener, 4) == 0 else { throw SystemError("bind") }
            }
        } catch {
            close(listener)
            throw error
        }
        var output: [UInt8] = []
        for reply in replies {
            reply.encode(into: &output)
            output.append(0)
        }
        let bytes = output
        Thread.detachNewThread {
            // Every test connects once; the listener goes with that connection.
            let fd = accept(listener, nil, nil)
            close(listener)
            guard fd >= 0 else { return }
            var call = [UInt8](repeating: 0, count: 4096)
            _ = recv(fd, &call, call.count, 0)
            bytes.withUnsafeBytes { _ = try? UnixSocket.sendAll(fd, $0) }
            if holdSeconds > 0 { Thread.sleep(forTimeInterval: holdSeconds) }
            close(fd)
        }
    }
}
