/// Who is asking: the Unix credentials of the peer of a connection.
public struct Caller: Sendable, Equatable {
    public var uid: UInt32
    public var gid: UInt32
    public var pid: Int32
    /// Supplementary groups (SO_PEERGROUPS).
    public var groups: [UInt32]
    /// The peer's executable, for the audit log, when it could be read.
    public var executable: String?

    /// Makes a caller from peer credentials.
    public init(uid: UInt32, gid: UInt32, pid: Int32, groups: [UInt32] = [], executable: String? = nil) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.groups = groups
        self.executable = executable
    }

    /// True for root.
    public var isRoot: Bool { uid == 0 }

    /// The primary and the supplementary groups.
    public var allGroups: Set<UInt32> { Set(groups).union([gid]) }
}

/// The lifecycle of one account, as a value: events go in, actions come out,
/// and the owner of the state (the session manager) performs them. Keeping it
/// pure lets every interleaving of logins and logouts be tested without I/O.
/// Who may ask is not its business: `AccessPolicy` decides that before.
public struct AccountStateMachine: Sendable {
    /// Where the account is.
    public enum State: Sendable, Equatable {
        case loggedOut
        case loggingIn
        case loggedIn(SessionRecord)
        case loggingOut(SessionRecord)
        /// A replacing credential is being written; the record is the one it
        /// replaces, which stays served until the new one is in the store.
        case replacing(SessionRecord)

        /// The state as clients see it (OpenIM's three states).
        public var loginState: LoginState {
            switch self {
            case .loggedOut: return .logout
            case .loggingIn: return .logging
            case .loggedIn, .loggingOut, .replacing: return .logged
            }
        }
    }

    /// What to do about a login request.
    public enum LoginAction: Sendable, Equatable {
        /// Already logged in: answer with the existing session (CometChat).
        case returnExisting(SessionRecord)
        /// A login is in flight: wait for it and answer with its result (OpenIM).
        case joinInFlight
        /// A logout is in flight: wait for it to finish, then ask again.
        case waitThenRetry
        /// Write the new session to the store, then call `loginSucceeded` or `loginFailed`.
        case startLogin
        /// Replace the tokens of this logged-in session (`Login` with
        /// `replace`): write the new record, then call `replaceFinished`.
        case startReplace(SessionRecord)
    }

    /// What to do about a logout request.
    public enum LogoutAction: Sendable, Equatable {
        /// Mark the stored record logging-out, finish, delete; then call `logoutFinished`.
        case startLogout(SessionRecord)
        /// A logout is in flight: wait for it and answer with its result.
        case joinInFlight
        /// A login is in flight: wait for it to finish, then ask again.
        case waitThenRetry
        /// Refuse.
        case fail(VaultError)
    }

    /// The account this machine tracks.
    public let account: Account
    /// The current state.
    public private(set) var state: State

    /// A machine for `account` in `state` (restored records start `loggedIn`).
    public init(account: Account, state: State = .loggedOut) {
        self.account = account
        self.state = state
    }

    /// A login was asked for.
    public mutating func loginRequested() -> LoginAction {
        switch state {
        case .loggedOut:
            state = .loggingIn
            return .startLogin
        case .loggingIn:
            return .joinInFlight
        case .loggingOut:
            return .waitThenRetry
        case .loggedIn(let record):
            return .returnExisting(record)
        case .replacing:
            // Answered with the session as the replace leaves it.
            return .waitThenRetry
        }
    }

    /// A login that replaces the credential of a logged-in session was asked
    /// for (`Login` with `replace`). A logged-out account is logged in as by
    /// `loginRequested`; a login, logout or replace in flight is waited for
    /// first (a login in flight is not joined: its credential is not this one).
    public mutating func replaceRequested() -> LoginAction {
        switch state {
        case .loggedOut:
            state = .loggingIn
            return .startLogin
        case .loggingIn, .loggingOut, .replacing:
            return .waitThenRetry
        case .loggedIn(let record):
            state = .replacing(record)
            return .startReplace(record)
        }
    }

    /// The replace ended: `record` is the new session, safely in the store;
    /// nil when it failed, and the replaced session goes on.
    public mutating func replaceFinished(_ record: SessionRecord?) {
        guard case .replacing(let old) = state else {
            preconditionFailure("replaceFinished in state \(state)")
        }
        state = .loggedIn(record ?? old)
    }

    /// The login's record is safely in the store.
    public mutating func loginSucceeded(_ record: SessionRecord) {
        precondition(state == .loggingIn, "loginSucceeded in state \(state)")
        state = .loggedIn(record)
    }

    /// The login failed; the account is logged out.
    public mutating func loginFailed() {
        precondition(state == .loggingIn, "loginFailed in state \(state)")
        state = .loggedOut
    }

    /// A logout was asked for.
    public mutating func logoutRequested() -> LogoutAction {
        switch state {
        case .loggedOut:
            return .fail(.notLoggedIn(account))
        case .loggingIn, .replacing:
            return .waitThenRetry
        case .loggingOut:
            return .joinInFlight
        case .loggedIn(let record):
            state = .loggingOut(record)
            return .startLogout(record)
        }
    }

    /// A refresh replaced the tokens of the logged-in session. Ignored in any
    /// other state (the session ended while the refresh was in flight).
    public mutating func refreshed(_ record: SessionRecord) {
        if case .loggedIn = state { state = .loggedIn(record) }
    }

    /// The logout finished (the record is gone from the store), or failed
    /// before the record was touched (`succeeded: false` keeps the session).
    public mutating func logoutFinished(succeeded: Bool) {
        guard case .loggingOut(let record) = state else {
            preconditionFailure("logoutFinished in state \(state)")
        }
        state = succeeded ? .loggedOut : .loggedIn(record)
    }
}
