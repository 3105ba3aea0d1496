import Synchronization
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// What the serving loops may read about one session without asking the
/// session manager: its client-visible state and its record, if any.
public struct SessionView: Sendable {
    /// The client-visible login state.
    public var state: LoginState
    /// The stored record; nil while the first login is in flight.
    public var record: SessionRecord?
    /// Refresh bookkeeping, for providers that refresh; for a parked
    /// account, its failed logins.
    public var refresh: RefreshStatus?
    /// No session: an account kept only to show its failed logins and, for
    /// `AutoLogin=yes`, that vaultd logs it in. Not counted as a session.
    public var parked = false
    /// The clients that report their connection to the chat server.
    public var clients: [ClientReport]
    /// Why the session's token file could not be brought in line, until it is
    /// (`SessionTable.tokenFileFailed(_:_:)`); nil when it is, or there is none.
    public var tokenFileError: String?

    /// A view.
    public init(
        state: LoginState, record: SessionRecord?, refresh: RefreshStatus? = nil, clients: [ClientReport] = [],
        parked: Bool = false
    ) {
        self.state = state
        self.record = record
        self.refresh = refresh
        self.clients = clients
        self.parked = parked
    }

    /// The session as clients see it (type `Session`), when it has a record.
    public func wireJSON() -> JSON? {
        guard let record else { return nil }
        var json = record.wireJSON(state: state, refresh: refresh)
        if !clients.isEmpty || tokenFileError != nil, case .object(var o) = json {
            if !clients.isEmpty { o["clients"] = .array(clients.map { $0.json() }) }
            o["tokenFileError"] = tokenFileError.map(JSON.string)
            json = .object(o)
        }
        return json
    }
}

/// A read-mostly copy of every account's state, published by the session
/// manager after each change so that status and token reads are answered on
/// the serving loops, without D-Bus and without waiting on the actor.
public final class SessionTable: Sendable {
    /// How many accounts are in the states systemd's STATUS= line reports.
    public struct Counts: Sendable, Equatable {
        /// Accounts with a session (logged in, or logging out).
        public var sessions = 0
        /// Accounts whose first login is in flight.
        public var loggingIn = 0
        /// Sessions with a refresh in flight.
        public var refreshing = 0
        /// Sessions whose last refresh attempt failed.
        public var failing = 0

        /// No accounts.
        public init() {}

        /// Adds (`sign` 1) or removes (`sign` -1) the contribution of `view`.
        mutating func count(_ view: SessionView, _ sign: Int) {
            if view.parked { return }
            if view.state == .logging { loggingIn += sign } else { sessions += sign }
            switch view.refresh?.connection {
            case .connecting?: refreshing += sign
            case .connectFailed?: failing += sign
            default: break
            }
        }
    }

    /// The views and their counts, kept together so that the counts cost
    /// O(1) per change: every login and refresh publishes, and STATUS= must
    /// not scan 100,000 sessions each time.
    private struct Contents {
        var views = DenseTable<SessionKey, SessionView>()
        var counts = Counts()
        /// Per account, the uids holding a session of it (an admin who names
        /// no owner is answered from the only one).
        var owners: [Account: Owners] = [:]
        /// Sessions per owner, for the per-user limit.
        var perOwner: [UInt32: Int] = [:]
        /// Told the key of each change once it is visible (`observe(_:)`).
        var observer: (@Sendable (SessionKey) -> Void)?
        /// The token files that could not be brought in line, and why.
        var tokenFileErrors: [SessionKey: String] = [:]

        /// The view of `key` with its token file's failure, if any.
        func view(_ key: SessionKey) -> SessionView? {
            guard var view = views[key] else { return nil }
            if !tokenFileErrors.isEmpty { view.tokenFileError = tokenFileErrors[key] }
            return view
        }
    }

    /// The uids holding a session of one account: almost always one, kept
    /// inline (a `Set` would be an allocation of its own per account).
    private struct Owners {
        private var first: UInt32
        private var others: [UInt32] = []

        init(_ owner: UInt32) { first = owner }

        var sorted: [UInt32] { ([first] + others).sorted() }

        mutating func insert(_ owner: UInt32) {
            if owner != first && !others.contains(owner) { others.append(owner) }
        }

        /// Removes `owner`; false when none is left.
        mutating func remove(_ owner: UInt32) -> Bool {
            if owner == first {
                guard let next = others.popLast() else { return false }
                first = next
            } else {
                others.removeAll { $0 == owner }
            }
            return true
        }
    }

    /// Read by the serving loop at every call, written by the session manager.
    private let contents = Mutex(Contents())
    private let didChange: @Sendable (SessionTable) -> Void

