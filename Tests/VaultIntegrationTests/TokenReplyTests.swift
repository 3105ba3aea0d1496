import Testing
import Varlink
import VaultCore
import VaultProtocol

@testable import VaultDaemon

/// The GetToken reply is written by hand on the hot path; it must be the
/// bytes the generic encoder writes.
@Suite("GetToken reply", .ownThreads, .timeLimit(.minutes(5)))
struct TokenReplyTests {
    static func record(
        expiresAt: Int64?, tokenType: String?, instanceURL: String?,
        token: String = "tok_\"quoted\"_abcdefghijklmnop", ownerUID: UInt32 = 1000, scope: String? = nil
    ) -> SessionRecord {
        var tokens = TokenSet(accessToken: Secret(token))
        tokens.scope = scope
        tokens.tokenType = tokenType
        tokens.instanceURL = instanceURL
        return SessionRecord(
            account: Account(provider: "p", user: "u"), user: UserProfile(uid: "u"), tokens: tokens,
            createdAt: UnixTime(seconds: 1), expiresAt: expiresAt.map(UnixTime.init(seconds:)), ownerUID: ownerUID)
    }

    @Test(
        "Should write the same bytes as the generic encoder, with and without each optional field",
        arguments: [
            (Int64?.none, String?.none, String?.none), (1_700_000_000, "Bearer", "https://x.my.salesforce.com"),
            (1_700_000_000, nil, nil), (nil, "Bearer", nil), (nil, nil, "https://x.example"),
        ])
    func sameAsGeneric(expiresAt: Int64?, tokenType: String?, instanceURL: String?) {
        let record = Self.record(expiresAt: expiresAt, tokenType: tokenType, instanceURL: instanceURL)
        var direct: [UInt8] = []
        VaultMethods.writeTokenReply(record, into: &direct)
        #expect(
            String(decoding: direct, as: UTF8.self)
                == String(decoding: VarlinkReply(parameters: VaultMethods.tokenReply(record)).encoded(), as: UTF8.self))
    }

    @Test(
        "Should write the same bytes as the generic encoder with the scope granted, plain or escaped",
        arguments: ["api refresh_token", "read \"x\" a\\b", ""])
    func withScope(scope: String) {
        let record = Self.record(expiresAt: 1_700_000_000, tokenType: "Bearer", instanceURL: nil, scope: scope)
        var direct: [UInt8] = []
        VaultMethods.writeTokenReply(record, into: &direct)
        let generic = VaultMethods.tokenReply(record)
        #expect(generic["scope"] == .string(scope))
        #expect(
            String(decoding: direct, as: UTF8.self)
                == String(decoding: VarlinkReply(parameters: generic).encoded(), as: UTF8.self))
    }

    @Test(
        "Should write the same bytes as the generic encoder when no string needs an escape, and when one does",
        arguments: [
            ("tok_plain_abcdefghijklmnop", Int64?.some(1_700_000_000), String?.some("Bearer"), String?.none),
            ("tok_plain_abcdefghijklmnop", nil, nil, "https://x.my.salesforce.com"),
            ("tok_plain_abcdefghijklmnop", -5, "Bear\"er", nil),
            ("tok_\u{1}control", 0, nil, nil),
            ("tok_back\\slash", 9_999_999_999_999_999, nil, "https://x.example/a\"b"),
            (String(repeating: "t", count: 4096), 1_700_000_000, "Bearer", "https://x.example"),
            ("jwt.ey\u{e9}\u{1F600}", 42, "Bearer", nil),
        ])
    func plainAndEscaped(token: String, expiresAt: Int64?, tokenType: String?, instanceURL: String?) {
        let record = Self.record(
            expiresAt: expiresAt, tokenType: tokenType, instanceURL: instanceURL, token: token, ownerUID: 0)
        var direct: [UInt8] = Array("prefix".utf8)
        VaultMethods.writeTokenReply(record, into: &direct)
        #expect(
            String(decoding: direct, as: UTF8.self)
                == "prefix"
                + String(decoding: VarlinkReply(parameters: VaultMethods.tokenReply(record)).encoded(), as: UTF8.self))
    }
}
