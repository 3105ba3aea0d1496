import Foundation
import Testing
import Varlink
import VaultCore

/// Session profiles (CometChat's User fields) from each of their sources:
/// `vaultctl login --profile-file`, an exec helper's answer and an
/// id_token's claims, as GetSession (`vaultctl --json status`), `vaultctl
/// status` and `vaultctl list --json` show them, with the real vaultd, the
/// real token server and real helper processes.
@Suite("Session profiles", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ProfileTests {
    /// The claims the token server puts in its id_tokens.
    static let claims =
        #"{"sub": "248289761001", "name": "Jane Doe", "picture": "https://example.com/jane.png", "email": "jane@example.com", "email_verified": true, "preferred_username": "jane.d", "roles": ["admin"]}"#

    /// What `--json status PROVIDER USER` (GetSession) answers: the session.
    func session(_ fixture: DaemonFixture, _ provider: String, _ user: String) throws -> JSON {
        let result = try expectSuccess(vaultctl(fixture.socketPath, ["--json", "status", provider, user]))
        return try JSON.parse(result.stdout)["session"] ?? .null
    }

    /// The profile of `provider USER` in `vaultctl list --json`.
    func listed(_ fixture: DaemonFixture, _ provider: String, _ user: String) throws -> JSON? {
        let result = try expectSuccess(vaultctl(fixture.socketPath, ["--json", "list"]))
        let sessions = try JSON.parse(result.stdout)["sessions"]?.arrayValue ?? []
        return sessions.first {
            $0["provider"]?.stringValue == provider && $0["user"]?.stringValue == user
        }?["profile"]
    }

    /// A helper that logs in with a fresh token and answers `profile` beside
    /// it (nothing when nil); refresh and revoke answer as the example does.
    func helper(_ dir: TemporaryDirectory, profile: String?) throws -> String {
        let path = dir.path("profile-helper")
        let extra = profile.map { #", "profile": \#($0)"# } ?? ""
        try writeExecutable(
            """
            #!/bin/sh
            input=$(cat)
            case "$input" in
            *'"action":"revoke"'*) echo '{}' ;;
            *) echo '{"access_token": "tok_'$(od -An -N8 -tx1 /dev/urandom | tr -d ' \\n')'", "expires_in": 3600\(extra)}' ;;
            esac
            """, to: path)
        return path
    }

    @Test("Should show the profile of --profile-file in GetSession, status and list --json")
    func profileFile() throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("alice")
        let file = fixture.directory.path("alice.json")
        try
            #"{"name": "Alice Liddell", "avatar": "https://example.com/alice.png", "role": "admin", "metadata": {"team": "red"}}"#
            .write(toFile: file, atomically: true, encoding: .utf8)
        try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "demo", user, "--profile-file", file], input: "tok_\(user)"))

        let profile = try session(fixture, "demo", user)["profile"]
        #expect(profile?["uid"]?.stringValue == user, "a file without uid gets the user's")
        #expect(profile?["name"]?.stringValue == "Alice Liddell")
        #expect(profile?["avatar"]?.stringValue == "https://example.com/alice.png")
        #expect(profile?["role"]?.stringValue == "admin")
        #expect(profile?["metadata"]?["team"]?.stringValue == "red")
        #expect(try listed(fixture, "demo", user) == profile)
        let text = try vaultctl(fixture.socketPath, ["status", "demo", user]).stdout
        #expect(text.contains("Name:          Alice Liddell"), "\(text)")
        #expect(text.contains("Avatar:        https://example.com/alice.png"), "\(text)")
    }

    @Test("Should refuse an unreadable, malformed or oversized --profile-file, naming the file")
    func badProfileFiles() throws {
        let fixture = try DaemonFixture()
        let user = uniqueName("bad")
        let missing = fixture.directory.path("missing.json")
        let unreadable = try vaultctl(
            fixture.socketPath, ["login", "demo", user, "--profile-file", missing], input: "tok_x")
        #expect(unreadable.status == 2)
        #expect(
            unreadable.stderr.hasPrefix("vaultctl: cannot read the profile file \(missing)"), "\(unreadable.stderr)")
        #expect(unreadable.stderr.contains("(ERR_INVALID_PARAMETER)"), "\(unreadable.stderr)")

        let cases = [
            ("broken.json", #"{"name": "Al"#, "is not valid JSON"),
            ("array.json", #"["Alice"]"#, "holds a JSON array, not an object"),
            ("typed.json", #"{"name": 7}"#, "profile.name must be a string"),
        ]
        for (name, text, expected) in cases {
            let file = fixture.directory.path(name)
            try text.write(toFile: file, atomically: true, encoding: .utf8)
            let refused = try vaultctl(
                fixture.socketPath, ["login", "demo", user, "--profile-file", file], input: "tok_x")
            #expect(refused.status == 2, "\(name)")
            #expect(refused.stderr.hasPrefix("vaultctl: the profile file \(file)"), "\(refused.stderr)")
            #expect(refused.stderr.contains(expected), "\(refused.stderr)")
        }
        // Another user's uid is vaultd's to refuse: a profile belongs to its session.
        let other = fixture.directory.path("other.json")
        try #"{"uid": "mallory", "name": "Mallory"}"#.write(toFile: other, atomically: true, encoding: .utf8)
        try expectFailure(
            vaultctl(fixture.socketPath, ["login", "demo", user, "--profile-file", other], input: "tok_x"),
            saying: "differs from user")
        // Larger than MaxSessionSize= (32 KiB by default): refused, nothing stored.
        let huge = fixture.directory.path("huge.json")
        try #"{"name": "Big", "metadata": {"bio": "\#(String(repeating: "x", count: 40_000))"}}"#
            .write(toFile: huge, atomically: true, encoding: .utf8)
        try expectFailure(
            vaultctl(fixture.socketPath, ["login", "demo", user, "--profile-file", huge], input: "tok_x"),
            saying: "ERR_SESSION_TOO_LARGE")
        #expect(try vaultctl(fixture.socketPath, ["status", "demo", user]).status == 1)
    }

    @Test("Should keep the profile an exec helper answers, unless the client gives its own")
    func helperProfile() async throws {
        let dir = try TemporaryDirectory()
        let command = try helper(
            dir,
            profile: #"{"name": "Bob Builder", "avatar": "https://example.com/bob.png", "metadata": {"team": "blue"}}"#)
        let bot = uniqueName("bot")
        let fixture = try DaemonFixture(
            config: """
                [Provider chat]
                Type=exec
                Command=\(command)
                Timeout=15s

                [Account chat \(bot)]
                AutoLogin=yes
                """)

        let user = uniqueName("bob")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "chat", user, "--from-provider"]))
        let profile = try session(fixture, "chat", user)["profile"]
        #expect(profile?["uid"]?.stringValue == user)
        #expect(profile?["name"]?.stringValue == "Bob Builder")
        #expect(profile?["avatar"]?.stringValue == "https://example.com/bob.png")
        #expect(profile?["metadata"]?["team"]?.stringValue == "blue")
        #expect(try listed(fixture, "chat", user) == profile)
        let text = try vaultctl(fixture.socketPath, ["status", "chat", user]).stdout
        #expect(text.contains("Name:          Bob Builder"), "\(text)")

        // An account vaultd logs in by itself gets the helper's profile too.
        let auto = try await eventually(
            { try vaultctl(fixture.socketPath, ["--json", "status", "chat", bot]) },
            until: { (try? JSON.parse($0.stdout))?["session"]?["state"]?.stringValue == "logged" })
        #expect(try JSON.parse(auto.stdout)["session"]?["profile"]?["name"]?.stringValue == "Bob Builder")

        // The client's profile wins over the helper's.
        let other = uniqueName("carol")
        let file = dir.path("carol.json")
        try #"{"name": "Carol"}"#.write(toFile: file, atomically: true, encoding: .utf8)
        try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "chat", other, "--from-provider", "--profile-file", file]))
        let carol = try session(fixture, "chat", other)["profile"]
        #expect(carol?["name"]?.stringValue == "Carol")
        #expect(carol?["avatar"] == nil)
    }

    @Test("Should log in with the tokens and no profile when the helper's profile is malformed")
    func malformedHelperProfile() throws {
        let dir = try TemporaryDirectory()
        let command = try helper(dir, profile: #"{"name": 42}"#)
        let fixture = try DaemonFixture(
            config: "[Provider chat]\nType=exec\nCommand=\(command)\nTimeout=15s\n", start: false)
        let daemon = try fixture.start()
        let user = uniqueName("dave")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "chat", user, "--from-provider"]))
        let profile = try session(fixture, "chat", user)["profile"]
        #expect(profile == .object(["uid": .string(user)]))
        #expect(daemon.output.wait(for: "profile.name must be a string"), "\(daemon.output.text)")
    }

    @Test("Should read an id_token's claims into the profile, from a client's token response and a minted one")
    func idTokenProfile() async throws {
        let server = try TokenServer(["--lifetime", "600", "--id-token", Self.claims])
        let fixture = try DaemonFixture(oauthServer: server, start: true)

        // The client pipes the token endpoint's answer, id_token included.
        let user = uniqueName("jane")
        let response = try await server.grant()
        let idToken = try #require(try JSON.parse(response)["id_token"]?.stringValue)
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: response))
        let profile = try session(fixture, "oauth", user)["profile"]
        #expect(profile?["uid"]?.stringValue == user, "the uid is the session's user, not the token's sub")
        #expect(profile?["name"]?.stringValue == "Jane Doe")
        #expect(profile?["avatar"]?.stringValue == "https://example.com/jane.png")
        #expect(profile?["metadata"]?["sub"]?.stringValue == "248289761001")
        #expect(profile?["metadata"]?["email"]?.stringValue == "jane@example.com")
        #expect(profile?["metadata"]?["email_verified"]?.boolValue == true)
        #expect(profile?["metadata"]?["preferred_username"]?.stringValue == "jane.d")
        #expect(profile?["metadata"]?["roles"] == nil, "only the profile's claims are kept")
        #expect(try listed(fixture, "oauth", user) == profile)
        let text = try vaultctl(fixture.socketPath, ["status", "oauth", user]).stdout
        #expect(text.contains("Name:          Jane Doe"), "\(text)")
        #expect(text.contains("Avatar:        https://example.com/jane.png"), "\(text)")
        #expect(text.contains("Email:         jane@example.com"), "\(text)")
        // The id_token itself is neither kept nor shown.
        let list = try vaultctl(fixture.socketPath, ["--json", "list"]).stdout
        #expect(!list.contains(idToken) && !list.contains(String(idToken.prefix(20))))

        // vaultd mints by client credentials: the same claims.
        let minted = uniqueName("mint")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", minted, "--from-provider"]))
        let mintedProfile = try session(fixture, "oauth", minted)["profile"]
        #expect(mintedProfile?["uid"]?.stringValue == minted)
        #expect(mintedProfile?["name"]?.stringValue == "Jane Doe")
        #expect(mintedProfile?["metadata"]?["sub"]?.stringValue == "248289761001")
    }
}
