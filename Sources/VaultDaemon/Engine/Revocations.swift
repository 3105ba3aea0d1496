import VaultCore

/// Telling the provider that a session ended (RFC 7009, or an exec helper's
/// `revoke`). The revocation is in the store before the first attempt (with
/// the session's `loggingOut` mark, or queued on its own for tokens a refresh
/// obtained for a session that had ended), so neither a SIGTERM nor a crash
/// loses it; it leaves the queue only once the provider accepted it. When
/// each attempt goes out is `RevocationQueue`'s decision (see
/// SessionManager+Traffic.swift).
enum Revocations {
    /// One attempt at `revocation`: true when the provider accepted it (it is
    /// then taken out of the store's queue), false when it is to be tried again.
    static func attempt(
        _ revocation: PendingRevocation, provider: any TokenProvider, store: any SessionStore, log: Logger
    ) async -> Bool {
        let accepted =
            revocation.replaced
            ? await provider.revokeReplaced(revocation.record) : await provider.revoke(revocation.record)
        guard accepted else { return false }
        do throws(VaultError) {
            try await store.apply(.deletePendingRevocation(revocation))
        } catch {
            // Asked again at the next start: revoking twice is harmless (RFC 7009 2.2).
            let account = revocation.record.account
            log.warning(
                "a revocation the provider accepted could not be removed from the queue",
                ["provider": account.provider, "user": account.user, "owner": String(revocation.record.ownerUID)])
        }
        return true
    }
}
