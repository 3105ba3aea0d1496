import Foundation
import Testing
import Varlink
import VaultCore

/// Encodes bytes as unpadded base64url (RFC 4648 section 5), as JWTs carry them.
private func base64URL(_ text: String) -> String {
    Data(text.utf8).base64EncodedString()
        .replacingOccurrences(of: "+", with: "-")
        .replacingOccurrences(of: "/", with: "_")
        .replacingOccurrences(of: "=", with: "")
}

/// An id_token with the given claims; its signature is never looked at.
private func idToken(_ claims: String) -> String {
    base64URL(#"{"alg":"RS256","typ":"JWT"}"#) + "." + base64URL(claims) + ".c2lnbmF0dXJl"
}

/// A token response carrying an id_token with `claims`.
private func response(_ claims: String) throws -> JSON {
    try JSON.parse(#"{"access_token": "at_1", "token_type": "Bearer", "id_token": "\#(idToken(claims))"}"#)
}

@Suite("Session profiles from id_tokens and helpers", .timeLimit(.minutes(5)))
struct ProfileClaimsTests {
    @Test("Should map an id_token's claims onto the profile: name, picture as avatar, the rest in metadata")
    func claimsMapping() throws {
        let credential = try LoginCredential(
            tokenResponse: try response(
                #"{"sub": "248289761001", "iss": "https://id.example.com", "name": "Jane Doe", "picture": "https://example.com/j.png", "email": "jane@example.com", "email_verified": true, "preferred_username": "jane.d", "given_name": "Jane", "family_name": "Doe", "locale": "en", "aud": "client", "roles": ["admin"], "exp": 4102444800}"#
            ))
        let profile = try #require(credential.profile)
        #expect(profile.uid == "", "the uid is the session's user, set when the record is made")
        #expect(profile.name == "Jane Doe")
        #expect(profile.avatar == "https://example.com/j.png")
        #expect(
            profile.metadata
                == .object([
                    "sub": "248289761001", "iss": "https://id.example.com", "email": "jane@example.com",
                    "email_verified": true, "preferred_username": "jane.d", "given_name": "Jane", "family_name": "Doe",
                    "locale": "en",
                ]))
        #expect(profile.role == nil && profile.status == nil && profile.deactivatedAt == nil)
        #expect(profile.owned(by: "alice").uid == "alice")
        // The id_token is read, never kept: the tokens are the access token's.
        #expect(credential.tokens.accessToken.revealed == "at_1")
    }

    @Test("Should take preferred_username, then nickname, as the name when the token has no name")
    func nameFallbacks() throws {
        let preferred = try LoginCredential(
            tokenResponse: try response(#"{"preferred_username": "jd", "nickname": "J"}"#))
        #expect(preferred.profile?.name == "jd")
        let nickname = try LoginCredential(tokenResponse: try response(#"{"nickname": "J"}"#))
        #expect(nickname.profile?.name == "J")
    }

    @Test("Should leave out claims of the wrong type, and read no profile from a response without an id_token")
    func wrongTypesAndNone() throws {
        let typed = try LoginCredential(
            tokenResponse: try response(#"{"name": 7, "picture": {"url": "x"}, "sub": 12, "email": "a@b.c"}"#))
        #expect(typed.profile?.name == nil)
        #expect(typed.profile?.avatar == nil)
        #expect(typed.profile?.metadata == .object(["email": "a@b.c"]))
        let plain = try LoginCredential(tokenResponse: try JSON.parse(#"{"access_token": "at_1"}"#))
        #expect(plain.profile == nil)
        // Not a JWT, or a payload that is no object: no profile, and the login goes on.
        for bad in ["opaque", "a.b.c", base64URL("{}") + "." + base64URL("[1]") + ".x"] {
            let c = try LoginCredential(
                tokenResponse: .object(["access_token": "at_1", "id_token": .string(bad)]))
            #expect(c.profile == nil, "\(bad)")
        }
    }

    @Test("Should read a helper's profile without a uid, and refuse one of the wrong shape naming the field")
    func providerJSON() throws {
        let profile = try UserProfile(
            providerJSON: try JSON.parse(#"{"name": "Bob", "avatar": "https://x/b.png", "metadata": {"team": "blue"}}"#)
        )
        #expect(profile.name == "Bob")
        #expect(profile.avatar == "https://x/b.png")
        #expect(profile.metadata == .object(["team": "blue"]))
        let foreign = try UserProfile(providerJSON: try JSON.parse(#"{"uid": "mallory", "name": "M"}"#))
        #expect(foreign.owned(by: "bob").uid == "bob", "the helper's uid is not the session's")
        #expect(throws: VaultError.self) { try UserProfile(providerJSON: .string("Bob")) }
        let numeric = try JSON.parse(#"{"name": 42}"#)
        do throws(VaultError) {
            _ = try UserProfile(providerJSON: numeric)
            Issue.record("a numeric name was taken")
        } catch {
            #expect(error.message.contains("profile.name must be a string"))
        }
    }
}
