import Foundation
import Glibc
import Testing
import Varlink
import VaultCore
import VaultProtocol

/// Issue 28, items 2 and 3: one local user cannot make vaultd hammer the
/// provider with its shared client credentials. Real vaultd, the real token
/// server on loopback, and a second real uid (setpriv) making the calls.
@Suite(
    "Provider traffic per user", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root to create users"))
struct ProviderTrafficTests {
    init() throws { try TestUsers.ensure() }

    /// A daemon on a socket every user may reach, whose provider `oauth`
    /// gets and revokes its tokens at `server`, with `vault` in `[Vault]`.
    func start(_ server: TokenServer, vault: String) throws -> ConfiguredDaemon {
        try ConfiguredDaemon(
            config: "[Vault]\nSocketMode=0666\n\(vault)\n" + server.providerSection(revocation: true))
    }

    /// One reply of `varlink_calls.py`: when it came, the error (nil: a
    /// success) and its parameters.
    struct Reply {
        var at: Double
        var error: String?
        var parameters: JSON
    }

    /// Sends `calls` over one connection as the user `name`, one after
    /// another, and returns the replies (Tests/python/varlink_calls.py).
    func calls(as name: String, _ socket: String, _ calls: [(String, JSON)]) throws -> [Reply] {
        guard let uid = TestUsers.uid(name), let gid = TestUsers.gid(name) else {
            throw HarnessError("no user \(name)")
        }
        let script = Binaries.packageRoot.appendingPathComponent("Tests/python/varlink_calls.py").path
        let input = calls.map { method, parameters in
            JSON.object(["method": .string("io.vaultd.Vault.\(method)"), "parameters": parameters]).text
        }.joined(separator: "\n")
        let r = try runCommand(
            URL(fileURLWithPath: "/usr/bin/setpriv"),
            ["--reuid=\(uid)", "--regid=\(gid)", "--init-groups", "/usr/bin/python3", script, socket], input: input,
            seconds: 120)
        guard r.status == 0 else { throw HarnessError("varlink_calls.py: \(r.stderr)") }
        return try r.stdout.split(separator: "\n").map { line in
            let json = try JSON.parse(String(line))
            let reply = json["reply"] ?? .null
            guard case .number(let at)? = json["at"] else { throw HarnessError("no time in \(line)") }
            return Reply(
                at: at, error: reply["error"]?.stringValue,
                parameters: reply["parameters"] ?? .null)
        }
    }

    /// Logs `user` in as TestUsers.a with a token response of the test's own.
    func login(_ d: ConfiguredDaemon, _ server: TokenServer, _ user: String) async throws {
        try expectSuccess(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "oauth", user], input: try await server.grant()))
    }

    /// The requests vaultd sent the token server (refreshes and
    /// revocations; the test's own client_credentials grants are not counted).
    func providerRequests(_ server: TokenServer) async throws -> (refresh: Int64, revoke: Int64) {
        let stats = try await server.stats()
        return (stats["refresh_requests"]?.integerValue ?? -1, stats["revoke_requests"]?.integerValue ?? -1)
    }

    static let refused = "io.vaultd.Vault.RefreshBackingOff"

    @Test(
        "Should send 300 Refresh calls of a user against a failing endpoint no faster than the backoff allows",
        arguments: ["error500", "error429"])
    func refreshWaitsOutBackoff(_ mode: String) async throws {
        let server = try TokenServer(["--lifetime", "600"])
        // Only the backoff limits here: no interval, no budget.
        let d = try start(server, vault: "MinRefreshInterval=0\nProviderRequestsPerMinute=0")
        let user = uniqueName("hammer")
        try await login(d, server, user)
        try await server.post("/control/reset")
        try await server.post(
            "/control/mode",
            json: ["mode": .string(mode), "target": "token", "retry_after": mode == "error429" ? 120 : nil])
        let begun = Date().timeIntervalSince1970
        let replies = try calls(
            as: TestUsers.a, d.socketPath,
            Array(repeating: ("Refresh", ["provider": "oauth", "user": .string(user)]), count: 300))
        let elapsed = Date().timeIntervalSince1970 - begun
        let sent = try await providerRequests(server).refresh
        print("ProviderTrafficTests \(mode): 300 Refresh calls in \(elapsed) s sent \(sent) refresh requests")
        #expect(replies.count == 300)
        // Every wait of the backoff is at least 1 s (at least 120 s after a 429
        // asking for 120): one request, then at most one a second.
        let allowed = mode == "error429" ? 1 : 1 + Int64(elapsed.rounded(.up))
        #expect(sent >= 1 && sent <= allowed, "\(sent) refresh requests in \(elapsed) s; the backoff allows \(allowed)")
        let refusals = replies.filter { $0.error == Self.refused }
        #expect(refusals.count >= 300 - Int(allowed), "\(Set(replies.map { $0.error ?? "ok" }))")
        for refusal in refusals {
            #expect(refusal.parameters["code"]?.stringValue == "ERR_REFRESH_BACKING_OFF")
            let retryAt = try #require(refusal.parameters["retryAt"]?.integerValue)
            #expect(Double(retryAt) >= refusal.at - 1)
            if mode == "error429" { #expect(Double(retryAt) >= begun + 119) }
        }
        try await server.post("/control/mode", json: ["mode": "normal"])
    }

    @Test("Should refuse a client's Refresh after a failed one as too soon, without a request")
    func failedRefreshCountsTowardInterval() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let d = try start(server, vault: "MinRefreshInterval=60\nProviderRequestsPerMinute=0")
        let user = uniqueName("interval")
        try await login(d, server, user)
        try await server.post("/control/reset")
        // Only the next request fails, asking for 30 s: vaultd's own retry
        // (not limited by MinRefreshInterval=, vaultd.conf(5)) comes after
        // that, so no client call below can join it. The interval's end (60 s)
        // is later than the backoff's, so the answer is RefreshTooSoon.
        try await server.post(
            "/control/mode", json: ["mode": "error429", "retry_after": 30, "target": "token", "count": 1])
        let failed = try vaultctl(as: TestUsers.a, d.socketPath, ["refresh", "oauth", user])
        #expect(failed.status != 0)
        let failedAt = Date().timeIntervalSince1970
        let refused = try vaultctl(as: TestUsers.a, d.socketPath, ["refresh", "oauth", user])
        let requests = try await providerRequests(server).refresh
        #expect(Date().timeIntervalSince1970 - failedAt < 30, "vaultd's own retry may have run")
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("ERR_REFRESH_TOO_SOON"), "\(refused.stderr)")
        #expect(requests == 1, "the failed attempt only")
    }

    @Test("Should keep 100 rounds of login, refresh and logout of one user within its provider request budget")
    func roundsStayWithinBudget() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        // The defaults: 30 a minute, bursts of 10.
        let d = try start(server, vault: "MinRefreshInterval=0")
        var rounds: [(String, JSON)] = []
        for round in 0..<100 {
            let user: JSON = .string("round-\(round)")
            let grant = try JSON.parse(try await server.grant())
            rounds.append(("Login", ["provider": "oauth", "user": user, "tokenResponse": grant]))
            rounds.append(("Refresh", ["provider": "oauth", "user": user]))
            rounds.append(("Logout", ["provider": "oauth", "user": user]))
        }
        try await server.post("/control/reset")
        let begun = Date().timeIntervalSince1970
        let replies = try calls(as: TestUsers.a, d.socketPath, rounds)
        let elapsed = Date().timeIntervalSince1970 - begun
        let (refreshes, revocations) = try await providerRequests(server)
        print(
            "ProviderTrafficTests rounds: 100 rounds in \(elapsed) s sent \(refreshes) refreshes, \(revocations) revocations"
        )
        #expect(replies.count == 300)
        // The bucket: 10 at once, then one every 2 s.
        let allowed = 10 + Int64((elapsed / 2).rounded(.up))
        #expect(
            refreshes + revocations <= allowed,
            "\(refreshes) refreshes and \(revocations) revocations in \(elapsed) s; the budget allows \(allowed)")
        // Every login and logout was answered as asked: nothing acknowledged was dropped.
        for (index, reply) in replies.enumerated() where index % 3 != 1 {
            #expect(reply.error == nil, "\(index): \(reply.error ?? "")")
        }
        let refused = replies.enumerated().filter { $0.offset % 3 == 1 && $0.element.error != nil }.map(\.element)
        #expect(refused.count >= 100 - Int(allowed))
        for reply in refused {
            #expect(reply.error == "io.vaultd.Vault.TooManyProviderRequests")
            #expect(reply.parameters["code"]?.stringValue == "ERR_TOO_MANY_PROVIDER_REQUESTS")
            #expect(Double(reply.parameters["retryAt"]?.integerValue ?? 0) >= reply.at - 1)
        }
    }

    @Test("Should refuse the login past the cap of queued revocations, end every logout, and pace the retries")
    func revocationsAreCapped() async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let cap = 40
        let d = try start(server, vault: "MaxSessionsPerUser=\(cap)\nProviderRequestsPerMinute=0")
        try await server.post("/control/mode", json: ["mode": "error500", "target": "revoke"])
        var rounds: [(String, JSON)] = []
        for round in 0..<(cap + 3) {
            let user: JSON = .string("capped-\(round)")
            let grant = try JSON.parse(try await server.grant())
            rounds.append(("Login", ["provider": "oauth", "user": user, "tokenResponse": grant]))
            rounds.append(("Logout", ["provider": "oauth", "user": user]))
        }
        try await server.post("/control/reset")
        let begun = Date().timeIntervalSince1970
        let replies = try calls(as: TestUsers.a, d.socketPath, rounds)
        #expect(replies.count == 2 * (cap + 3))
        // The sessions' revocations fill the user's places; every logout of a
        // session that was logged in succeeded (it ended here at once).
        for round in 0..<cap {
            #expect(replies[2 * round].error == nil, "login \(round): \(replies[2 * round].error ?? "")")
            #expect(replies[2 * round + 1].error == nil, "logout \(round): \(replies[2 * round + 1].error ?? "")")
        }
        for round in cap..<(cap + 3) {
            let login = replies[2 * round]
            #expect(login.error == "io.vaultd.Vault.TooManyRevocations", "login \(round): \(login.error ?? "ok")")
            #expect(login.parameters["code"]?.stringValue == "ERR_TOO_MANY_REVOCATIONS")
        }
        // The queued revocations are retried with backoff, a few a second in
        // all: watched for at least 3 s (bounded polls of the server's count).
        var revoked: Int64 = 0
        var elapsed = 0.0
        for _ in 0..<600 where elapsed < 3 {
            revoked = try await providerRequests(server).revoke
            elapsed = Date().timeIntervalSince1970 - begun
            try await Task.sleep(for: .milliseconds(10))
        }
        // At most four a second (RevocationQueue.spacingSeconds).
        let allowed = 1 + Int64((elapsed * 4).rounded(.up))
        print("ProviderTrafficTests cap: \(revoked) revocation requests in \(elapsed) s")
        #expect(revoked >= 1 && revoked <= allowed, "\(revoked) revocation requests in \(elapsed) s")
        try await server.post("/control/mode", json: ["mode": "normal"])
    }
}
