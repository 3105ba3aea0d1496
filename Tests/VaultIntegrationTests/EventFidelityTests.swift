import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore
import VaultProtocol

/// Events as faithful as the SDKs' callbacks, against a real vaultd, keyring
/// and token endpoint: `tokenInvalid` and `loginFailed` carry the provider's
/// code and a message (OpenIM's onUserTokenInvalid(message)), and the owner
/// sees `logging` while its own login is in flight (OpenIM getLoginStatus).
@Suite("Event fidelity", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct EventFidelityTests {
    /// A daemon whose one provider, `oauth`, is an oauth2 provider at `server`.
    func start(_ server: TokenServer) throws -> DaemonFixture {
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        return fixture
    }

    /// The next event of `kind` on `watcher`, skipping others (at most 20).
    func next(_ kind: EventKind, on watcher: RecordedStream) throws -> VaultEvent? {
        for _ in 0..<20 {
            let event = try watcher.event()
            if event.kind == kind { return event }
        }
        return nil
    }

    @Test("Should carry vaultd's code, the token endpoint's code and its words in tokenInvalid, and no token")
    func tokenInvalidCarriesCodeAndMessage() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try start(server)
        let user = uniqueName("invalid")
        let watcher = try RecordedStream(fixture.socketPath, provider: "oauth", user: user, timeoutSeconds: 60)
        let grant = try await server.grant()
        #expect(try vaultctl(fixture.socketPath, ["login", "oauth", user], input: grant).status == 0)
        let token = try fixture.token("oauth", user)
        try await server.post("/control/mode", json: ["mode": "invalid_grant", "count": 1])
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 1)
        let event = try #require(try next(.tokenInvalid, on: watcher))
        #expect(event.code == "ERR_GRANT_REVOKED")
        #expect(event.providerCode == "invalid_grant")
        #expect(
            event.providerMessage?.contains("invalid_grant") == true, "\(String(describing: event.providerMessage))")
        #expect(event.message?.isEmpty == false)
        #expect(event.reason == "tokenInvalid")
        #expect(!token.isEmpty && !watcher.rawText.contains(token), "no token in any event")
        // vaultctl watch shows them too.
        let line = try #require(
            watcher.rawText.split(separator: "\n").first { $0.contains(#""kind":"tokenInvalid""#) })
        #expect(
            line.contains(#""code":"ERR_GRANT_REVOKED""#) && line.contains(#""providerCode":"invalid_grant""#)
                && line.contains(#""message":"#), "\(line)")
    }

    @Test(
        "Should carry vaultd's code and the provider's code and words in loginFailed when the provider refuses a login")
    func loginFailedCarriesCodeAndMessage() async throws {
        let server = try TokenServer(["--lifetime", "600", "--client-secret", "s3cr3t-client-value"])
        let fixture = try start(server)
        let user = uniqueName("refused")
        let watcher = try RecordedStream(fixture.socketPath, provider: "oauth", user: user, timeoutSeconds: 60)
        try expectFailure(vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"]))
        let event = try #require(try next(.loginFailed, on: watcher))
        #expect(event.code == "ERR_INVALID_CLIENT", "vaultd's code")
        #expect(event.providerCode == "invalid_client", "the token endpoint's own code beside it")
        #expect(
            event.providerMessage?.contains("invalid_client") == true, "\(String(describing: event.providerMessage))")
        #expect(!watcher.rawText.contains("s3cr3t-client-value"))
    }

    @Test("Should show the owner its own login as logging while the provider has not answered")
    func ownerSeesLogging() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try start(server)
        let user = uniqueName("logging")
        // The token endpoint holds its answer 20 s: the login is in flight meanwhile
        // (long enough for the checks below on a machine loaded by parallel builds).
        try await server.post("/control/mode", json: ["mode": "slow", "count": 1, "hang_seconds": 20])
        let socket = fixture.socketPath
        // Started, not awaited on the cooperative pool (two threads on this machine,
        // which the other suites' blocking calls may hold for seconds at a time).
        let login = Process()
        login.executableURL = Binaries.vaultctl
        login.arguments = ["--socket", socket, "login", "oauth", user, "--from-provider"]
        login.standardInput = FileHandle.nullDevice
        login.standardOutput = FileHandle.nullDevice
        login.standardError = FileHandle.nullDevice
        try login.run()
        // Polled in process, on this test's own thread, bounded by 30 s.
        let owner = try VaultConnection(path: socket, timeoutSeconds: 60)
        let deadline = Date().addingTimeInterval(30)
        var seen: LoginState?
        for _ in 0..<1500 where Date() < deadline {
            seen = (try? owner.session(provider: "oauth", user: user))?.state
            // Until the login shows (logging), or is already over (logged: too late to see it).
            if seen == .logging || seen == .logged { break }
            usleep(20_000)
        }
        #expect(seen == .logging)
        // The same in the list, a subscription's snapshot and the human status, while the provider still holds.
        #expect(try owner.sessions().first { $0.account.user == user }?.state == .logging)
        let snapshot = try RecordedStream(socket, provider: "oauth", user: user, timeoutSeconds: 60).snapshot
        #expect(snapshot.map(\.state) == [.logging])
        let text = try vaultctl(socket, ["status", "oauth", user]).stdout
        #expect(text.contains("logging"), "\(text)")
        #expect(try reap(login, seconds: 60) == 0)
        #expect(try owner.session(provider: "oauth", user: user).state == .logged)
    }
}
