import Testing
import VaultCore

@Suite("Account", .timeLimit(.minutes(5)))
struct AccountTests {
    @Test("Should accept usable names, up to 256 bytes")
    func valid() throws {
        #expect(try Account.validate(provider: "demo", user: "alice") == Account(provider: "demo", user: "alice"))
        let long = String(repeating: "é", count: 128)  // 256 bytes
        #expect(try Account.validate(provider: "p", user: long).user == long)
        #expect(try Account.validate(provider: "sales force", user: "alice@example.com").provider == "sales force")
    }

    @Test(
        "Should refuse an empty, too long or control-character name as invalidParameter, naming it",
        arguments: [
            ("", "alice", "provider must not be empty"),
            ("demo", "", "user must not be empty"),
            (String(repeating: "p", count: 257), "alice", "provider is longer than 256 bytes"),
            ("demo", String(repeating: "é", count: 128) + "x", "user is longer than 256 bytes"),
            ("demo", "al\nice", "user must not contain control characters"),
            ("de\u{0}mo", "alice", "provider must not contain control characters"),
            ("demo", "alice\u{7F}", "user must not contain control characters"),
            ("demo", "\u{1F}", "user must not contain control characters"),
        ])
    func invalid(provider: String, user: String, message: String) throws {
        let error = try #require(throws: VaultError.self) { try Account.validate(provider: provider, user: user) }
        #expect(error.code == .invalidParameter)
        #expect(error.message == message)
    }

    @Test("Should print as user @ provider and order by provider then user")
    func describeAndOrder() {
        let accounts = [
            Account(provider: "b", user: "a"), Account(provider: "a", user: "z"), Account(provider: "a", user: "b"),
        ]
        #expect(accounts.sorted().map(\.description) == ["b @ a", "z @ a", "a @ b"])
    }
}
