import Foundation
import Testing

/// `vaultctl token` against the real daemon: the short path (plain tokens)
/// and the general one it hands every other reply to print the same.
@Suite("vaultctl token", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct TokenCommandTests {
    @Test("Should print each token exactly, escaped in the reply or not, the same as --json carries it")
    func printsEveryToken() throws {
        let fixture = try DaemonFixture()
        // Tokens hold no whitespace or control characters (vaultd refuses them at login).
        let tokens = [
            "plain-token-abcdef123456", #"with"quotes"and\backslashes\"#, "ünïcødé-tøkén-✓", "slash/plus+eq=",
        ]
        for (index, token) in tokens.enumerated() {
            let user = "user\(index)"
            try expectSuccess(vaultctl(fixture.socketPath, ["login", "demo", user], input: token))
            let plain = try expectSuccess(vaultctl(fixture.socketPath, ["token", "demo", user]))
            #expect(plain.stdout == token + "\n")
            let json = try vaultctl(fixture.socketPath, ["--json", "token", "demo", user])
            let object = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any]
            #expect(object?["token"] as? String == token)
        }
    }

    @Test("Should report a session that is not logged in and an unreachable vaultd as the general path does")
    func reportsFailures() throws {
        let fixture = try DaemonFixture()
        let missing = try expectFailure(vaultctl(fixture.socketPath, ["token", "demo", "nobody"]))
        #expect(missing.stdout.isEmpty)
        #expect(
            missing.stderr
                == "vaultctl: nobody @ demo is not logged in; log in with 'vaultctl login demo nobody' (ERR_NOT_LOGGED_IN)\n"
        )
        let gone = try vaultctl(fixture.socketPath + ".absent", ["token", "demo", "nobody"])
        #expect(gone.status == 3)
        #expect(gone.stderr.contains("vaultd is not reachable at \(fixture.socketPath).absent"))
    }
}
