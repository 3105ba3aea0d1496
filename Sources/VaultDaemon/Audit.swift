import VaultCore

/// The audit trail: one structured line per token handout, login, logout and
/// kick, naming who (uid, pid, executable; or `actor=vaultd` for vaultd's own
/// expiries and refusals), what, which session (account and owner) and the
/// result. Never a secret.
public enum Audit {
    /// Writes one audit line.
    public static func log(_ log: Logger, _ action: String, _ key: SessionKey, by principal: Principal, result: String)
    {
        // Already in key order: an audit line per token handout is on the serving path.
        switch principal {
        case .peer(let caller):
            log.log(
                .notice, "audit",
                sortedFields: [
                    ("action", action), ("exe", caller.executable ?? "?"), ("owner", String(key.owner)),
                    ("pid", String(caller.pid)), ("provider", key.account.provider), ("result", result),
                    ("uid", String(caller.uid)), ("user", key.account.user),
                ])
        case .vaultd:
            log.log(
                .notice, "audit",
                sortedFields: [
                    ("action", action), ("actor", "vaultd"), ("owner", String(key.owner)),
                    ("provider", key.account.provider), ("result", result), ("user", key.account.user),
                ])
        }
    }
}
