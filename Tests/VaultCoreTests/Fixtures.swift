import Varlink
import VaultCore

/// Shared fixtures for the VaultCore specifications.
enum Fixtures {
    static let account = Account(provider: "demo", user: "alice")

    /// A caller with the given uid (gid and pid are irrelevant to the domain).
    static func caller(uid: UInt32) -> Caller { Caller(uid: uid, gid: uid, pid: 4242) }

    /// A minimal active record owned by `owner`.
    static func record(
        owner: UInt32 = 1000, account: Account = Fixtures.account, token: String = "tok_abcdefghijklmnopqrstuvwxyz"
    ) -> SessionRecord {
        SessionRecord(
            account: account, user: UserProfile(uid: account.user), tokens: TokenSet(accessToken: Secret(token)),
            createdAt: UnixTime(seconds: 1_700_000_000), expiresAt: nil, ownerUID: owner)
    }

    /// A record with every optional field set.
    static func fullRecord() -> SessionRecord {
        var profile = UserProfile(uid: "alice")
        profile.name = "Alice Liddell"
        profile.avatar = "https://example.com/a.png"
        profile.role = "admin"
        profile.metadata = ["team": "blue", "level": 3, "tags": ["x", "y"]]
        profile.status = "online"
        profile.statusMessage = "in a meeting"
        profile.lastActiveAt = UnixTime(seconds: 1_699_999_000)
        profile.deactivatedAt = UnixTime(seconds: 1_800_000_000)
        var tokens = TokenSet(accessToken: Secret("00Dxx0000001gPL!AQ4AQFhz_access"))
        tokens.refreshToken = Secret("5Aep861refresh_token_value")
        tokens.tokenType = "Bearer"
        tokens.scope = "api refresh_token"
        tokens.instanceURL = "https://example.my.salesforce.com"
        tokens.clientID = "3MVG9client"
        tokens.issuedAt = UnixTime(seconds: 1_700_000_000)
        return SessionRecord(
            account: Account(provider: "salesforce", user: "alice@example.com"), user: profile, tokens: tokens,
            createdAt: UnixTime(seconds: 1_700_000_001), expiresAt: UnixTime(seconds: 1_700_007_200),
            ownerUID: 4_000_000_000)
    }
}
