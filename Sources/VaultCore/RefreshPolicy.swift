import Varlink

/// When to refresh and how long to wait after a failure: pure arithmetic, so
/// that the schedule can be tested with a hand-moved clock.
public enum RefreshPolicy {
    /// The refresh deadline: between 80% and 90% of the token's lifetime after
    /// it was issued, at a point fixed per account (`jitter` in 0..<1), so that
    /// a thousand sessions issued together do not refresh together.
    public static func refreshAt(issuedAt: UnixTime, expiresAt: UnixTime, jitter: Double) -> UnixTime {
        let lifetime = max(0, expiresAt.seconds - issuedAt.seconds)
        let fraction = 0.8 + 0.1 * min(max(jitter, 0), 0.999)
        return issuedAt.adding(seconds: Int64((Double(lifetime) * fraction).rounded(.down)))
    }

    /// When tokens issued at `issuedAt` expire: `expiresIn` seconds later
    /// when the server said; else the expiry the access token carries itself
    /// (a JWT's `exp`, `embedded`); else `defaultLifetime` seconds later when
    /// the provider's section sets `DefaultLifetime=`; else never (nil). A
    /// token without an expiry gets no refresh deadline (`SessionTimers`):
    /// CometChat's auth tokens do not expire, and refreshing one on a
    /// schedule would only mint a new token at every turn.
    public static func expiresAt(
        issuedAt: UnixTime, expiresIn: Int64?, embedded: UnixTime? = nil, defaultLifetime: Int64?
    ) -> UnixTime? {
        if let expiresIn { return issuedAt.adding(seconds: expiresIn) }
        if let embedded { return embedded }
        return defaultLifetime.map { issuedAt.adding(seconds: $0) }
    }

    /// A stable number in 0..<1 for an account (FNV-1a of its names).
    public static func jitter(for account: Account) -> Double {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in account.provider.utf8 + [0] + account.user.utf8 {
            hash ^= UInt64(byte)
            hash = hash &* 0x100_0000_01b3
        }
        return Double(hash % 1_000_000) / 1_000_000
    }

    /// The longest `Retry-After` honoured: an hour. A server asking for more
    /// is asked again after an hour, while the still-valid token is served.
    public static let longestRetryAfter: Int64 = 3600

    /// The wait before retry number `attempt` (1 for the first retry): full
    /// jitter between 1 s and min(5 min, 2^attempt s), and never less than
    /// the server's Retry-After, itself capped at `longestRetryAfter`. A
    /// Retry-After gets up to a quarter more at random, so that the sessions
    /// a server turned away together do not all come back in the same second.
    /// `random` is in 0..<1.
    public static func backoff(attempt: Int, random: Double, retryAfter: Int64? = nil) -> Int64 {
        let random = min(max(random, 0), 0.999)
        let ceiling = min(300, Int64(1) << min(max(attempt, 1), 9))
        let wait = max(1, Int64((Double(ceiling) * random).rounded(.up)))
        let asked = min(max(retryAfter ?? 0, 0), longestRetryAfter)
        return max(wait, asked + Int64((Double(asked / 4) * random).rounded(.down)))
    }
}

/// How a session's tokens are renewed ahead of their expiry, at the point
/// `SessionTimers` schedules a refresh, through the same single flight.
public enum Renewal: Sendable, Equatable {
    /// The provider refreshes the session (a refresh token, an exec helper).
    case refresh
    /// The session holds nothing to refresh with, but vaultd keeps the
    /// account logged in on its own (`AutoLogin=yes`): the provider mints
    /// the next token as at a login (client credentials), ahead of expiry,
    /// so that readers see `tokenRefreshed` and never a gap.
    case mint
    /// Neither: the session ends when its token expires.
    case none

    /// How the session is renewed. `refreshes`: the provider can refresh it;
    /// `mints`: the provider issues tokens with its own credential (oauth2,
    /// exec); `keptAlive`: the account is `AutoLogin=yes` and the session is
    /// the one vaultd logs in for it (its `Owner=`'s, or vaultd's own).
    /// A session a client logged in with a token of its own and no refresh
    /// token is not minted for unless vaultd keeps its account alive: at its
    /// expiry vaultd would log that account in itself anyway.
    public static func of(refreshes: Bool, mints: Bool, keptAlive: Bool) -> Renewal {
        if refreshes { return .refresh }
        return mints && keptAlive ? .mint : .none
    }

    /// True when the session is renewed at all: its timers schedule a refresh.
    public var renews: Bool { self != .none }
}

