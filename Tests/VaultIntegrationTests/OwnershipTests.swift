import Foundation
import Glibc
import Testing
import Varlink
import VaultCore

/// The ownership model of issue "Safe on a shared host", tried as local users
/// would: real vaultd, real second and third uids (setpriv), the real
/// CometChat helper against its local stand-in.
@Suite(
    "Ownership on a shared host", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root to create users"))
struct OwnershipTests {
    static let open = "[Vault]\nSocketMode=0666\n\n[Provider demo]\nType=static\n"

    init() throws { try TestUsers.ensure() }

    /// `vaultctl --json token` as `name` (nil: root), parsed.
    func token(_ d: ConfiguredDaemon, as name: String?, _ user: String, _ extra: [String] = []) throws -> (
        CommandResult, JSON?
    ) {
        let arguments = ["--json"] + extra + ["token", "demo", user]
        let r = try name.map { try vaultctl(as: $0, d.socketPath, arguments) } ?? vaultctl(d.socketPath, arguments)
        return (r, try? JSON.parse(r.stdout))
    }

    @Test("Should keep two users' sessions of one account apart: no squatting, each reads its own")
    func noSquatting() throws {
        let d = try ConfiguredDaemon(config: Self.open)
        let user = uniqueName("squat")
        let uidA = Int64(TestUsers.uid(TestUsers.a)!)
        let uidB = Int64(TestUsers.uid(TestUsers.b)!)
        // The attacker (a) logs the account in first.
        try expectSuccess(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", user], input: "tok_attacker_a1b2c3d4e5"))
        // The real user (b) and root still log in their own sessions of it.
        let second = try vaultctl(
            as: TestUsers.b, d.socketPath, ["login", "demo", user], input: "tok_victim_b1b2c3d4e5")
        #expect(second.status == 0 && second.stdout.hasPrefix("logged in"), "\(second.stdout) \(second.stderr)")
        let third = try vaultctl(d.socketPath, ["login", "demo", user], input: "tok_root_r1r2r3r4r5r6")
        #expect(third.status == 0 && third.stdout.hasPrefix("logged in"), "\(third.stdout) \(third.stderr)")

        let (b, bJSON) = try token(d, as: TestUsers.b, user)
        #expect(bJSON?["token"]?.stringValue == "tok_victim_b1b2c3d4e5", "\(b.stdout) \(b.stderr)")
        #expect(bJSON?["ownerUid"]?.integerValue == uidB, "the reply says whose session it is")
        let (_, aJSON) = try token(d, as: TestUsers.a, user)
        #expect(aJSON?["token"]?.stringValue == "tok_attacker_a1b2c3d4e5")
        let (_, rootJSON) = try token(d, as: nil, user)
        #expect(rootJSON?["token"]?.stringValue == "tok_root_r1r2r3r4r5r6")

        // a cannot touch b's session, even naming it.
        for arguments in [["logout", "demo", user], ["kick", "demo", user], ["status", "demo", user]] {
            let r = try vaultctl(as: TestUsers.a, d.socketPath, ["--owner", String(uidB)] + arguments)
            #expect(r.status == 1 && r.stderr.contains("ERR_ACCESS_DENIED"), "\(arguments): \(r.stderr)")
        }
        // Naming another user's session tells nothing of whether it exists.
        let probe = try vaultctl(as: TestUsers.a, d.socketPath, ["--owner", String(uidB), "token", "demo", "nobody-x"])
        #expect(probe.stderr.contains("ERR_ACCESS_DENIED"), "\(probe.stderr)")
        // a's logout ends a's session only.
        #expect(try vaultctl(as: TestUsers.a, d.socketPath, ["logout", "demo", user]).status == 0)
        #expect(try token(d, as: TestUsers.b, user).1?["token"]?.stringValue == "tok_victim_b1b2c3d4e5")
        // Root lists all three owners' sessions apart; with several, an admin must name one.
        let kick = try vaultctl(d.socketPath, ["kick", "demo", user])
        #expect(kick.status == 0, "root's own session is meant: \(kick.stderr)")
        let list = try JSON.parse(try vaultctl(d.socketPath, ["--json", "list"]).stdout)["sessions"]?.arrayValue ?? []
        let owners = list.filter { $0["user"]?.stringValue == user }.compactMap { $0["ownerUid"]?.integerValue }
        #expect(owners == [uidB], "\(list)")
        #expect(!owners.contains(uidA))
        // Only b's is left: root's kick without --owner now means it.
        #expect(try vaultctl(d.socketPath, ["kick", "demo", user]).status == 0)
        #expect(try token(d, as: TestUsers.b, user).0.stderr.contains("ERR_NOT_LOGGED_IN"))
    }

    @Test("Should let only the declared Owner= log a declared account in, and its readers read that owner's token")
    func declaredOwner() throws {
        let user = uniqueName("shared")
        let d = try ConfiguredDaemon(
            config: Self.open + "\n[Account demo \(user)]\nOwner=\(TestUsers.b)\nTokenReadUsers=\(TestUsers.a)\n")
        let uidB = Int64(TestUsers.uid(TestUsers.b)!)
        // a (a reader, not the owner) cannot squat it, before or after b logs in.
        try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", user], input: "tok_squatter_000000"),
            saying: "ERR_ACCESS_DENIED")
        try expectSuccess(
            vaultctl(as: TestUsers.b, d.socketPath, ["login", "demo", user], input: "tok_owner_b_123456"))
        let (read, json) = try token(d, as: TestUsers.a, user)
        #expect(read.status == 0, "\(read.stderr)")
        #expect(json?["token"]?.stringValue == "tok_owner_b_123456")
        #expect(json?["ownerUid"]?.integerValue == uidB)
        // Root logging it in means the owner's session: already there.
        let root = try vaultctl(d.socketPath, ["login", "demo", user], input: "tok_root_other_99999")
        #expect(root.status == 0 && root.stdout.hasPrefix("already logged in"), "\(root.stdout) \(root.stderr)")
        #expect(try token(d, as: TestUsers.a, user).1?["token"]?.stringValue == "tok_owner_b_123456")
        // A reader may not log it out.
        try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["logout", "demo", user]), saying: "ERR_ACCESS_DENIED")
        #expect(try vaultctl(as: TestUsers.b, d.socketPath, ["logout", "demo", user]).status == 0)
        let after = try vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", user], input: "tok_squatter_000000")
        #expect(after.status == 1 && after.stderr.contains("ERR_ACCESS_DENIED"), "not after the owner's logout either")
    }

    @Test("Should let only MintUsers, the declared owner and root have an exec helper mint tokens")
    func minting() throws {
        let standIns = try ChatStandIns()
        let directory = try TemporaryDirectory()
        chmod(directory.url.path, 0o755)
        let settings = directory.path("cometchat.json")
        try #"{"base_url": "\#(standIns.url)/cometchat/v3", "api_key": "test-api-key"}"#.write(
            toFile: settings, atomically: true, encoding: .utf8)
        let examples = Binaries.packageRoot.appendingPathComponent("config/examples").path
        // A UID the stand-in knows, declared as a's.
        let owned = "bob"
        let d = try ConfiguredDaemon(
            config: """
                [Vault]
                SocketMode=0666

                [Provider cometchat]
                Type=exec
                Command=\(examples)/cometchat-helper --config \(settings)
                Timeout=15s
                MintUsers=\(TestUsers.b)

                [Account cometchat \(owned)]
                Owner=\(TestUsers.a)
                """)
        // a is neither root nor a minter: no token for any UID, with or without a credential.
        let denied = try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "cometchat", "alice", "--from-provider"]),
            saying: "ERR_ACCESS_DENIED")
        #expect(denied.stderr.contains("MintUsers"), "the error says how to get the right: \(denied.stderr)")
        try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "cometchat", "alice"], input: "an-auth-key"),
            saying: "ERR_ACCESS_DENIED")
        // The declared owner mints its own account; the minter and root mint any.
        try expectSuccess(vaultctl(as: TestUsers.a, d.socketPath, ["login", "cometchat", owned, "--from-provider"]))
        try expectSuccess(vaultctl(as: TestUsers.b, d.socketPath, ["login", "cometchat", "alice", "--from-provider"]))
        try expectSuccess(vaultctl(d.socketPath, ["login", "cometchat", "alice", "--from-provider"]))
        let token = try vaultctl(as: TestUsers.b, d.socketPath, ["token", "cometchat", "alice"])
        #expect(token.stdout.hasPrefix("cc_alice_"), "\(token.stderr)")
    }

    @Test("Should hold a user to MaxSessionsPerUser= and MaxSessionSize=, but not root")
    func limits() throws {
        let d = try ConfiguredDaemon(
            config:
                "[Vault]\nSocketMode=0666\nMaxSessionsPerUser=2\nMaxSessionSize=2048\n\n[Provider demo]\nType=static\n")
        let names = (0..<3).map { _ in uniqueName("lim") }
        for name in names.prefix(2) {
            try expectSuccess(
                vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", name], input: "tok_limit_123456789"))
        }
        let third = try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", names[2]], input: "tok_limit_123456789"),
            saying: "ERR_TOO_MANY_SESSIONS")
        #expect(third.stderr.contains("MaxSessionsPerUser"))
        // Another user is not affected, nor root.
        try expectSuccess(
            vaultctl(as: TestUsers.b, d.socketPath, ["login", "demo", names[2]], input: "tok_limit_123456789"))
        for name in names {
            #expect(try vaultctl(d.socketPath, ["login", "demo", name], input: "tok_limit_123456789").status == 0)
        }
        // After a logout there is room again.
        #expect(try vaultctl(as: TestUsers.a, d.socketPath, ["logout", "demo", names[0]]).status == 0)
        try expectSuccess(
            vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", names[2]], input: "tok_limit_123456789"))

        // A record past MaxSessionSize= (a big profile) is refused, for root too.
        let client = try d.client()
        let large = uniqueName("big")
        let big = try client.call(
            "io.vaultd.Vault.Login",
            [
                "provider": "demo", "user": .string(large), "token": "tok_limit_123456789",
                "profile": [
                    "uid": .string(large), "metadata": ["blob": .string(String(repeating: "x", count: 4096))],
                ],
            ])
        #expect(big.error == "io.vaultd.Vault.SessionTooLarge", "\(big)")
        #expect(big.parameters["code"]?.stringValue == "ERR_SESSION_TOO_LARGE")
    }
}
