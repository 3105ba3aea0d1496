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
    /// The clients that report their own connection to the chat server.
    var clients = ClientConnections()
    /// Work in flight and what it leaves behind, kept out of line: almost
    /// every entry is an idle session with none of it, and an entry is stored
    /// for each of up to 100,000 sessions (104 bytes inline, 8 boxed). A
    /// value: copied before it is changed when another entry shares it.
    private var work: Box<InFlight>?

    /// The login in flight, which later logins join and logouts wait for.
    var login: Task<Result<SessionRecord, VaultError>, Never>? {
        get { work?.value.login }
        set { modifyWork { $0.login = newValue } }
    }
    /// The logout in flight, which later logouts join and logins wait for.
    var logout: Task<Result<Void, VaultError>, Never>? {
        get { work?.value.logout }
        set { modifyWork { $0.logout = newValue } }
    }
    /// The replace in flight (`Login` with `replace`), which logins, logouts
    /// and refreshes wait for.
    var replace: Task<Result<SessionRecord, VaultError>, Never>? {
        get { work?.value.replace }
        set { modifyWork { $0.replace = newValue } }
    }
    /// The refresh in flight: every caller and the scheduler share it.
    var refresh: Task<Result<SessionRecord, VaultError>, Never>? {
        get { work?.value.refresh }
        set { modifyWork { $0.refresh = newValue } }
    }
    /// A revocation a failed logout queued and could not take back: removed
    /// from the store with the next write of the record, so that it never
    /// revokes the session that goes on.
    var unqueue: PendingRevocation? {
        get { work?.value.unqueue }
        set { modifyWork { $0.unqueue = newValue } }
    }
    /// Why vaultd is ending the session, when the provider said (a refused
    /// refresh): the code and message its `tokenInvalid` carries.
    var endCause: EndCause? {
        get { work?.value.endCause }
        set { modifyWork { $0.endCause = newValue } }
    }
    /// Access tokens refreshes replaced, to be revoked once the store holds
    /// their successor (revoking one the store still holds would leave a
    /// crash to restore a dead token).
    var replacedAwaitingSave: [SessionRecord] {
        get { work?.value.replacedAwaitingSave ?? [] }
        set { modifyWork { $0.replacedAwaitingSave = newValue } }
    }

    /// A new entry with nothing in flight.
    init(id: UInt64, machine: AccountStateMachine) {
        self.id = id
        self.machine = machine
    }

    private mutating func modifyWork(_ change: (inout InFlight) -> Void) {
        guard work != nil else {
            var value = InFlight()
            change(&value)
            if !value.isEmpty { work = Box(value) }
            return
        }
        // Shared with a copy of this entry: copy before changing.
        if !isKnownUniquelyReferenced(&work!) { work = Box(work!.value) }
        change(&work!.value)
        if work!.value.isEmpty { work = nil }
    }

    /// Kept while logged out: vaultd logs the account in on its own, or its
    /// failed logins are shown (and their backoff kept).
    var parks: Bool { machine.autoLogin || machine.backoff.consecutiveFailures > 0 }

    /// The record, when the session is logged in.
    var record: SessionRecord? {
        if case .loggedIn(let record) = machine.state { return record }
        return nil
    }
}

/// The parts of an entry that only a session with work in flight has.
private struct InFlight {
    var login: Task<Result<SessionRecord, VaultError>, Never>?
    var logout: Task<Result<Void, VaultError>, Never>?
    var replace: Task<Result<SessionRecord, VaultError>, Never>?
    var refresh: Task<Result<SessionRecord, VaultError>, Never>?
    var unqueue: PendingRevocation?
    var endCause: EndCause?
    var replacedAwaitingSave: [SessionRecord] = []

    var isEmpty: Bool {
        login == nil && logout == nil && replace == nil && refresh == nil && unqueue == nil
            && endCause == nil && replacedAwaitingSave.isEmpty
    }
}

/// A heap cell for a value kept out of line.
private final class Box<Value> {
    var value: Value
    init(_ value: Value) { self.value = value }
}

/// Why vaultd ends a session: what its `tokenInvalid` (or other ending
/// event) carries.
struct EndCause: Sendable {
    /// vaultd's code of the failure, when one ended it.
    var code: VaultError.Code?
    /// What happened, masked by `Redactor`.
    var message: String?
    /// The provider's own code and words, when it refused.
    var providerCode: String?
    var providerMessage: String?

    /// A cause with a message only.
    init(message: String) { self.message = message }

    /// The cause a failure gives.
    init(_ failure: VaultError) {
        code = failure.code
        message = failure.message
        providerCode = failure.providerCode
        providerMessage = failure.providerMessage
    }
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
