import VaultCore

/// Access tokens a refresh replaced that stay valid at the provider until
/// they are revoked (a CometChat auth token never expires; the exec helper's
/// refresh mints a new one beside it). Each is revoked through the provider
/// (`TokenProvider.revokeReplaced`, an exec helper's `revoke` with
/// `"replaced": true`), queued in the store first like every revocation, and
/// only once the store holds the token that replaced it.
extension SessionManager {
    /// Remembers the access token of `old`, which a refresh replaced with
    /// `new`, when the provider keeps it valid. Answers its revocation now
    /// when the new tokens are `saved`; else it waits for their write.
    func noteReplaced(_ key: SessionKey, old: SessionRecord, new: TokenSet, saved: Bool, provider: any TokenProvider)
        -> [StoreEffect]
    {
        guard provider.revokesReplaced(old, by: new), entries[key] != nil else { return [] }
        var replaced = old
        // Only the access token goes: a refresh token the new tokens kept is the session's.
        if replaced.tokens.refreshToken == new.refreshToken { replaced.tokens.refreshToken = nil }
        entries[key]?.replacedAwaitingSave.append(replaced)
        return saved ? replacedRevocations(of: key) : []
    }

    /// Takes the replaced access tokens of the session `key` that waited for
    /// their successor's write, and answers their revocations. Called once
    /// the store holds the session's current tokens.
    func replacedRevocations(of key: SessionKey) -> [StoreEffect] {
        guard let waiting = entries[key]?.replacedAwaitingSave, !waiting.isEmpty else { return [] }
        entries[key]?.replacedAwaitingSave = []
        return revocations(ofReplaced: waiting)
    }

    /// The revocation of each of `records`' access tokens.
    func revocations(ofReplaced records: [SessionRecord]) -> [StoreEffect] {
        records.compactMap { old in
            guard let provider = client(for: old.account.provider) else { return nil }
            log.info(
                "a refresh replaced the access token; the old one is revoked", fields(old.key, event: "revokeReplaced"))
            return .queueRevocation(
                PendingRevocation(replacing: old), provider: provider,
                chargedTo: chargedUID(.vaultd, owner: old.ownerUID),
                event: "revokeReplaced", what: "the revocation of a replaced token")
        }
    }
}
