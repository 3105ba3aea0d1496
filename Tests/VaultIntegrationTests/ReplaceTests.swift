import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// Runs `count` vaultctl commands at once, each on a thread of its own (the
/// cooperative pool may have as few threads as cores), and returns their results.
private func vaultctlTogether(_ count: Int, _ socket: String, _ arguments: [String], input: String) throws
    -> [CommandResult]
{
    let results = LockedResults(count)
    let group = DispatchGroup()
    for index in 0..<count {
        group.enter()
        Thread {
            results.set(index, Result { try vaultctl(socket, arguments, input: input) })
            group.leave()
        }.start()
    }
    guard group.wait(timeout: .now() + 90) == .success else { throw HarnessError("the reporters did not finish") }
    return try results.all.map { try $0!.get() }
}

private final class LockedResults: @unchecked Sendable {
    private let lock = NSLock()
    private var items: [Result<CommandResult, any Error>?]
    init(_ count: Int) { items = Array(repeating: nil, count: count) }
    func set(_ index: Int, _ value: Result<CommandResult, any Error>) { lock.withLock { items[index] = value } }
    var all: [Result<CommandResult, any Error>?] { lock.withLock { items } }
}

/// `vaultctl --json token`'s token.
private func currentToken(_ socket: String, _ provider: String, _ user: String) throws -> String? {
    let r = try vaultctl(socket, ["--json", "token", provider, user])
    return (try? JSON.parse(r.stdout))?["token"]?.stringValue
}

/// Replacing a logged-in session's token in place (`vaultctl login --replace`)
/// against the real daemon, the suite's keyring and the test token server.
@Suite("Replace a token in place", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ReplaceTests {
    @Test("Should answer a plain login 'already logged in', and replace the token with --replace: served, stored, told")
    func replaceStatic() async throws {
        let fixture = try DaemonFixture()
        let daemon = fixture.daemon!
        let user = uniqueName("replace")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: "tok_first_abcdefgh1234").status == 0)
        let watcher = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 30).subscribe(
            provider: "demo", user: user)

        let plain = try vaultctl(fixture.socketPath, ["login", "demo", user], input: "tok_second_abcdefgh1234")
        #expect(plain.status == 0 && plain.stdout.hasPrefix("already logged in"), "\(plain.stdout) \(plain.stderr)")
        #expect(try currentToken(fixture.socketPath, "demo", user) == "tok_first_abcdefgh1234")

        let replaced = try vaultctl(
            fixture.socketPath, ["login", "--replace", "demo", user], input: "tok_second_abcdefgh1234")
        #expect(replaced.status == 0 && replaced.stdout.hasPrefix("replaced"), "\(replaced.stdout) \(replaced.stderr)")
        #expect(try currentToken(fixture.socketPath, "demo", user) == "tok_second_abcdefgh1234", "served at once")
        let event = try watcher.next()
        #expect(event?.kind == .tokenRefreshed && event?.reason == "replaced", "\(String(describing: event))")
        #expect(!replaced.stdout.contains("tok_second_abcdefgh1234") && !daemon.allOutput.contains("tok_second"))

        // --json says it too.
        let again = try vaultctl(
            fixture.socketPath, ["--json", "login", "--replace", "demo", user], input: "tok_third_abcdefgh1234")
        let json = try JSON.parse(again.stdout)
        #expect(json["replaced"]?.boolValue == true && json["created"]?.boolValue == true, "\(again.stdout)")

        // In the store before the reply: a restarted vaultd serves the replacement.
        #expect(daemon.stop() == 0)
        _ = try fixture.start()
        #expect(try currentToken(fixture.socketPath, "demo", user) == "tok_third_abcdefgh1234")
        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should revoke the replaced refresh token at the provider and serve the new grant's token")
    func replaceRevokesOldGrant() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try DaemonFixture(config: server.providerSection(revocation: true))
        let user = uniqueName("replace-oauth")
        let first = try await server.grant()
        let firstJSON = try JSON.parse(first)
        let oldRefresh = try #require(firstJSON["refresh_token"]?.stringValue)
        let oldAccess = try #require(firstJSON["access_token"]?.stringValue)
        #expect(try vaultctl(fixture.socketPath, ["login", "oauth", user], input: first).status == 0)

        let second = try await server.grant()
        let newAccess = try #require(try JSON.parse(second)["access_token"]?.stringValue)
        let r = try vaultctl(fixture.socketPath, ["login", "--replace", "oauth", user], input: second)
        #expect(r.status == 0 && r.stdout.hasPrefix("replaced"), "\(r.stdout) \(r.stderr)")
        #expect(try currentToken(fixture.socketPath, "oauth", user) == newAccess)

        let prefix = String(oldRefresh.prefix(6))
        let revoked = try await eventually(
            tries: 150, interval: .milliseconds(100), { try await server.revocations() },
            until: { $0.contains { $0["token"]?.stringValue == prefix } })
        #expect(
            revoked.contains { $0["token"]?.stringValue == prefix && $0["kind"]?.stringValue == "refresh_token" },
            "the replaced refresh token was revoked: \(revoked)")
        #expect(try await server.accepts(oldAccess) == false, "the replaced grant is dead at the provider")
        #expect(try await server.accepts(newAccess) == true, "the new grant lives")
        // Nothing is left queued once the provider took it: the one item is the session.
        if fixture.engine == .secretService {
            let items = try secretToolSearch(provider: "oauth", user: user)
            #expect(items.components(separatedBy: "label =").count - 1 == 1, "\(items)")
        } else {
            #expect(try await fixture.store.records(provider: "oauth", user: user).count == 1)
            #expect(try await fixture.store.queuedRevocations(user: user) == 0)
        }
    }

    @Test(
        "Should refuse a replace of another uid's session with AccessDenied",
        .enabled(if: getuid() == 0, "needs root to create users"))
    func replaceOtherUIDDenied() async throws {
        try TestUsers.ensure()
        let d = try ConfiguredDaemon(config: "[Vault]\nSocketMode=0666\n\n[Provider demo]\nType=static\n")
        let user = uniqueName("replace-uid")
        let uidA = try #require(TestUsers.uid(TestUsers.a))
        try expectSuccess(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", user], input: "tok_owner_a1b2c3d4e5"))
        try expectFailure(
            vaultctl(
                as: TestUsers.b, d.socketPath, ["--owner", String(uidA), "login", "--replace", "demo", user],
                input: "tok_intruder_b1b2c3d4"), saying: "ERR_ACCESS_DENIED")
        let token = try vaultctl(as: TestUsers.a, d.socketPath, ["--json", "token", "demo", user])
        #expect((try? JSON.parse(token.stdout))?["token"]?.stringValue == "tok_owner_a1b2c3d4e5")
        // The owner may.
        let own = try vaultctl(
            as: TestUsers.a, d.socketPath, ["login", "--replace", "demo", user], input: "tok_owner_new_a1b2c3")
        #expect(own.status == 0 && own.stdout.hasPrefix("replaced"), "\(own.stdout) \(own.stderr)")
    }
}