/// Whether a refresh a client asked for (`Refresh`, or `GetToken` wanting a
/// fresher token) may ask the provider now. One local user must not be able
/// to make vaultd hammer a token endpoint with its shared client
/// credentials: a client-asked refresh waits out the backoff of the
/// session's failures (and the server's `Retry-After`), and starts at most
/// once per `MinRefreshInterval=` after the last attempt, failed or not,
/// while the token has not expired.
public enum ClientRefresh {
    /// Nil when the refresh may start at `now`; else the refusal, with the
    /// time it may be tried again (`retryAt`): `refreshBackingOff` while the
    /// backoff lasts, else `refreshTooSoon`.
    public static func refusal(
        _ account: Account, status: RefreshStatus, expired: Bool, minIntervalSeconds: Int64, now: UnixTime
    ) -> VaultError? {
        let backoff = status.nextRetryAt.flatMap { $0 > now ? $0 : nil }
        let interval = status.lastAttemptAt.flatMap { last -> UnixTime? in
            let next = last.adding(seconds: minIntervalSeconds)
            return !expired && next > now ? next : nil
        }
        if let backoff, backoff >= interval ?? backoff {
            var error = VaultError(
                .refreshBackingOff,
                "refreshing \(account) failed \(status.consecutiveFailures) time(s) (\(status.lastError ?? "unknown error")); no refresh is sent before \(backoff), the end of the backoff; the current token is still served"
            )
            error.retryAt = backoff
            return error
        }
        guard let interval, let last = status.lastAttemptAt else { return nil }
        var error = VaultError(
            .refreshTooSoon,
            "the tokens of \(account) were last refreshed (or tried) at \(last), less than \(minIntervalSeconds)s ago (MinRefreshInterval=); they can be refreshed again from \(interval) on"
        )
        error.retryAt = interval
        return error
    }
}

/// How a refresh ended, as the provider reports it.
public enum RefreshOutcome: Sendable, Equatable {
    /// New tokens; `expiresIn` when the server said; `profile` what the
    /// answer said about the user (an id_token's claims, an exec helper's
    /// `profile`), with an empty uid (`LoginCredential.profile`).
    case refreshed(TokenSet, expiresIn: Int64?, profile: UserProfile? = nil)
    /// Worth trying again later: network, timeout, HTTP 5xx or 429, garbage.
    /// `code`: the provider's own code, when it named one (an exec helper's
    /// `error`); `ERR_HELPER_UNAVAILABLE` when the helper could not be run.
    case transient(reason: String, retryAfter: Int64?, code: String? = nil)
    /// The grant is gone (invalid_grant, invalid_client, 401): log the session
    /// out. `code`: the provider's own, or vaultd's seed code where it named
    /// none (`ProviderFailure.permanentKind` sorts it); `reason`: its words.
    case permanent(code: String, reason: String)
}

/// What a provider said of a failure, kept out of line (`RefreshStatus`).
final class ProviderWords: Sendable, Equatable {
    let code: String?
    let message: String?

    /// The words; nil when there are none.
    init?(code: String?, message: String?) {
        guard code != nil || message != nil else { return nil }
        self.code = code
        self.message = message
    }

    static func == (lhs: ProviderWords, rhs: ProviderWords) -> Bool {
        lhs.code == rhs.code && lhs.message == rhs.message
    }
}

/// The connection state of a session, as OpenIM names it.
public enum ConnectionState: String, Sendable {
    case connecting
    case connected
    case connectFailed
}

/// What a session's refresh machinery knows: shown by status, never stored.
public struct RefreshStatus: Sendable, Equatable {
    public var refreshAt: UnixTime?
    public var lastRefreshAt: UnixTime?
    /// When the last refresh, successful or not, ended (`MinRefreshInterval=`
    /// counts from it); not shown.
    public var lastAttemptAt: UnixTime?
    public var consecutiveFailures: Int = 0
    public var lastError: String?
    /// vaultd's code of the last failure (`ERR_NETWORK_ERROR`, ...).
    public var lastErrorCode: String?
    /// The provider's own code of the last failure, when it named one.
    public var lastProviderCode: String? { lastProvider?.code }
    /// What the provider said of the last failure, masked.
    public var lastProviderMessage: String? { lastProvider?.message }
    /// Both, out of line: most sessions never fail, and each holds a status.
    private var lastProvider: ProviderWords?

    /// Keeps what the provider said of `failure` (nothing for nil).
    public mutating func setProviderWords(_ failure: VaultError?) {
        setProviderWords(code: failure?.providerCode, message: failure?.providerMessage)
    }

    /// Keeps the provider's `code` and `message` of the last failure.
    public mutating func setProviderWords(code: String?, message: String?) {
        lastProvider = ProviderWords(code: code, message: message)
    }
    public var nextRetryAt: UnixTime?
    public var connection: ConnectionState?
    /// The latest tokens are in memory only: the store write failed and is retried.
    public var unsaved = false

    /// An empty status.
    public init() {}

    /// The fields as clients see them.
    public func json() -> [String: JSON] {
        var o: [String: JSON] = ["consecutiveFailures": .int(Int64(consecutiveFailures))]
        o["refreshAt"] = refreshAt.map { .int($0.seconds) }
        o["lastRefreshAt"] = lastRefreshAt.map { .int($0.seconds) }
        o["lastError"] = lastError.map(JSON.string)
        o["nextRetryAt"] = nextRetryAt.map { .int($0.seconds) }
        o["connection"] = connection.map { .string($0.rawValue) }
        if unsaved { o["unsaved"] = true }
        o["lastErrorCode"] = lastErrorCode.map(JSON.string)
        o["lastProviderCode"] = lastProviderCode.map(JSON.string)
        o["lastProviderMessage"] = lastProviderMessage.map(JSON.string)
        return o
    }
}
