/// The timed part of one session's life, as a value: events go in (the
/// session was stored, a deadline passed, a refresh ended one way or
/// another, a write failed), actions come out (schedule a deadline, start a
/// refresh, write again, end the session, report the connection state). The
/// session manager performs the actions and waits on its injected clock, so
/// every path of refresh, expiry, backoff and save retry can be tested with a
/// hand-moved clock and no I/O. See docs/LIFECYCLE.md.
public struct SessionTimers: Sendable, Equatable {
    /// The deadlines a session may have, at most one of each.
    public enum Timer: String, Sendable, Hashable, CaseIterable {
        /// The access token stops being valid.
        case expire
        /// Time to refresh (ahead of expiry, or the next retry after a failure).
        case refresh
        /// `MaxSessionLifetime=` passed.
        case maxLifetime
        /// Refreshed tokens that could not be written are written again.
        case saveRetry
        /// vaultd logs an `AutoLogin=yes` account in (at start, after its
        /// session ended, after a failed login's backoff): the account's
        /// `AccountStateMachine` decides (`autoLoginDue`), not the timers.
        case login
    }

    /// What the schedule of a session rests on.
    public struct Facts: Sendable, Equatable {
        /// When the access token stops being valid, if known.
        public var expiresAt: UnixTime?
        /// When the current tokens were obtained (login, restore or refresh).
        public var refreshedAt: UnixTime
        /// When the session began, for `MaxSessionLifetime=`.
        public var createdAt: UnixTime
        /// Whether the provider can refresh this session.
        public var canRefresh: Bool
        /// `MaxSessionLifetime=`, in seconds, if set.
        public var maxLifetimeSeconds: Int64?
        /// The account's fixed point in the refresh window (`RefreshPolicy.jitter`).
        public var jitter: Double

        /// The facts.
        public init(
            expiresAt: UnixTime?, refreshedAt: UnixTime, createdAt: UnixTime, canRefresh: Bool,
            maxLifetimeSeconds: Int64?, jitter: Double
        ) {
            self.expiresAt = expiresAt
            self.refreshedAt = refreshedAt
            self.createdAt = createdAt
            self.canRefresh = canRefresh
            self.maxLifetimeSeconds = maxLifetimeSeconds
            self.jitter = jitter
        }
    }

    /// Something that happened to the session.
    public enum Event: Sendable, Equatable {
        /// The session is in the store: logged in, or restored at start-up.
        case stored(Facts, now: UnixTime)
        /// A deadline passed; `expired` says whether the token has expired at `now`.
        case due(Timer, now: UnixTime, expired: Bool)
        /// A refresh was started (by a deadline or a client).
        case refreshStarted
        /// The refresh got new tokens; `saved` says whether they are in the store.
        case refreshed(Facts, saved: Bool, now: UnixTime)
        /// The refresh failed in a way worth retrying (`failure`: vaultd's
        /// code and message, the provider's code and message); `random` in
        /// 0..<1 picks the backoff, counted from `now` (when it failed,
        /// rounded up: `WallClock.nextSecond()`, so that the retry waits at
        /// least the backoff and a server's Retry-After).
        case refreshFailed(VaultError, retryAfter: Int64?, random: Double, now: UnixTime, expired: Bool)
        /// The provider refused for good (invalid_grant, 401, ...).
        case refreshRefused(code: String, reason: String)
        /// The refresh found the session gone or replaced; nothing to do.
        case refreshAbandoned
        /// The retried write of refreshed tokens succeeded.
        case saved
        /// The retried write failed again.
        case saveFailed(now: UnixTime)
        /// The store no longer holds the session as it is served (a failed
        /// logout whose mark could not be taken back): write it again.
        case storeStale(now: UnixTime)
        /// A refresh the schedule started could not begin: the provider can no
        /// longer refresh the session (a reload removed it, or it lost its
        /// refresh token). `expired`: the token has expired.
        case refreshImpossible(expired: Bool)
        /// Ending the session failed (its logout could not be written): try again.
        case endFailed(reason: String, kind: EventKind, now: UnixTime)
        /// The session's tokens were replaced by a client (`Login` with
        /// `replace`) and the new ones are in the store: what was known of the
        /// old tokens (failures, a refused grant, an end still to be done) is
        /// forgotten, and the new tokens are scheduled as at a login.
        case replaced(Facts, now: UnixTime)
    }

    /// What the owner of the session must do.
    public enum Action: Sendable, Equatable {
        /// Arm `timer` at `at`, replacing an earlier deadline of it.
        case schedule(Timer, at: UnixTime)
        /// Disarm `timer`.
        case cancel(Timer)
        /// Start a refresh (none is in flight).
        case startRefresh
        /// Write the current record again.
        case persist
        /// End the session: log it out as vaultd, with this reason and event.
        case end(reason: String, kind: EventKind)
        /// The connection state changed: tell subscribers (`connectionChanged`),
        /// with the failure for `connectFailed` (its codes and messages, as
        /// OpenIM's `onConnectFailed(code, err)`).
        case connection(ConnectionState, failure: VaultError? = nil)
    }

