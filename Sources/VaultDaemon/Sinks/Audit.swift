import Varlink
import VaultCore

/// The audit trail: one structured line per token handout, login, logout and
/// kick, naming who (uid, pid, executable; or `actor=vaultd` for vaultd's own
/// expiries and refusals), what, which session (account and owner) and the
/// result. Never a secret.
///
/// Token handouts repeat: a client may read its token thousands of times a
/// second, and a line for each would flood the journal (journald rate-limits
/// per service, then drops vaultd's other messages too). So the first
/// handout of a kind — same action, uid, pid, executable, account, owner and
/// result — is written at once, and the repeats are counted and written as
/// one line with `count=N` (N handouts since that kind's previous line) at
/// the end of each interval (`HandoutCounts.interval`) in which there were
/// any. A kind with no handout for a whole interval is forgotten: its next
/// handout is written at once again. Counts still pending are written when
/// vaultd stops (`Logger.flush()`).
public enum Audit {
    /// Writes one audit line (or, for a repeated token handout, counts it).
    public static func log(_ log: Logger, _ action: String, _ key: SessionKey, by principal: Principal, result: String)
    {
        guard log.writes(.notice) else { return }
        switch principal {
        case .peer(let caller):
            if action == Audit.handoutAction, !log.handouts.record(action, key, caller: caller, result: result) {
                return
            }
            write(log, action: action, key, caller: caller, result: result, count: nil)
        case .vaultd:
            log.log(
                .notice, "audit",
                sortedFields: [
                    ("action", action), ("actor", "vaultd"), ("owner", String(key.owner)),
                    ("provider", key.account.provider), ("result", result), ("user", key.account.user),
                ])
        }
    }

    /// The action whose repeats are counted rather than written one by one.
    static let handoutAction = "GetToken"

    /// The line of a handout kind, with `count=` when it stands for repeats.
    static func write(_ log: Logger, _ kind: HandoutCounts.Kind, count: Int) {
        let key = SessionKey(owner: kind.owner, account: Account(provider: kind.provider, user: kind.user))
        let caller = Caller(uid: kind.uid, gid: 0, pid: kind.pid, executable: kind.executable)
        write(log, action: kind.action, key, caller: caller, result: kind.result, count: count)
    }

    private static func write(
        _ log: Logger, action: String, _ key: SessionKey, caller: Caller, result: String, count: Int?
    ) {
        // Already in key order: the line is formatted on the serving path.
        var fields: [(key: String, value: String)] = [("action", action)]
        if let count { fields.append(("count", String(count))) }
        fields += [
            ("exe", caller.executable ?? "?"), ("owner", String(key.owner)), ("pid", String(caller.pid)),
            ("provider", key.account.provider), ("result", result), ("uid", String(caller.uid)),
            ("user", key.account.user),
        ]
        log.log(.notice, "audit", sortedFields: fields)
    }
}

/// The repeats of each kind of token handout, counted between the lines that
/// report them. A value: time comes in as an argument (monotonic
/// milliseconds), so tests drive it by hand; `Logger` keeps one behind a
/// lock and a timer.
public struct HandoutCounts: Sendable {
    /// What makes two handouts the same for the audit trail.
    public struct Kind: Hashable, Sendable {
        public var action: String
        public var uid: UInt32
        public var pid: Int32
        public var executable: String?
        public var owner: UInt32
        public var provider: String
        public var user: String
        public var result: String

        /// A handout of `provider`/`user` (of `owner`) to `uid`/`pid`/`executable`, with `result`.
        public init(
            action: String, uid: UInt32, pid: Int32, executable: String?, owner: UInt32, provider: String,
            user: String, result: String
        ) {
            self.action = action
            self.uid = uid
            self.pid = pid
            self.executable = executable
            self.owner = owner
            self.provider = provider
            self.user = user
            self.result = result
        }

