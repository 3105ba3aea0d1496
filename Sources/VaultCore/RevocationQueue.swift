/// The revocations waiting to be sent, as a value: which one goes next and
/// when. Each is retried with the refreshes' backoff and jitter
/// (`RefreshPolicy.backoff`) until the provider accepts it, and the queue as
/// a whole sends at most one request every `spacingSeconds`, so that a
/// thousand queued revocations against a failing endpoint cost a few
/// requests a second, not hundreds. It also counts what each owner has
/// queued, for `refusal(owner:sessions:adding:limits:)`. Time is an input
/// (`now`, in seconds); nothing here reads a clock.
public struct RevocationQueue: Sendable, Equatable {
    /// One queued revocation.
    public struct Entry: Sendable, Equatable {
        /// The revocation's id.
        public var id: String
        /// The uid whose session the tokens were.
        public var owner: UInt32
        /// The bytes the revocation takes in the store.
        public var bytes: Int
        /// Failed attempts so far.
        public var failures = 0
        /// The earliest it may be sent.
        public var dueAt: Double
    }

    /// The least time between two revocation requests, in seconds: at most
    /// four a second in all.
    public static let spacingSeconds = 0.25

    private var entries: [String: Entry] = [:]
    /// When the last request went out.
    private var lastSentAt = -Double.infinity

    /// An empty queue.
    public init() {}

    /// Queues revocation `id` of `owner`'s tokens, due at `now`.
    public mutating func add(_ id: String, owner: UInt32, bytes: Int, now: Double) {
        entries[id] = Entry(id: id, owner: owner, bytes: bytes, dueAt: now)
    }

    /// The revocation to send next and when it may go: the one due first,
    /// and never sooner than `spacingSeconds` after the last request; nil
    /// when the queue is empty.
    public func next() -> (id: String, at: Double)? {
        guard let first = entries.values.min(by: { ($0.dueAt, $0.id) < ($1.dueAt, $1.id) }) else { return nil }
        return (first.id, max(first.dueAt, lastSentAt + Self.spacingSeconds))
    }

    /// The request for `id` went out at `now`.
    public mutating func sent(_ id: String, now: Double) { lastSentAt = max(lastSentAt, now) }

    /// The provider accepted `id` (or it is otherwise done): it leaves the queue.
    public mutating func remove(_ id: String) { entries[id] = nil }

    /// The attempt for `id` failed at `now`: it is tried again after the
    /// backoff of its failure count, with `random` (0..<1) as jitter.
    public mutating func failed(_ id: String, random: Double, now: Double) {
        guard var entry = entries[id] else { return }
        entry.failures += 1
        entry.dueAt = now + Double(RefreshPolicy.backoff(attempt: entry.failures, random: random))
        entries[id] = entry
    }

    /// `id` may not be sent before `at` (its owner's `ProviderBudget` is spent).
    public mutating func postpone(_ id: String, until at: Double) {
        guard var entry = entries[id] else { return }
        entry.dueAt = max(entry.dueAt, at)
        entries[id] = entry
    }

    /// The entry of `id`, if queued.
    public subscript(id: String) -> Entry? { entries[id] }

    /// Revocations queued in all.
    public var count: Int { entries.count }

    /// Revocations of `owner`'s tokens queued, and the bytes they take.
    public func queued(by owner: UInt32) -> (count: Int, bytes: Int) {
        entries.values.reduce(into: (0, 0)) {
            if $1.owner == owner {
                $0.0 += 1
                $0.1 += $1.bytes
            }
        }
    }

    /// Why `owner`, holding `sessions` sessions, may not begin what would
    /// queue `adding` more revocations later (a login: each session's tokens
    /// are revoked at its end) or now (a replace), or nil when it may.
    /// Queued revocations count with the owner's sessions against
    /// `MaxSessionsPerUser=`, and their bytes against that many
    /// `MaxSessionSize=`: a logout swaps a session for a revocation, so it
    /// is never refused, and the login after it is while the provider has
    /// not taken the revocations. Root is not limited.
    public func refusal(owner: UInt32, sessions: Int, adding: Int = 1, limits: UserLimits) -> VaultError? {
        guard owner != 0 else { return nil }
        let (count, bytes) = queued(by: owner)
        guard count > 0 else { return nil }
        let countFull = sessions + count + adding > limits.sessionsPerUser
        let bytesFull = bytes + adding * limits.sessionBytes > limits.sessionsPerUser * limits.sessionBytes
        guard countFull || bytesFull else { return nil }
        return VaultError(
            .tooManyRevocations,
            "uid \(owner) holds \(sessions) sessions and \(count) ended sessions whose revocation the provider has not accepted yet (\(bytes) bytes); together they may be at most \(limits.sessionsPerUser) (MaxSessionsPerUser=) of \(limits.sessionBytes) bytes (MaxSessionSize=); vaultd retries the revocations with backoff: try again later, or ask the administrator why the provider refuses them"
        )
    }
}
