import Testing
import Varlink
import VaultCore

@testable import VaultDaemon

@Suite("Exec helper answers with a profile", .timeLimit(.minutes(5)))
struct ExecProfileTests {
    /// An unsigned id_token with a name claim.
    static let idToken = "eyJhbGciOiJub25lIn0.eyJuYW1lIjoiRnJvbSBJRCJ9."

    @Test("Should take the profile beside access_token in a helper's answer")
    func profileBesideTokens() throws {
        let answer = try JSON.parse(
            #"{"access_token": "tok_1", "expires_in": 60, "profile": {"name": "Bob", "avatar": "https://x/b.png"}}"#)
        let (credential, error) = try #require(ExecProvider.credential(in: answer))
        #expect(error == nil)
        #expect(credential.tokens.accessToken.revealed == "tok_1")
        #expect(credential.expiresIn == 60)
        #expect(credential.profile?.name == "Bob")
        #expect(credential.profile?.avatar == "https://x/b.png")
    }

    @Test("Should prefer the answer's profile to its id_token's claims, and use the claims without one")
    func profileBeatsIDToken() throws {
        let both = try JSON.parse(
            #"{"access_token": "tok_1", "id_token": "\#(Self.idToken)", "profile": {"name": "Helper"}}"#)
        #expect(ExecProvider.credential(in: both)?.0.profile?.name == "Helper")
        let claimsOnly = try JSON.parse(#"{"access_token": "tok_1", "id_token": "\#(Self.idToken)"}"#)
        #expect(ExecProvider.credential(in: claimsOnly)?.0.profile?.name == "From ID")
        let none = try JSON.parse(#"{"access_token": "tok_1"}"#)
        #expect(ExecProvider.credential(in: none)?.0.profile == nil)
    }

    @Test("Should keep the tokens and drop a malformed profile, saying which field is wrong")
    func malformedProfile() throws {
        let answer = try JSON.parse(#"{"access_token": "tok_1", "profile": {"name": 42}}"#)
        let (credential, error) = try #require(ExecProvider.credential(in: answer))
        #expect(credential.tokens.accessToken.revealed == "tok_1")
        #expect(credential.profile == nil)
        #expect(error?.message.contains("profile.name must be a string") == true)
        #expect(ExecProvider.credential(in: try JSON.parse(#"{"profile": {"name": "x"}}"#)) == nil)
    }
}
