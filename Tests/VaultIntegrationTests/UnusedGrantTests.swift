import Foundation
import Testing
import Varlink
import VaultClient

/// Tokens an interactive login obtained that did not become the session are
/// revoked at the provider, against Authlib.
@Suite("Interactive logins' unused tokens", .requiresKeyring, .requiresAuthlib, .ownThreads, .timeLimit(.minutes(5)))
struct UnusedGrantTests {
    /// Logs `user` in with `vaultctl login --device`, approved at `server`,
    /// and checks that vaultctl says so.
    func deviceLogin(
        _ fixture: DaemonFixture, _ server: AuthlibServer, _ user: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let (process, out, err) = try startInterruptible(
            Binaries.vaultctl.path, ["--socket", fixture.socketPath, "login", "oauth", user, "--device"])
        defer { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
        guard out.wait(for: "Ctrl-C cancels") else { throw HarnessError("no code shown: \(out.text) \(err.text)") }
        let lines = out.text.split(separator: "\n").map(String.init)
        let code = try #require(lines.firstIndex(of: "and enter the code:").map { lines[$0 + 1] })
        try server.device("approve", code, user: user)
        let status = try reap(process, seconds: 30)
        _ = out.waitForEnd(seconds: 5)
        _ = err.waitForEnd(seconds: 5)
        #expect(
            status == 0 && out.text.contains("logged in: \(user) @ oauth"), "\(out.text) \(err.text)",
            sourceLocation: sourceLocation)
    }

    /// A running vaultd whose provider `oauth` is Authlib's public client
    /// at `server`, with device and browser logins and revocation.
    func start(_ server: AuthlibServer) throws -> DaemonFixture {
        try server.daemon(
            AuthlibServer.publicClient,
            lines: [
                "DeviceAuthorizationURL=\(server.url)/device_authorization", "AuthorizationURL=\(server.url)/authorize",
            ])
    }

    @Test(
        "Should revoke the tokens of a device login that finds its account logged in meanwhile, and keep serving the session"
    )
    func deviceLoginOvertaken() async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server)
        let user = uniqueName("overtaken")
        // A client starts a device login; before its user approves, the
        // account is logged in by another one.
        let vault = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 40)
        let late = try vault.startDeviceLogin(provider: "oauth", user: user)
        try deviceLogin(fixture, server, user)
        let served = try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout
        let kept = try server.liveRefreshTokens()
        #expect(kept.count == 1, "the first login holds one grant")

        try server.device("approve", late.userCode, user: user)
        var result: LoginResult?
        for _ in 0..<20 where result == nil {
            if case .done(let done) = try vault.pollDeviceLogin(late.login) { result = done }
        }
        #expect(result?.created == false, "the late login keeps the session there is")
        // The late grant is revoked; the first, which the session holds, is not.
        let live = try await eventually(tries: 250, { try server.liveRefreshTokens() }, until: { $0.count == 1 })
        #expect(live == kept, "only the session's own refresh token is still live")
        let revoked = try server.requests("revoke")
        #expect(revoked.count == 1, "\(revoked.map(\.text))")
        #expect(try vaultctl(fixture.socketPath, ["token", "oauth", user]).stdout == served, "the session goes on")
    }

    @Test(
        "Should answer --device and --browser of a logged-in account at once with its session, asking the provider nothing"
    )
    func deviceLoginOfLoggedInAccount() async throws {
        let directory = try TemporaryDirectory()
        let server = try AuthlibServer(directory: directory, arguments: ["--device-interval", "1"])
        let fixture = try start(server)
        let user = uniqueName("twice")
        try deviceLogin(fixture, server, user)
        for flags in [["--device"], ["--browser", "--no-open"]] {
            let again = try vaultctl(fixture.socketPath, ["login", "oauth", user] + flags)
            #expect(again.status == 0, "\(flags): \(again.stderr)")
            #expect(again.stdout.contains("already logged in: \(user) @ oauth"), "\(flags): \(again.stdout)")
        }
        let starts = try server.requests("device_authorization")
        #expect(starts.count == 1, "only the first login asked for a device code")
    }
}