    /// How long refreshed tokens that could not be written wait before the next write.
    public static let saveRetrySeconds: Int64 = 5

    /// Refresh bookkeeping, as `vaultctl status` shows it.
    public private(set) var status = RefreshStatus()
    /// A refresh is in flight.
    public private(set) var refreshing = false
    /// The token expired while a refresh was in flight (or started because of
    /// it): if that refresh fails, the session ends as `tokenExpired`.
    public private(set) var expiredWhileRefreshing = false
    /// The provider can refresh the session (from the last facts).
    public private(set) var canRefresh = false
    /// The provider refused the session's grant for good: it is never sent
    /// again (a dead refresh token sent over and over is a storm), and the
    /// session is ended until that succeeds.
    public private(set) var refused = false
    /// The end still to be done, when ending failed.
    public private(set) var pendingEnd: (reason: String, kind: EventKind)?
    /// The access token has an expiry (from the last facts). A token without
    /// one is never refreshed on a schedule: no refresh deadline, and no retry
    /// after a failed refresh a client asked for (the token stays valid; the
    /// client got the error and may ask again once the backoff, `nextRetryAt`, ended).
    public private(set) var expires = true

    public static func == (lhs: SessionTimers, rhs: SessionTimers) -> Bool {
        lhs.status == rhs.status && lhs.refreshing == rhs.refreshing
            && lhs.expiredWhileRefreshing == rhs.expiredWhileRefreshing && lhs.canRefresh == rhs.canRefresh
            && lhs.refused == rhs.refused && lhs.pendingEnd?.reason == rhs.pendingEnd?.reason
            && lhs.pendingEnd?.kind == rhs.pendingEnd?.kind && lhs.expires == rhs.expires
    }

    /// A session with no schedule yet.
    public init() {}

    /// Takes `event` and returns what to do, in order.
    public mutating func handle(_ event: Event) -> [Action] {
        switch event {
        case .stored(let facts, let now):
            return schedule(facts, now: now)
        case .due(.expire, _, let expired):
            guard expired else { return [] }
            // After a suspend or a restart past the expiry a refresh may still
            // work: only a session that cannot be refreshed now ends at once.
            guard canRefresh else {
                return [.end(reason: "tokenExpired", kind: .tokenExpired)]
            }
            expiredWhileRefreshing = true
            return refreshing ? [] : [.startRefresh]
        case .due(.refresh, _, _):
            if let pendingEnd { return [.end(reason: pendingEnd.reason, kind: pendingEnd.kind)] }
            return refreshing || refused ? [] : [.startRefresh]
        case .due(.maxLifetime, _, _):
            return [.end(reason: "maxSessionLifetime", kind: .tokenInvalid)]
        case .due(.saveRetry, _, _):
            return status.unsaved ? [.persist] : []
        case .due(.login, _, _):
            return []
        case .refreshStarted:
            refreshing = true
            // A refresh of a connected session leaves it connected: subscribers
            // hear of a change of state only.
            guard status.connection != .connected, status.connection != .connecting else { return [] }
            status.connection = .connecting
            return [.connection(.connecting)]
        case .refreshed(let facts, let saved, let now):
            refreshing = false
            expiredWhileRefreshing = false
            status.lastRefreshAt = now
            status.lastAttemptAt = now
            status.consecutiveFailures = 0
            status.lastError = nil
            status.nextRetryAt = nil
            status.lastErrorCode = nil
            status.setProviderWords(nil)
            status.unsaved = !saved
            var actions = schedule(facts, now: now)
            actions.append(
                saved ? .cancel(.saveRetry) : .schedule(.saveRetry, at: now.adding(seconds: Self.saveRetrySeconds)))
            if status.connection != .connected { actions.append(.connection(.connected)) }
            status.connection = .connected
            return actions
        case .refreshFailed(let failure, let retryAfter, let random, let now, let expired):
            refreshing = false
            // Told when the state changes (each retry starts as `connecting`).
            let news = status.connection != .connectFailed
            status.consecutiveFailures += 1
            status.lastAttemptAt = now
            status.lastError = failure.message
            status.lastErrorCode = failure.code.seedCode
            status.setProviderWords(failure)
            status.connection = .connectFailed
            let told: [Action] = news ? [.connection(.connectFailed, failure: failure)] : []
            if expired && expiredWhileRefreshing {
                expiredWhileRefreshing = false
                return told + [.end(reason: "tokenExpired", kind: .tokenExpired)]
            }
            let wait = RefreshPolicy.backoff(
                attempt: status.consecutiveFailures, random: random, retryAfter: retryAfter)
            // A client asking again waits this out too (`ClientRefresh`).
            status.nextRetryAt = now.adding(seconds: wait)
            guard expires else { return told }
            return [.schedule(.refresh, at: now.adding(seconds: wait))] + told
        case .refreshRefused(_, let reason):
            refreshing = false
            refused = true
            status.lastError = reason
            return [.end(reason: "tokenInvalid", kind: .tokenInvalid)]
        case .refreshAbandoned:
            refreshing = false
            expiredWhileRefreshing = false
            return []
        case .saved:
            status.unsaved = false
            return [.cancel(.saveRetry)]
        case .saveFailed(let now):
            return [.schedule(.saveRetry, at: now.adding(seconds: Self.saveRetrySeconds))]
        case .refreshImpossible(let expired):
            refreshing = false
            canRefresh = false
            status.refreshAt = nil
            let ended = expired && expiredWhileRefreshing
            expiredWhileRefreshing = false
            return ended ? [.cancel(.refresh), .end(reason: "tokenExpired", kind: .tokenExpired)] : [.cancel(.refresh)]
        case .endFailed(let reason, let kind, let now):
            pendingEnd = (reason, kind)
            return [.schedule(.refresh, at: now.adding(seconds: Self.saveRetrySeconds))]
        case .storeStale(let now):
            status.unsaved = true
            return [.schedule(.saveRetry, at: now.adding(seconds: Self.saveRetrySeconds))]
        case .replaced(let facts, let now):
            self = SessionTimers()
            return schedule(facts, now: now) + [.cancel(.saveRetry)]
        }
    }