    /// An empty table; `didChange` runs after every change (e.g. to update STATUS=).
    public init(didChange: @escaping @Sendable (SessionTable) -> Void = { _ in }) {
        self.didChange = didChange
    }

    /// The view of the session `key`, or nil when there is none.
    public func view(of key: SessionKey) -> SessionView? {
        contents.withLock { $0.view(key) }
    }

    /// What serving GetToken from memory needs of the view of `key`, read
    /// in place (`view(of:)` copies the whole view): its record (nil while
    /// it is not logged in) and its last refresh; nil when there is no view.
    public func tokenFacts(of key: SessionKey) -> (record: SessionRecord?, lastRefreshAt: UnixTime?)? {
        contents.withLock { contents in
            contents.views.read(key) { view in (view.record, view.refresh?.lastRefreshAt) }
        }
    }

    /// Every view, sorted by provider, user and owner.
    public func all() -> [(SessionKey, SessionView)] {
        contents.withLock { contents in
            contents.views.sorted { $0.key < $1.key }.map { entry in
                var view = entry.value
                if !contents.tokenFileErrors.isEmpty { view.tokenFileError = contents.tokenFileErrors[entry.key] }
                return (entry.key, view)
            }
        }
    }

    /// The uids that hold a session (or a login in flight) of `account`, in order.
    public func owners(of account: Account) -> [UInt32] {
        contents.withLock { $0.owners[account]?.sorted ?? [] }
    }

    /// How many sessions (and logins in flight) `owner` holds.
    public func sessionCount(of owner: UInt32) -> Int {
        contents.withLock { $0.perOwner[owner] ?? 0 }
    }

    /// The number of accounts with a session.
    public var count: Int { contents.withLock { $0.views.count } }

    /// How many accounts are in each state, without looking at every view.
    public var counts: Counts { contents.withLock { $0.counts } }

    /// Records that the token file of `key` could not be written or removed
    /// (`error`, which never holds a secret), or that it is in line again
    /// (nil): the session's status shows it, and STATUS= counts it, until then.
    /// Returns true when this changes what was recorded (a new failure, not
    /// the same one again).
    @discardableResult
    public func tokenFileFailed(_ key: SessionKey, _ error: String?) -> Bool {
        let changed = contents.withLock { contents in
            let old = contents.tokenFileErrors[key]
            contents.tokenFileErrors[key] = error
            return old != error
        }
        if changed { didChange(self) }
        return changed
    }

    /// How many token files could not be brought in line.
    public var tokenFilesFailing: Int { contents.withLock { $0.tokenFileErrors.count } }

    /// Calls `observer` with the key of every change from now on, right
    /// after the change is visible to `view(of:)`, on the thread that made it:
    /// it must return at once. The token files follow the table this way,
    /// whichever path (login, refresh, logout, expiry) changed a token.
    public func observe(_ observer: @escaping @Sendable (SessionKey) -> Void) {
        contents.withLock { $0.observer = observer }
    }

    /// Publishes the state of the session `key` (nil removes it). Only the session manager calls this.
    func publish(_ key: SessionKey, _ view: SessionView?) {
        let observer = contents.withLock { contents in
            Self.change(&contents, key, view)
            return contents.observer
        }
        observer?(key)
        didChange(self)
    }

    /// Publishes many sessions at once (start-up's restore): one lock, one
    /// `didChange`; the observer still hears of every key.
    func publish(_ views: [(SessionKey, SessionView)]) {
        guard !views.isEmpty else { return }
        let observer = contents.withLock { contents in
            contents.views.reserveCapacity(contents.views.count + views.count)
            contents.owners.reserveCapacity(contents.owners.count + views.count)
            for (key, view) in views { Self.change(&contents, key, view) }
            return contents.observer
        }
        if let observer { for (key, _) in views { observer(key) } }
        didChange(self)
    }

    private static func change(_ contents: inout Contents, _ key: SessionKey, _ view: SessionView?) {
        let old = view.map { contents.views.updateValue($0, forKey: key) } ?? contents.views.removeValue(forKey: key)
        if let old { contents.counts.count(old, -1) }
        if let view { contents.counts.count(view, 1) }
        // A parked account holds no session: not an owner's, not against its limit.
        switch (old == nil || old!.parked, view == nil || view!.parked) {
        case (true, false):
            contents.owners[key.account, default: Owners(key.owner)].insert(key.owner)
            contents.perOwner[key.owner, default: 0] += 1
        case (false, true):
            if contents.owners[key.account]?.remove(key.owner) == false { contents.owners[key.account] = nil }
            contents.perOwner[key.owner, default: 1] -= 1
            if contents.perOwner[key.owner] == 0 { contents.perOwner[key.owner] = nil }
        default: break
        }
    }
}
