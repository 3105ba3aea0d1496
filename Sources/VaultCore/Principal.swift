import Varlink

/// Who acts on a session: a local peer on the socket, or vaultd itself on
/// its own schedule (an expiry, a refresh, a refused grant). vaultd is a
/// principal of its own, not a stand-in uid 0: its audit lines say
/// `actor=vaultd`.
public enum Principal: Sendable, Equatable {
    /// A client, by the credentials of its connection.
    case peer(Caller)
    /// vaultd acting on its own.
    case vaultd

    /// The peer, when it is one.
    public var caller: Caller? {
        if case .peer(let caller) = self { return caller }
        return nil
    }
}

/// The one rule for handing out a token: serve it, refuse, or refresh first.
/// Pure, so that the serving thread's fast path and the session manager's
/// slow path decide alike.
public enum TokenHandout {
    /// What to do with a `GetToken`.
    public enum Decision: Sendable, Equatable {
        /// The token is valid long enough: hand it out.
        case serve
        /// Refresh (or join the refresh in flight), then decide again.
        case refreshFirst
        /// Refuse with this error, without asking the provider.
        case refuse(VaultError)
    }

    /// The facts the decision rests on.
    public struct Facts: Sendable, Equatable {
        /// The account, for messages.
        public var account: Account
        /// When the access token stops being valid, if known.
        public var expiresAt: UnixTime?
        /// When the current access token was issued.
        public var issuedAt: UnixTime
        /// The last successful refresh, if any: from then on the provider's
        /// token lifetime is known.
        public var lastRefreshAt: UnixTime?
        /// Whether the provider can refresh this session at all.
        public var canRefresh: Bool
        /// The least time between two refreshes a client asks for (`MinRefreshInterval=`).
        public var minRefreshIntervalSeconds: Int64

        /// The facts.
        public init(
            account: Account, expiresAt: UnixTime?, issuedAt: UnixTime, lastRefreshAt: UnixTime?, canRefresh: Bool,
            minRefreshIntervalSeconds: Int64
        ) {
            self.account = account
            self.expiresAt = expiresAt
            self.issuedAt = issuedAt
            self.lastRefreshAt = lastRefreshAt
            self.canRefresh = canRefresh
            self.minRefreshIntervalSeconds = minRefreshIntervalSeconds
        }
    }

    /// Serve, refuse or refresh first, for a token wanted valid `minValidSeconds` from `now`.
    public static func decide(_ facts: Facts, minValidSeconds: Int64, now: UnixTime) -> Decision {
        guard let expiresAt = facts.expiresAt, expiresAt <= now.adding(seconds: minValidSeconds) else {
            return .serve
        }
        let account = facts.account
        let what =
            expiresAt <= now
            ? "expired at \(expiresAt)" : "expires at \(expiresAt), before the \(minValidSeconds)s asked for"
        guard facts.canRefresh else {
            return .refuse(VaultError(.tokenExpired, "the token of \(account) \(what); log in again"))
        }
        if let last = facts.lastRefreshAt {
            // The provider's token lifetime is known once it refreshed the session.
            let lifetime = expiresAt.seconds - facts.issuedAt.seconds
            if minValidSeconds >= lifetime {
                return .refuse(
                    VaultError(
                        .tokenExpired,
                        "a token of \(account) lives \(lifetime)s, and \(minValidSeconds)s were asked for; ask for less (minValidSeconds)"
                    ))
            }
            if expiresAt > now, last.adding(seconds: facts.minRefreshIntervalSeconds) > now {
                return .refuse(
                    VaultError(
                        .tokenExpired,
                        "the token of \(account) \(what), and it was refreshed at \(last), less than \(facts.minRefreshIntervalSeconds)s ago (MinRefreshInterval=); ask for less or try again later"
                    ))
            }
        }
        return .refreshFirst
    }
}
