import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore
import VaultProtocol

/// Clients reporting their own connection to the chat server
/// (`SetConnectionState`, OpenIM's connection callbacks) to a real vaultd over
/// its socket, with the session in a real gnome-keyring.
@Suite("Client connection reports", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct ConnectionStateTests {
    static let token = "tok_connstate_a1s2d3f4g5h6j7k8"

    /// A daemon with alice logged in at demo; the user name is unique per test.
    func loggedIn(_ prefix: String) throws -> (ConfiguredDaemon, String) {
        let d = try ConfiguredDaemon(config: "[Provider demo]\nType=static\n")
        let user = uniqueName(prefix)
        try expectSuccess(vaultctl(d.socketPath, ["login", "demo", user], input: ConnectionStateTests.token))
        return (d, user)
    }

    /// The clients the session lists, by name, read with a connection of its own.
    func clients(_ d: ConfiguredDaemon, _ user: String) throws -> [ClientReport] {
        try d.connection().session(provider: "demo", user: user).clients
    }

    @Test("Should list a reporting client with its pid and state, tell subscribers, and drop it when it disconnects")
    func reportsListedWhileConnected() async throws {
        let (d, user) = try loggedIn("report")
        let watcher = try RecordedStream(d.socketPath, provider: "demo", user: user, timeoutSeconds: 60)
        let bot = try d.connection()
        try bot.setConnectionState(provider: "demo", user: user, state: .connecting, client: "bot-1")
        try bot.setConnectionState(provider: "demo", user: user, state: .connected, client: "bot-1")
        // The same state again is no news: no event, `since` kept.
        try bot.setConnectionState(provider: "demo", user: user, state: .connected, client: "bot-1")
        let listed = try clients(d, user)
        #expect(listed.count == 1)
        #expect(listed.first?.name == "bot-1")
        #expect(listed.first?.state == .connected)
        #expect(listed.first?.pid == getpid(), "the pid comes from the socket's peer credentials")
        let status = try vaultctl(d.socketPath, ["status", "demo", user])
        #expect(status.stdout.contains("bot-1 (pid \(getpid())): connected since"), "\(status.stdout)")

        let connecting = try watcher.event()
        #expect(connecting.kind == .connectionChanged)
        #expect(connecting.source == .client)
        #expect(connecting.client == "bot-1")
        #expect(connecting.reason == "connecting")
        let connected = try watcher.event()
        #expect(connected.reason == "connected")
        #expect(connected.source == .client)

        // The client's connection to vaultd ends: it is dropped, and subscribers learn so.
        shutdown(bot.raw.fileDescriptor, Int32(SHUT_RDWR))
        let gone = try watcher.event()
        #expect(gone.kind == .connectionChanged, "no other event came between: the repeat was no news")
        #expect(gone.reason == "clientGone")
        #expect(gone.client == "bot-1")
        let after = try await eventually(tries: 1000, { try clients(d, user) }, until: { $0.isEmpty })
        #expect(after.isEmpty)
    }

    @Test("Should say a refresh's connectionChanged comes from vaultd and a client's from the client")
    func sourceOfConnectionChanged() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("source")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let watcher = try RecordedStream(fixture.socketPath, provider: "oauth", user: user, timeoutSeconds: 60)
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        try expectSuccess(
            vaultctl(fixture.socketPath, ["connection-state", "oauth", user, "connectFailed", "--client", "sh-bot"]))
        var seen: [VaultEvent] = []
        for _ in 0..<10 where !seen.contains(where: { $0.source == .client && $0.reason == "clientGone" }) {
            seen.append(try watcher.event())
        }
        let changes = seen.filter { $0.kind == .connectionChanged }
        #expect(changes.map(\.source) == [.vaultd, .vaultd, .client, .client], "\(changes)")
        #expect(changes.map(\.reason) == ["connecting", "connected", "connectFailed", "clientGone"])
        #expect(changes.filter { $0.source == .client }.allSatisfy { $0.client == "sh-bot" })
        #expect(changes.filter { $0.source == .vaultd }.allSatisfy { $0.client == nil })
    }

    @Test(
        "Should tell vaultd's connectionChanged only on a change: a connected session's refresh says nothing, a failed one connectFailed with code and message"
    )
    func connectionChangedOnChangeOnly() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("change")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let watcher = try RecordedStream(fixture.socketPath, provider: "oauth", user: user, timeoutSeconds: 60)
        // The first refresh connects; the second finds the session connected.
        for _ in 0..<2 { #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0) }
        try await server.post("/control/mode", json: ["mode": "error500", "count": 1])
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status != 0)
        var seen: [VaultEvent] = []
        for _ in 0..<10 where !seen.contains(where: { $0.reason == "connectFailed" }) {
            seen.append(try watcher.event())
        }
        #expect(
            seen.map { $0.kind == .connectionChanged ? $0.reason ?? "?" : $0.kind.rawValue } == [
                "connecting", "tokenRefreshed", "connected", "tokenRefreshed", "connectFailed",
            ], "\(seen)")
        let failed = try #require(seen.last)
        #expect(failed.code == "ERR_NETWORK_ERROR", "\(failed)")
        #expect(failed.message?.contains("500") == true, "\(failed)")
        #expect(failed.source == .vaultd)
    }

    @Test("Should end the session when a client reports kickedOffline, as ForceLogout does")
    func kickedOfflineEndsTheSession() async throws {
        let (d, user) = try loggedIn("kicked")
        let watcher = try RecordedStream(d.socketPath, provider: "demo", user: user, timeoutSeconds: 60)
        try d.connection().setConnectionState(provider: "demo", user: user, state: .kickedOffline, client: "bot")
        let reported = try watcher.event()
        #expect(reported.kind == .connectionChanged)
        #expect(reported.reason == "kickedOffline")
        #expect(reported.source == .client)
        let kicked = try watcher.event()
        #expect(kicked.kind == .kickedOffline)
        #expect(kicked.reason == "kicked")
        let token = try vaultctl(d.socketPath, ["token", "demo", user])
        #expect(token.stderr.contains("ERR_NOT_LOGGED_IN"), "\(token.stderr)")
        #expect(try await d.store.holds(provider: "demo", user: user) == false)
    }

    @Test("Should refuse a 65th client of one session with TooManyClients, and take one again once another left")
    func boundedPerSession() async throws {
        let (d, user) = try loggedIn("bound")
        var connections: [VaultConnection] = []
        for i in 0..<ClientConnections.limit {
            let c = try d.connection()
            try c.setConnectionState(provider: "demo", user: user, state: .connected, client: "c\(i)")
            connections.append(c)
        }
        let extra = try d.connection()
        do {
            try extra.setConnectionState(provider: "demo", user: user, state: .connected, client: "extra")
            Issue.record("the 65th client was accepted")
        } catch {
            #expect(error.code == "ERR_TOO_MANY_CLIENTS", "\(error)")
            #expect(error.message.contains("64 clients"), "\(error.message)")
        }
        // One leaves: its place is free once vaultd saw it go.
        shutdown(connections[0].raw.fileDescriptor, Int32(SHUT_RDWR))
        let count = try await eventually(
            tries: 1000, { try clients(d, user).count }, until: { $0 < ClientConnections.limit })
        #expect(count == ClientConnections.limit - 1)
        try extra.setConnectionState(provider: "demo", user: user, state: .connected, client: "extra")
        #expect(try clients(d, user).contains { $0.name == "extra" })
    }

    @Test("Should refuse reports on a session that is not logged in, and states vaultd does not know")
    func refusals() throws {
        let (d, user) = try loggedIn("refuse")
        let c = try d.connection()
        do {
            try c.setConnectionState(provider: "demo", user: uniqueName("nobody"), state: .connected)
            Issue.record("a report on no session was accepted")
        } catch {
            #expect(error.code == "ERR_NOT_LOGGED_IN", "\(error)")
        }
        let bad = try c.raw.call(
            VaultMethod.setConnectionState.rawValue,
            ["provider": "demo", "user": .string(user), "state": "online"])
        #expect(bad.error == "org.varlink.service.InvalidParameter")
        #expect(bad.parameters["parameter"]?.stringValue == "state")
        let usage = try vaultctl(d.socketPath, ["connection-state", "demo", user, "online"])
        #expect(usage.status == 2, "\(usage.stderr)")
        // No name given: the executable's.
        try c.setConnectionState(provider: "demo", user: user, state: .connecting)
        let name = try clients(d, user).first?.name
        #expect(name != nil && name != "", "\(String(describing: name))")
    }

    @Test("Should keep a shell script's client listed while vaultctl reads states from stdin, and drop it at the end")
    func shellScriptReportsFromStdin() async throws {
        let (d, user) = try loggedIn("stdin")
        let process = Process()
        process.executableURL = Binaries.vaultctl
        process.arguments = ["--socket", d.socketPath, "connection-state", "demo", user, "-", "--client", "script"]
        let input = Pipe()
        process.standardInput = input
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        try input.fileHandleForWriting.write(contentsOf: Data("connecting\n".utf8))
        let first = try await eventually(
            tries: 1000, { try clients(d, user) }, until: { $0.first?.state == .connecting })
        #expect(first.map(\.name) == ["script"])
        try input.fileHandleForWriting.write(contentsOf: Data("connected\n".utf8))
        let second = try await eventually(
            tries: 1000, { try clients(d, user) }, until: { $0.first?.state == .connected })
        #expect(second.first?.state == .connected)
        try input.fileHandleForWriting.close()
        #expect(try reap(process) == 0)
        let after = try await eventually(tries: 1000, { try clients(d, user) }, until: { $0.isEmpty })
        #expect(after.isEmpty)
    }
}

