import Foundation
import Testing
import VaultClient
import VaultCore
import VaultDaemon
import VaultProtocol

/// The audit trail of token handouts against the real vaultd: the first
/// handout of a kind (uid, pid, account, result) is written at once, its
/// repeats are counted and written as one line with `count=` at the end of
/// the interval, and nothing counted is lost when vaultd stops.
@Suite("Audit trail of token handouts", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct AuditTests {
    static let token = "tok_audit_q1w2e3r4t5y6u7i8o9p0"

    /// The GetToken audit lines of `user` in `output`.
    static func handouts(_ output: String, user: String) -> [AuditLine] {
        AuditLine.all(in: output).filter { $0.fields["action"] == "GetToken" && $0.fields["user"] == user }
    }

    /// The handouts `lines` account for: one per line without a count, N per `count=N`.
    static func total(_ lines: [AuditLine]) -> Int {
        lines.reduce(0) { $0 + (Int($1.fields["count"] ?? "1") ?? 0) }
    }

    func loggedIn(_ fixture: DaemonFixture, _ users: [String]) throws -> VaultConnection {
        let client = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60)
        for user in users { try client.login(provider: "demo", user: user, token: AuditTests.token) }
        return client
    }

    @Test("Should write the first handout at once and the repeats as one line with their count at the interval's end")
    func repeatsCountedPerInterval() async throws {
        let fixture = try DaemonFixture()
        let daemon = try #require(fixture.daemon)
        let user = uniqueName("audit")
        let client = try loggedIn(fixture, [user])
        let calls = 50
        _ = try client.token(provider: "demo", user: user)
        // The first handout's line comes at once, without a count.
        let first = try await eventually(
            { AuditTests.handouts(daemon.output.text, user: user) }, until: { !$0.isEmpty })
        #expect(first.count == 1)
        #expect(first.first?.fields["count"] == nil, "\(first.map(\.text))")
        #expect(first.first?.fields["result"] == "ok")
        for _ in 1..<calls { _ = try client.token(provider: "demo", user: user) }
        // The repeats come as a count by the end of the interval (10 s), while vaultd runs.
        let lines = try await eventually(
            tries: 150, interval: .milliseconds(200), { AuditTests.handouts(daemon.output.text, user: user) },
            until: { AuditTests.total($0) >= calls })
        #expect(AuditTests.total(lines) == calls, "\(lines.map(\.text))")
        let counted = lines.filter { $0.fields["count"] != nil }
        // 49 repeats within one interval: one line; two if a tick fell among them.
        #expect(counted.count >= 1 && counted.count <= 2, "\(lines.map(\.text))")
        for line in counted {
            #expect(line.fields["pid"] == first.first?.fields["pid"])
            #expect(line.fields["exe"] == first.first?.fields["exe"])
            #expect(line.keys == line.keys.sorted(), "fields sorted by key: \(line.text)")
        }
        #expect(!daemon.allOutput.contains(AuditTests.token), "no token in vaultd's output")
    }

    @Test("Should give each pid and each account its own first line")
    func kindsApart() async throws {
        let fixture = try DaemonFixture()
        let daemon = try #require(fixture.daemon)
        let user = uniqueName("audita")
        let other = uniqueName("auditb")
        let client = try loggedIn(fixture, [user, other])
        // Three vaultctl processes: three pids, three lines written at once.
        for _ in 0..<3 {
            try expectSuccess(vaultctl(fixture.socketPath, ["token", "demo", user]))
        }
        // One connection, two accounts: a line for each.
        _ = try client.token(provider: "demo", user: user)
        _ = try client.token(provider: "demo", user: other)
        _ = try await eventually({ AuditTests.handouts(daemon.output.text, user: other) }, until: { !$0.isEmpty })
        let lines = AuditTests.handouts(daemon.output.text, user: user)
        #expect(lines.count == 4, "\(lines.map(\.text))")
        #expect(Set(lines.compactMap { $0.fields["pid"] }).count == 4, "\(lines.map(\.text))")
        #expect(lines.allSatisfy { $0.fields["count"] == nil }, "\(lines.map(\.text))")
        // A refusal is a kind of its own too.
        #expect(throws: VaultClientError.self) { try client.token(provider: "demo", user: uniqueName("nobody")) }
        #expect(daemon.output.wait(for: "result=ERR_NOT_LOGGED_IN"))
    }

    @Test("Should write the handouts still counted when vaultd stops on SIGTERM")
    func countsFlushedAtStop() throws {
        let fixture = try DaemonFixture()
        let daemon = try #require(fixture.daemon)
        let user = uniqueName("auditstop")
        let client = try loggedIn(fixture, [user])
        let calls = 30
        let started = Date()
        for _ in 0..<calls { _ = try client.token(provider: "demo", user: user) }
        let elapsed = Date().timeIntervalSince(started)
        #expect(daemon.stop() == 0)
        let lines = AuditTests.handouts(daemon.allOutput, user: user)
        #expect(AuditTests.total(lines) == calls, "\(lines.map(\.text))")
        if elapsed < 5 {
            // Well within one interval: the count can only have come from the flush at stop.
            #expect(lines.count == 2, "\(lines.map(\.text))")
            #expect(lines.last?.fields["count"] == String(calls - 1), "\(lines.map(\.text))")
        }
    }
}