        /// The kind of a handout of `key` to `caller`.
        public init(_ action: String, _ key: SessionKey, caller: Caller, result: String) {
            self.init(
                action: action, uid: caller.uid, pid: caller.pid, executable: caller.executable, owner: key.owner,
                provider: key.account.provider, user: key.account.user, result: result)
        }

        /// True when a handout of `key` to `caller` is of this kind; the
        /// cheapest fields first, and no copy made.
        func matches(_ action: String, _ key: SessionKey, _ caller: Caller, _ result: String) -> Bool {
            pid == caller.pid && uid == caller.uid && owner == key.owner && provider == key.account.provider
                && user == key.account.user && self.result == result && self.action == action
                && executable == caller.executable
        }
    }

    /// How often the counted repeats are written: every 10 s at most one
    /// line per kind, whatever the rate of handouts.
    public static let interval: UInt64 = 10_000
    /// Kinds tracked at most; past this a new kind's handouts are each
    /// written (the table cannot grow without bound).
    public static let maximumKinds = 10_000

    /// Repeats not yet written, per kind seen within the last interval (for
    /// the kind of the last handout, `lastRepeats` more).
    private var pending: [Kind: Int] = [:]
    /// The kind of the last handout, compared before anything is hashed:
    /// most handouts in a row are of one kind. Kept for GetToken's p99 at 32
    /// connections: building and hashing the kind of every handout under
    /// the counts' lock cost 2,000 instructions per call and put the p99 at
    /// 2.4-3.3 ms (docs/BENCHMARKS.md, "GetToken at 32 connections").
    private var last: Kind?
    private var lastRepeats = 0
    /// When the next tick is due, nil when no kind is tracked.
    public private(set) var nextTick: UInt64?

    /// Nothing counted.
    public init() {}

    /// Counts a handout of `kind` at `now`; true when it is to be written
    /// now (the first of its kind, or one past `maximumKinds`).
    public mutating func record(
        _ action: String, _ key: SessionKey, caller: Caller, result: String, now: @autoclosure () -> UInt64
    ) -> Bool {
        if let last, last.matches(action, key, caller, result) {
            lastRepeats += 1
            return false
        }
        return record(Kind(action, key, caller: caller, result: result), now: now())
    }

    /// Counts a handout of `kind` at `now`; true when it is to be written now.
    public mutating func record(_ kind: Kind, now: @autoclosure () -> UInt64) -> Bool {
        if let last, last == kind {
            lastRepeats += 1
            return false
        }
        foldLast()
        if pending[kind] != nil {
            last = kind
            lastRepeats = 1
            return false
        }
        guard pending.count < HandoutCounts.maximumKinds else { return true }
        pending[kind] = 0
        last = kind
        if nextTick == nil { nextTick = now() + HandoutCounts.interval }
        return true
    }

    /// At a tick: the kinds with repeats and their counts (reset to zero);
    /// kinds without any since the last tick are forgotten.
    public mutating func tick(now: UInt64) -> [(kind: Kind, count: Int)] {
        foldLast()
        last = nil
        var due: [(kind: Kind, count: Int)] = []
        var kept: [Kind: Int] = [:]
        for (kind, count) in pending where count > 0 {
            due.append((kind, count))
            kept[kind] = 0
        }
        pending = kept
        nextTick = pending.isEmpty ? nil : now + HandoutCounts.interval
        return due
    }

    /// Every repeat not yet written, and nothing tracked any more: at exit.
    public mutating func drain() -> [(kind: Kind, count: Int)] {
        foldLast()
        let due = pending.filter { $0.value > 0 }.map { (kind: $0.key, count: $0.value) }
        pending = [:]
        last = nil
        nextTick = nil
        return due
    }

    /// Moves the repeats of the last kind into `pending`.
    private mutating func foldLast() {
        if let last, lastRepeats > 0 { pending[last, default: 0] += lastRepeats }
        lastRepeats = 0
    }
}
