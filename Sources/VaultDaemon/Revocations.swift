import VaultCore

/// Telling the provider that a session ended (RFC 7009, or an exec helper's
/// `revoke`). The revocation is in the store before the first attempt (with
/// the session's `loggingOut` mark, or queued on its own for tokens a refresh
/// obtained for a session that had ended), so neither a SIGTERM nor a crash
/// loses it; it leaves the queue only once the provider accepted it.
enum Revocations {
    /// How many attempts one run makes (about ten minutes with the backoff)
    /// before it leaves the revocation queued for the next start.
    static let attempts = 10

    /// Attempts `revocation` with backoff until the provider accepts it, the
    /// attempts run out or the task is cancelled (vaultd is stopping); in the
    /// last two cases it stays queued.
    static func run(
        _ revocation: PendingRevocation, provider: any TokenProvider, store: any SessionStore, log: Logger,
        clock: any WallClock, random: @escaping @Sendable () -> Double
    ) async {
        let account = revocation.record.account
        let fields = ["provider": account.provider, "user": account.user, "owner": String(revocation.record.ownerUID)]
        for attempt in 1...attempts {
            if Task.isCancelled { return }
            let accepted =
                revocation.replaced
                ? await provider.revokeReplaced(revocation.record) : await provider.revoke(revocation.record)
            if accepted {
                do throws(VaultError) {
                    try await store.deletePendingRevocation(revocation)
                } catch {
                    // Asked again at the next start: revoking twice is harmless (RFC 7009 2.2).
                    log.warning("a revocation the provider accepted could not be removed from the queue", fields)
                }
                return
            }
            let wait = RefreshPolicy.backoff(attempt: attempt, random: random())
            do { try await clock.sleep(until: clock.preciseNow() + Double(wait)) } catch { return }
        }
        log.warning(
            "the token could not be revoked at the provider; it stays queued for the next start",
            fields.merging(["event": "revokeFailed"]) { a, _ in a })
    }
}
