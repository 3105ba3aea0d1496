import Dispatch
import Glibc
import VaultCore
import VaultSystem

/// Where fresh tokens come from for a provider that can log in or refresh.
public protocol TokenProvider: Sendable {
    /// Obtains tokens for `account` with the provider's own credential
    /// (client credentials, an exec helper's login).
    func login(_ account: Account) async -> RefreshOutcome
    /// New tokens for the session of `record`.
    func refresh(_ record: SessionRecord) async -> RefreshOutcome
    /// True when `refresh` can work for this record.
    func canRefresh(_ record: SessionRecord) -> Bool
    /// Tells the provider the session ended; true when it accepted.
    func revoke(_ record: SessionRecord) async -> Bool
    /// True when the session's end must be told to the provider (`revoke`):
    /// then the revocation is queued in the store before it is attempted.
    func revokes(_ record: SessionRecord) -> Bool
    /// True when the access token of `old`, which a refresh replaced with
    /// `new`, stays valid at the provider until it is revoked
    /// (`revokeReplaced`); the session itself goes on.
    func revokesReplaced(_ old: SessionRecord, by new: TokenSet) -> Bool
    /// Revokes the access token of `old`, which a refresh replaced; true when
    /// the provider accepted (or had nothing to revoke).
    func revokeReplaced(_ old: SessionRecord) async -> Bool
}

extension TokenProvider {
    /// Replaced tokens expire on their own (OAuth 2.0 access tokens): nothing to revoke.
    public func revokesReplaced(_ old: SessionRecord, by new: TokenSet) -> Bool { false }

    /// Nothing to revoke.
    public func revokeReplaced(_ old: SessionRecord) async -> Bool { true }
}

extension OAuth2Client: TokenProvider {
    /// `Grant=`: client credentials, or a JWT bearer assertion for the account's user.
    public func login(_ account: Account) async -> RefreshOutcome {
        switch settings.grant {
        case .clientCredentials: return await clientCredentials()
        case .jwtBearer: return await jwtBearer(subject: account.user)
        }
    }

    public func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        guard let refreshToken = record.tokens.refreshToken else {
            return .permanent(code: VaultError.Code.cannotRefresh.seedCode, reason: "the session has no refresh token")
        }
        return await refresh(using: refreshToken)
    }

    public func canRefresh(_ record: SessionRecord) -> Bool { record.tokens.refreshToken != nil }

    public func revoke(_ record: SessionRecord) async -> Bool {
        guard let refreshToken = record.tokens.refreshToken, settings.revocationURL != nil else { return true }
        return await revoke(refreshToken)
    }

    public func revokes(_ record: SessionRecord) -> Bool {
        record.tokens.refreshToken != nil && settings.revocationURL != nil
    }
}

/// The token source of a session vaultd keeps alive by minting (`Renewal.mint`):
/// its refresh logs the account in anew through the provider (client
/// credentials) when the session holds nothing to refresh with, so that the
/// next token comes ahead of expiry through the refresh's single flight,
/// write-before-serve and `tokenRefreshed`, not after a `tokenExpired` and a
/// gap. Everything else is the provider's own.
public struct MintingRenewal: TokenProvider {
    /// The provider that mints.
    public let provider: any TokenProvider

    /// Renews through `provider`.
    public init(_ provider: any TokenProvider) { self.provider = provider }

    public func login(_ account: Account) async -> RefreshOutcome { await provider.login(account) }

    /// The provider's refresh where it can; else a login with the provider's own credential.
    public func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        guard !provider.canRefresh(record) else { return await provider.refresh(record) }
        return await provider.login(record.account)
    }

    public func canRefresh(_ record: SessionRecord) -> Bool { true }

    public func revoke(_ record: SessionRecord) async -> Bool { await provider.revoke(record) }

    public func revokes(_ record: SessionRecord) -> Bool { provider.revokes(record) }

    public func revokesReplaced(_ old: SessionRecord, by new: TokenSet) -> Bool {
        provider.revokesReplaced(old, by: new)
    }

    public func revokeReplaced(_ old: SessionRecord) async -> Bool { await provider.revokeReplaced(old) }
}
