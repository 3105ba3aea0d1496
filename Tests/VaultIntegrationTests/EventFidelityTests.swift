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
@Suite("Event fidelity", .requiresKeyring, .timeLimit(.minutes(5)))
struct EventFidelityTests {
    /// A daemon whose one provider, `oauth`, is an oauth2 provider at `server`.
    func start(_ server: TokenServer) throws -> DaemonFixture {
        let fixture = try DaemonFixture(oauthServer: server)
        try fixture.start()
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

    @Test("Should carry the token endpoint's code and a message in tokenInvalid, and no token")
    func tokenInvalidCarriesCodeAndMessage() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try start(server)
        let user = uniqueName("invalid")
        let watcher = try RecordedStream(fixture.socketPath, provider: "oauth", user: user, timeoutSeconds: 60)
        let grant = try await server.grant()
        #expect(try vaultctl(fixture.socketPath, ["login", "oauth", user], input: grant).status == 0)
        let token = try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout
            .trimmingCharacters(in: .whitespacesAndNewlines)
        try await server.post("/control/mode", json: ["mode": "invalid_grant", "count": 1])
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 1)
        let event = try #require(try next(.tokenInvalid, on: watcher))
        #expect(event.code == "invalid_grant")
        #expect(event.message?.contains("invalid_grant") == true, "\(String(describing: event.message))")
        #expect(event.reason == "tokenInvalid")
        #expect(!token.isEmpty && !watcher.rawText.contains(token), "no token in any event")
        // vaultctl watch shows them too.
        let line = try #require(
            watcher.rawText.split(separator: "\n").first { $0.contains(#""kind":"tokenInvalid""#) })
        #expect(line.contains(#""code":"invalid_grant""#) && line.contains(#""message":"#), "\(line)")
    }

    @Test("Should carry the provider's code and a message in loginFailed when the provider refuses a login")
    func loginFailedCarriesCodeAndMessage() async throws {
        let server = try TokenServer(["--lifetime", "600", "--client-secret", "s3cr3t-client-value"])
        let fixture = try start(server)
        let user = uniqueName("refused")
        let watcher = try RecordedStream(fixture.socketPath, provider: "oauth", user: user, timeoutSeconds: 60)
        let refused = try vaultctl(fixture.socketPath, ["login", "oauth", user, "--from-provider"])
        #expect(refused.status == 1)
        let event = try #require(try next(.loginFailed, on: watcher))
        #expect(event.code == "invalid_client", "the token endpoint's own code, not a seed code")
        #expect(event.message?.contains("invalid_client") == true, "\(String(describing: event.message))")
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
        let login = Task.detached { try vaultctl(socket, ["login", "oauth", user, "--from-provider"]) }
        // Polled in process: starting a vaultctl per look is too slow under load.
        let owner = try VaultConnection(path: socket, timeoutSeconds: 60)
        let seen = try await eventually(
            tries: 1000, { (try? owner.session(provider: "oauth", user: user))?.state }, until: { $0 == .logging })
        #expect(seen == .logging)
        // The same in the list, a subscription's snapshot and the human status, while the provider still holds.
        #expect(try owner.sessions().first { $0.account.user == user }?.state == .logging)
        let snapshot = try RecordedStream(socket, provider: "oauth", user: user).snapshot
        #expect(snapshot.map(\.state) == [.logging])
        let text = try vaultctl(socket, ["status", "oauth", user]).stdout
        #expect(text.contains("logging"), "\(text)")
        let done = try await login.value
        #expect(done.status == 0, "\(done.stderr)")
        #expect(try vaultctl(socket, ["--json", "status", "oauth", user]).stdout.contains(#""state":"logged""#))
    }
}