    /// The longest an overdue refresh waits for its turn (see `refreshAt(_:now:)`).
    public static let overdueSpreadSeconds: Int64 = 30

    /// When to refresh a session whose tokens expire at `expiresAt`: at its
    /// point 80-90% into the lifetime (`RefreshPolicy.refreshAt`), and at
    /// least a second from now. A refresh that is overdue (its point passed
    /// while vaultd was stopped or the machine slept) comes at now + 1 s plus
    /// the account's jitter times a window of at most `overdueSpreadSeconds`,
    /// a tenth of the lifetime and, while the token is valid, half of what is
    /// left of it: after a restart, a thousand overdue sessions refresh
    /// spread over that window instead of all in the same second.
    public static func refreshAt(_ facts: Facts, expiresAt: UnixTime, now: UnixTime) -> UnixTime {
        let planned = RefreshPolicy.refreshAt(issuedAt: facts.refreshedAt, expiresAt: expiresAt, jitter: facts.jitter)
        let soonest = now.adding(seconds: 1)
        guard planned < soonest else { return planned }
        var window = min(overdueSpreadSeconds, max(0, expiresAt.seconds - facts.refreshedAt.seconds) / 10)
        let left = expiresAt.seconds - soonest.seconds
        if left > 0 { window = min(window, left / 2) }
        let jitter = min(max(facts.jitter, 0), 0.999)
        return soonest.adding(seconds: Int64((Double(window) * jitter).rounded(.down)))
    }

    /// The hard expiry, the refresh (80-90% into the lifetime, at most one a
    /// second, overdue ones spread) and the maximum lifetime of a session.
    private mutating func schedule(_ facts: Facts, now: UnixTime) -> [Action] {
        canRefresh = facts.canRefresh
        expires = facts.expiresAt != nil
        var actions: [Action] = []
        // A token that expired while vaultd was stopped, and can be refreshed,
        // is refreshed at its spread refresh time like any overdue one (a
        // client asking for it meanwhile gets it refreshed at once): its expiry
        // comes due with that refresh, not all of them together at start-up.
        let refreshAt = facts.expiresAt.flatMap {
            facts.canRefresh ? Self.refreshAt(facts, expiresAt: $0, now: now) : nil
        }
        if let expiresAt = facts.expiresAt {
            let expiredRefreshable = expiresAt <= now && refreshAt != nil
            actions.append(.schedule(.expire, at: expiredRefreshable ? max(expiresAt, refreshAt!) : expiresAt))
        } else {
            actions.append(.cancel(.expire))
        }
        if let at = refreshAt {
            status.refreshAt = at
            actions.append(.schedule(.refresh, at: at))
        } else {
            status.refreshAt = nil
            actions.append(.cancel(.refresh))
        }
        if let maximum = facts.maxLifetimeSeconds {
            actions.append(.schedule(.maxLifetime, at: facts.createdAt.adding(seconds: maximum)))
        }
        return actions
    }
}