/// Only the session's owner and root report its connection: an AdminGroup
/// member, who may kick the session, may not speak for its clients.
@Suite(
    "Client connection reports between local users", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)),
    .serialized,
    .enabled(if: getuid() == 0, "needs root to create users"))
struct ConnectionStateAccessTests {
    init() throws { try TestUsers.ensure() }

    @Test("Should refuse a report on root's session from an AdminGroup member with AccessDenied")
    func adminMayNotReport() throws {
        let d = try ConfiguredDaemon(
            config: "[Vault]\nSocketMode=0666\nAdminGroup=\(TestUsers.admins)\n\n[Provider demo]\nType=static\n")
        let user = uniqueName("owner")
        #expect(try vaultctl(d.socketPath, ["login", "demo", user], input: ConnectionStateTests.token).status == 0)
        try expectFailure(
            vaultctl(as: TestUsers.b, d.socketPath, ["--owner", "0", "connection-state", "demo", user, "connected"]),
            saying: "ERR_ACCESS_DENIED")
        // Another user without a session of its own has nothing to report on.
        try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["connection-state", "demo", user, "connected"]),
            saying: "ERR_NOT_LOGGED_IN")
        // Root, the owner, may.
        #expect(try vaultctl(d.socketPath, ["connection-state", "demo", user, "connected"]).status == 0)
    }
}
