import Testing
import VaultCore
import VaultProtocol

@testable import VaultDaemon

/// The GetToken reply is written by hand on the hot path; it must be the
/// bytes the generic encoder writes.
@Suite("GetToken reply", .timeLimit(.minutes(5)))
struct TokenReplyTests {
    static func record(expiresAt: Int64?, tokenType: String?, instanceURL: String?) -> SessionRecord {
        var tokens = TokenSet(accessToken: Secret("tok_\"quoted\"_abcdefghijklmnop"))
        tokens.tokenType = tokenType
        tokens.instanceURL = instanceURL
        return SessionRecord(
            account: Account(provider: "p", user: "u"), user: UserProfile(uid: "u"), tokens: tokens,
            createdAt: UnixTime(seconds: 1), expiresAt: expiresAt.map(UnixTime.init(seconds:)), ownerUID: 1000)
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
}
