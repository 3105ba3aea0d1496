import Testing
import VaultCore

/// The clients that report their connection for one session, as pure bookkeeping.
@Suite("Client connection reports", .timeLimit(.minutes(5)))
struct ClientConnectionsTests {
    let account = Account(provider: "demo", user: "alice")

    @Test("Should list a client once per connection, news only when its state changes, since kept on repeats")
    func reportsAndRepeats() throws {
        var clients = ClientConnections()
        let t0 = UnixTime(seconds: 1000)
        #expect(try clients.report(connection: 7, name: "bot", pid: 42, state: .connecting, now: t0, account: account))
        #expect(
            try clients.report(
                connection: 7, name: "bot", pid: 42, state: .connected, now: t0.adding(seconds: 5), account: account))
        #expect(
            try !clients.report(
                connection: 7, name: "bot", pid: 42, state: .connected, now: t0.adding(seconds: 9), account: account))
        #expect(clients.clients.count == 1)
        #expect(clients.clients[0].since == t0.adding(seconds: 5))
        #expect(clients.clients[0].json()["state"]?.stringValue == "connected")
        #expect(clients.clients[0].json()["pid"]?.integerValue == 42)
    }

    @Test("Should refuse a client past the limit with TooManyClients and take one again after a drop")
    func bounded() throws {
        var clients = ClientConnections()
        let now = UnixTime(seconds: 1)
        for id in 0..<UInt64(ClientConnections.limit) {
            _ = try clients.report(
                connection: id, name: "c\(id)", pid: 1, state: .connected, now: now, account: account)
        }
        // A client already listed may still report.
        #expect(
            try clients.report(connection: 3, name: "c3", pid: 1, state: .connectFailed, now: now, account: account))
        #expect(throws: VaultError(.tooManyClients, "")) {
            try clients.report(connection: 999, name: "x", pid: 1, state: .connected, now: now, account: account)
        }
        #expect(clients.drop(connection: 3)?.state == .connectFailed)
        #expect(clients.drop(connection: 3) == nil)
        #expect(try clients.report(connection: 999, name: "x", pid: 1, state: .connected, now: now, account: account))
        #expect(clients.clients.count == ClientConnections.limit)
    }

    @Test("Should accept plain client names of 1 to 64 bytes only")
    func names() throws {
        #expect(try ClientConnections.validate(name: "mybot") == "mybot")
        #expect(throws: VaultError(.invalidParameter, "")) { try ClientConnections.validate(name: "") }
        #expect(throws: VaultError(.invalidParameter, "")) {
            try ClientConnections.validate(name: String(repeating: "x", count: 65))
        }
        #expect(throws: VaultError(.invalidParameter, "")) { try ClientConnections.validate(name: "a\nb") }
    }
}
