import VaultCore

/// Everything vaultd knows about one session, in one place: its login and
/// logout state, the work in flight on it, and its timed lifecycle. Nothing
/// about a session lives anywhere else in the session manager (its deadlines
/// sit in the manager's one queue, under the session's key).
struct AccountEntry {
    /// Unique per entry: work started for an earlier session of the same key
    /// finds a different id and leaves this entry alone.
    var id: UInt64
    /// Login and logout (see `AccountStateMachine`).
    var machine: AccountStateMachine
    /// Refresh, expiry, backoff and save retry (see `SessionTimers`).
    var timers = SessionTimers()
    /// The login in flight, which later logins join and logouts wait for.
    var login: Task<Result<SessionRecord, VaultError>, Never>?
    /// The logout in flight, which later logouts join and logins wait for.
    var logout: Task<Result<Void, VaultError>, Never>?
    /// The replace in flight (`Login` with `replace`), which logins, logouts
    /// and refreshes wait for.
    var replace: Task<Result<SessionRecord, VaultError>, Never>?
    /// The refresh in flight: every caller and the scheduler share it.
    var refresh: Task<Result<SessionRecord, VaultError>, Never>?
    /// A revocation a failed logout queued and could not take back: removed
    /// from the store with the next write of the record, so that it never
    /// revokes the session that goes on.
    var unqueue: PendingRevocation?
    /// The clients that report their own connection to the chat server.
    var clients = ClientConnections()
    /// Why vaultd is ending the session, when the provider said (a refused
    /// refresh): the code and message its `tokenInvalid` carries.
    var endCause: EndCause?
    /// Access tokens refreshes replaced, to be revoked once the store holds
    /// their successor (revoking one the store still holds would leave a
    /// crash to restore a dead token).
    var replacedAwaitingSave: [SessionRecord] = []

    /// Kept while logged out: vaultd logs the account in on its own, or its
    /// failed logins are shown (and their backoff kept).
    var parks: Bool { machine.autoLogin || machine.backoff.consecutiveFailures > 0 }

    /// The record, when the session is logged in.
    var record: SessionRecord? {
        if case .loggedIn(let record) = machine.state { return record }
        return nil
    }
}

/// What the provider said when it refused a session for good.
struct EndCause: Sendable {
    /// The provider's own code (`invalid_grant`, a helper's `ERR_...`).
    var code: String?
    /// What happened, masked by `Redactor`.
    var message: String?
}

/// One deadline of one session.
struct TimedWork: Hashable, Sendable {
    var key: SessionKey
    var timer: SessionTimers.Timer
}

/// What a logout is, for its event and audit line.
struct LogoutKind {
    var event: EventKind
    var auditAction: String

    init(reason: String?, kind: EventKind?) {
        event = kind ?? (reason == nil ? .logoutSuccess : .kickedOffline)
        switch event {
        case .logoutSuccess: auditAction = "Logout"
        case .tokenExpired: auditAction = "Expire"
        default: auditAction = "ForceLogout"
        }
    }
}
