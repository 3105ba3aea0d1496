import VaultCore

/// Access tokens a refresh replaced that stay valid at the provider until
/// they are revoked (a CometChat auth token never expires; the exec helper's
/// refresh mints a new one beside it). Each is revoked through the provider
/// (`TokenProvider.revokeReplaced`, an exec helper's `revoke` with
/// `"replaced": true`), queued in the store first like every revocation, and
/// only once the store holds the token that replaced it.
extension SessionManager {
    /// Remembers the access token of `old`, which a refresh replaced with
    /// `new`, when the provider keeps it valid; revokes it now when the new
    /// tokens are `saved`, else after their write succeeded.
    func noteReplaced(_ key: SessionKey, old: SessionRecord, new: TokenSet, saved: Bool, provider: any TokenProvider)
        async
    {
        guard provider.revokesReplaced(old, by: new), entries[key] != nil else { return }
        var replaced = old
        // Only the access token goes: a refresh token the new tokens kept is the session's.
        if replaced.tokens.refreshToken == new.refreshToken { replaced.tokens.refreshToken = nil }
        entries[key]?.replacedAwaitingSave.append(replaced)
        if saved { await revokeReplacedTokens(key) }
    }

    /// Queues in the store, then starts, the revocation of every replaced
    /// access token of the session `key` waiting for its successor's write.
    /// Called once the store holds the session's current tokens.
    func revokeReplacedTokens(_ key: SessionKey) async {
        guard let waiting = entries[key]?.replacedAwaitingSave, !waiting.isEmpty else { return }
        entries[key]?.replacedAwaitingSave = []
        await revokeReplaced(waiting)
    }

    /// Queues and starts the revocation of each of `records`' access tokens.
    func revokeReplaced(_ records: [SessionRecord]) async {
        for old in records {
            guard let provider = client(for: old.account.provider) else { continue }
            log.info(
                "a refresh replaced the access token; the old one is revoked", fields(old.key, event: "revokeReplaced"))
            await queueRevocation(
                PendingRevocation(replacing: old), provider: provider, event: "revokeReplaced",
                what: "the revocation of a replaced token")
        }
    }
}