/// `vaultctl report-rejected` against the real daemon, keyring and token server.
@Suite("Report a rejected token", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ReportRejectedTests {
    @Test(
        "Should refresh once for eight clients reporting the current token at once, and answer a stale report at once")
    func reportersShareOneRefresh() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let fixture = try DaemonFixture(oauthServer: server, start: true)
        let user = uniqueName("rejected")
        let grant = try await server.grant()
        let access = try #require(try JSON.parse(grant)["access_token"]?.stringValue)
        #expect(try vaultctl(fixture.socketPath, ["login", "oauth", user], input: grant).status == 0)
        try await server.post("/control/reset")
        // The refresh takes 10 s, so the reporters arrive while it is out (on a
        // loaded machine a late one may find it done: "already replaced", also right).
        try await server.post(
            "/control/mode", json: ["mode": "slow", "hang_seconds": 10, "count": 1, "target": "token"])

        let results = try vaultctlTogether(8, fixture.socketPath, ["report-rejected", "oauth", user], input: access)
        for r in results {
            #expect(
                r.status == 0 && (r.stdout.hasPrefix("refreshed") || r.stdout.hasPrefix("already replaced")),
                "\(r.stdout) \(r.stderr)")
        }
        let joined = results.filter { $0.stdout.hasPrefix("refreshed") }.count
        #expect(joined >= 1, "the first reporter's refresh is reported as such")
        print("report-rejected: \(joined) of 8 reporters joined the one refresh")
        let stats = try await server.stats()
        #expect(stats["refresh_requests"]?.integerValue == 1, "eight reporters, one token request: \(stats)")
        let fresh = try #require(try currentToken(fixture.socketPath, "oauth", user))
        #expect(fresh != access)

        // The old token again: already replaced, at once, and no request.
        let started = Date()
        let stale = try vaultctl(fixture.socketPath, ["report-rejected", "oauth", user], input: access)
        #expect(stale.status == 0 && stale.stdout.hasPrefix("already replaced"), "\(stale.stdout) \(stale.stderr)")
        #expect(Date().timeIntervalSince(started) < 10)
        let json = try vaultctl(fixture.socketPath, ["--json", "report-rejected", "oauth", user], input: access)
        #expect(try JSON.parse(json.stdout)["outcome"]?.stringValue == "alreadyReplaced", "\(json.stdout)")
        #expect(try await server.stats()["refresh_requests"]?.integerValue == 1)
    }

    @Test("Should end a static session as tokenInvalid (reason rejected) when its current token is reported")
    func staticSessionEnds() async throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("rejected-static")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "demo", user], input: "tok_static_abcdefgh1234"))
        let watcher = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 30).subscribe(
            provider: "demo", user: user)
        let other = try vaultctl(
            fixture.socketPath, ["report-rejected", "demo", user], input: "tok_not_current_abcdefgh")
        #expect(other.status == 0 && other.stdout.hasPrefix("already replaced"), "\(other.stdout) \(other.stderr)")
        #expect(try currentToken(fixture.socketPath, "demo", user) == "tok_static_abcdefgh1234")

        let r = try vaultctl(fixture.socketPath, ["report-rejected", "demo", user], input: "tok_static_abcdefgh1234\n")
        #expect(r.status == 0 && r.stdout.hasPrefix("ended"), "\(r.stdout) \(r.stderr)")
        let event = try watcher.next()
        #expect(event?.kind == .tokenInvalid && event?.reason == "rejected", "\(String(describing: event))")
        try expectFailure(vaultctl(fixture.socketPath, ["token", "demo", user]), saying: "ERR_NOT_LOGGED_IN")
        #expect(try await fixture.store.holds(provider: "demo", user: user) == false)
    }

    @Test("Should refuse a hash that is not 64 lowercase hex digits, naming tokenHash")
    func badHash() async throws {
        let fixture = try DaemonFixture()
        let vault = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 30)
        do {
            try vault.reportRejected(provider: "demo", user: "x", tokenHash: "ABC")
            Issue.record("a bad hash was taken")
        } catch {
            #expect(error.varlinkName == "org.varlink.service.InvalidParameter", "\(error)")
            #expect(error.message.contains("tokenHash"), "\(error)")
        }
    }
}
