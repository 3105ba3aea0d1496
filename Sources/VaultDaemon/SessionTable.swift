import Synchronization
import VaultCore

/// What the serving thread may read about one account without asking the
/// session manager: its client-visible state and its record, if any.
public struct SessionView: Sendable {
    /// The client-visible login state.
    public var state: LoginState
    /// The stored record; nil while the first login is in flight.
    public var record: SessionRecord?
    /// Refresh bookkeeping, for providers that refresh.
    public var refresh: RefreshStatus?

    /// A view.
    public init(state: LoginState, record: SessionRecord?, refresh: RefreshStatus? = nil) {
        self.state = state
        self.record = record
        self.refresh = refresh
    }
}

/// A read-mostly copy of every account's state, published by the session
/// manager after each change so that status and token reads are answered on
/// the serving thread, without D-Bus and without waiting on the actor.
public final class SessionTable: Sendable {
    private let views = Mutex<[Account: SessionView]>([:])
    private let didChange: @Sendable (SessionTable) -> Void

    /// An empty table; `didChange` runs after every change (e.g. to update STATUS=).
    public init(didChange: @escaping @Sendable (SessionTable) -> Void = { _ in }) {
        self.didChange = didChange
    }

    /// The view of `account`, or nil when it has no session.
    public func view(of account: Account) -> SessionView? {
        views.withLock { $0[account] }
    }

    /// Every view, sorted by account.
    public func all() -> [(Account, SessionView)] {
        views.withLock { $0.sorted { $0.key < $1.key }.map { ($0.key, $0.value) } }
    }

    /// The number of accounts with a session.
    public var count: Int { views.withLock { $0.count } }

    /// Publishes the state of `account` (nil removes it). Only the session manager calls this.
    func publish(_ account: Account, _ view: SessionView?) {
        views.withLock { $0[account] = view }
        didChange(self)
    }
}
