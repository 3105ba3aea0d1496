/// Whether vaultd can write to its secret store now, as clients see it
/// (`store` in `ListSessions` and `Subscribe`, the `storeChanged` event).
public enum StoreState: String, Sendable, CaseIterable {
    /// Reads and writes go to the store.
    case available
    /// The store cannot be reached (the Secret Service or the bus is gone,
    /// or it stopped answering): writes are refused, tokens are served from
    /// memory, and vaultd reconnects with backoff.
    case unavailable
    /// The store answers, but its collection is locked: nothing in it can be
    /// read or written, and a miss means nothing. Treated like `unavailable`,
    /// reported apart so that someone unlocks it.
    case locked
}

/// What a probe of the store found: reachable with the collection unlocked,
/// not reachable, or reachable and locked.
public enum StoreProbe: Sendable, Equatable {
    case available
    case unavailable(String)
    case locked(String)
}

/// The store's availability as a value: failed calls and probe results go in,
/// actions come out (report the new state, probe again at a time, write
/// through what memory holds). The session manager performs the actions; the
/// state machine reads no clock and does no I/O, so every path is tested with
/// plain numbers. See docs/LIFECYCLE.md, "The secret store".
public struct StoreHealth: Sendable, Equatable {
    /// Something that happened to the store.
    public enum Event: Sendable, Equatable {
        /// A call failed with `code` at `now` (seconds). Only `storeUnavailable`
        /// and `storeLocked` say something about the store as a whole; any
        /// other failure is the one call's.
        case failed(VaultError.Code, reason: String, now: Double)
        /// A probe (a fresh connection and a look at the collection) answered;
        /// `random` in 0..<1 spreads the next probe.
        case probed(StoreProbe, now: Double, random: Double)
    }

    /// What the owner must do.
    public enum Action: Sendable, Equatable {
        /// The state changed: log it, update STATUS=, tell subscribers.
        case report(StoreState, reason: String?)
        /// Probe the store (reconnecting) at this time; replaces an earlier probe.
        case probe(at: Double)
        /// The store is back: write what memory holds that the store may lack.
        case writeThrough
    }

    /// The first wait before probing again, in seconds.
    public static let firstProbeSeconds = 0.5
    /// The longest wait between probes, in seconds.
    public static let longestProbeSeconds = 15.0

    /// The state as clients see it.
    public private(set) var state = StoreState.available
    /// Why the store is not available (the last failure or probe).
    public private(set) var reason: String?
    /// When the store stopped being available (seconds), nil while it is.
    public private(set) var since: Double?
    /// Probes that found the store still not available, since it went.
    public private(set) var failedProbes = 0

    /// What to do about a store that is away, the end of the refusal's
    /// message: the Secret Service's by default.
    public let remedy: String

    /// The remedy when no store names its own: the Secret Service's.
    public static let secretServiceRemedy = "start gnome-keyring (or KeePassXC) on the session bus, then try again"

    /// A store that answered at start-up; `remedy` says what brings it back.
    public init(remedy: String = StoreHealth.secretServiceRemedy) { self.remedy = remedy }

    /// The wait before probe number `attempt + 1`: doubling from
    /// `firstProbeSeconds` to at most `longestProbeSeconds`, spread by
    /// `random` over [0.75, 1.25) of that.
    public static func probeDelay(attempt: Int, random: Double) -> Double {
        let base = min(longestProbeSeconds, firstProbeSeconds * Double(1 << min(max(attempt, 0), 10)))
        return min(longestProbeSeconds, base * (0.75 + 0.5 * min(max(random, 0), 0.999)))
    }

    /// The error a call gets while the store is not available; nil when it is.
    public var refusal: VaultError? {
        switch state {
        case .available: return nil
        case .unavailable:
            return VaultError(
                .storeUnavailable,
                "the secret store is unavailable; tokens are still served from memory, changes are refused until it returns (vaultd reconnects on its own): \(remedy)"
            )
        case .locked:
            return VaultError(
                .storeLocked,
                "the secret store's collection is locked, and a locked collection hides every session; tokens are still served from memory, changes are refused until it is unlocked (log in to the desktop, or 'gnome-keyring-daemon --unlock')"
            )
        }
    }

    /// Takes `event` and returns what to do, in order.
    public mutating func handle(_ event: Event) -> [Action] {
        switch event {
        case .failed(let code, let why, let now):
            let next: StoreState
            switch code {
            case .storeUnavailable: next = .unavailable
            case .storeLocked: next = .locked
            default: return []
            }
            guard next != state else { return [] }
            let wasAvailable = state == .available
            state = next
            reason = why
            guard wasAvailable else {
                // Already probing: only the report changes.
                return [.report(next, reason: why)]
            }
            since = now
            failedProbes = 0
            return [.report(next, reason: why), .probe(at: now + Self.probeDelay(attempt: 0, random: 0.5))]
        case .probed(let result, let now, let random):
            switch result {
            case .available:
                guard state != .available else { return [] }
                state = .available
                reason = nil
                since = nil
                failedProbes = 0
                return [.report(.available, reason: nil), .writeThrough]
            case .unavailable(let why), .locked(let why):
                let next: StoreState = isLocked(result) ? .locked : .unavailable
                var actions: [Action] = []
                if next != state {
                    if state == .available { since = now }
                    state = next
                    reason = why
                    actions.append(.report(next, reason: why))
                } else {
                    reason = why
                }
                failedProbes += 1
                actions.append(.probe(at: now + Self.probeDelay(attempt: failedProbes, random: random)))
                return actions
            }
        }
    }

    private func isLocked(_ probe: StoreProbe) -> Bool {
        if case .locked = probe { return true }
        return false
    }
}
