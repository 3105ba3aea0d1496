/// Which blocking run may start now: a pure state machine over kinds of work,
/// each with workers of its own, and lanes within a kind, each with a cap of
/// runs at once (a provider's `MaxConcurrentHelpers=`, a host's connections,
/// the store's one call at a time) and a FIFO queue of runs waiting for a
/// free slot until their deadline. Every operation returns the runs to start;
/// the caller starts them and reports each finished run. Time is an input:
/// `expire(now:)` removes the runs whose deadline passed in the queue.
///
/// A run waits only for its lane's cap or for a free worker of its kind.
/// Kinds never share workers, so hanging helpers or token endpoints never
/// hold the worker the store needs; within a kind, a lane whose runs hang
/// holds at most its cap of the workers and never the queue of another.
/// When a worker frees, the urgent runs go first, then the run that arrived
/// first among the lanes under their cap.
public struct WorkAdmission<Ticket: Hashable & Sendable, Kind: Hashable & Sendable>: Sendable {
    /// The workers of each kind, the most runs of that kind at once.
    public let workers: [Kind: Int]

    private struct Lane: Hashable, Sendable {
        var kind: Kind
        var name: String
    }

    private struct Waiting: Sendable {
        var ticket: Ticket
        var deadline: UInt64
        var order: UInt64
        var urgent = false
    }

    private struct LaneState: Sendable {
        var cap: Int
        var running: Set<Ticket> = []
        var waiting: [Waiting] = []
    }

    private var lanes: [Lane: LaneState] = [:]
    private var runningOfKind: [Kind: Int] = [:]
    private var arrivals: UInt64 = 0
    /// The lane of every run not finished yet, started or waiting.
    private var laneOf: [Ticket: Lane] = [:]

    /// A machine over `workers` workers of each kind (at least one each).
    public init(workers: [Kind: Int]) { self.workers = workers.mapValues { max(1, $0) } }

    /// The workers of all kinds together.
    public var totalWorkers: Int { workers.values.reduce(0, +) }

    /// Runs started and not finished, in all.
    public var runningCount: Int { runningOfKind.values.reduce(0, +) }

    /// Runs started and not finished in the lane `name` of `kind`.
    public func running(_ kind: Kind, _ name: String) -> Int {
        lanes[Lane(kind: kind, name: name)]?.running.count ?? 0
    }

    /// Runs waiting in the lane `name` of `kind`.
    public func waiting(_ kind: Kind, _ name: String) -> Int {
        lanes[Lane(kind: kind, name: name)]?.waiting.count ?? 0
    }

    /// The earliest deadline of a waiting run, if any waits.
    public var nextDeadline: UInt64? {
        lanes.values.compactMap { $0.waiting.map(\.deadline).min() }.min()
    }

    /// A run of `kind` in the lane `lane` (whose cap is `cap`, the newest
    /// value winning) arrives; it may wait until `deadline`. Returns the runs
    /// to start now: this one, or none. An `urgent` run waits behind the
    /// urgent runs that arrived before it and ahead of every other waiting
    /// run of its kind (the secret store's write of rotated tokens, which a
    /// crash must find as soon as possible). A kind without workers gets one.
    public mutating func arrive(
        _ ticket: Ticket, kind: Kind, lane: String, cap: Int, deadline: UInt64, urgent: Bool = false
    ) -> [Ticket] {
        arrivals += 1
        let key = Lane(kind: kind, name: lane)
        laneOf[ticket] = key
        lanes[key, default: LaneState(cap: max(1, cap))].cap = max(1, cap)
        let run = Waiting(ticket: ticket, deadline: deadline, order: arrivals, urgent: urgent)
        if urgent {
            let place = lanes[key]!.waiting.firstIndex { !$0.urgent } ?? lanes[key]!.waiting.count
            lanes[key]!.waiting.insert(run, at: place)
        } else {
            lanes[key]!.waiting.append(run)
        }
        return startWhatCan(kind)
    }

    /// A started run ended. Returns the runs to start now.
    public mutating func finished(_ ticket: Ticket) -> [Ticket] {
        guard let key = laneOf.removeValue(forKey: ticket), lanes[key]?.running.remove(ticket) != nil else {
            return []
        }
        runningOfKind[key.kind, default: 1] -= 1
        return startWhatCan(key.kind)
    }

    /// Removes the waiting runs whose deadline is at or before `now`; returns them.
    public mutating func expire(now: UInt64) -> [Ticket] {
        var expired: [Ticket] = []
        for key in lanes.keys {
            let gone = lanes[key]!.waiting.filter { $0.deadline <= now }
            guard !gone.isEmpty else { continue }
            lanes[key]!.waiting.removeAll { $0.deadline <= now }
            for entry in gone {
                laneOf[entry.ticket] = nil
                expired.append(entry.ticket)
            }
        }
        return expired
    }

    /// Starts waiting runs of `kind` while one of its workers is free, urgent
    /// ones first, then first come first served among the lanes under their cap.
    private mutating func startWhatCan(_ kind: Kind) -> [Ticket] {
        var started: [Ticket] = []
        while runningOfKind[kind, default: 0] < workers[kind, default: 1] {
            var best: (lane: Lane, urgent: Bool, order: UInt64)?
            for (key, state) in lanes where key.kind == kind && state.running.count < state.cap {
                guard let head = state.waiting.first else { continue }
                if best == nil || (head.urgent && !best!.urgent)
                    || (head.urgent == best!.urgent && head.order < best!.order)
                {
                    best = (key, head.urgent, head.order)
                }
            }
            guard let key = best?.lane else { break }
            let entry = lanes[key]!.waiting.removeFirst()
            lanes[key]!.running.insert(entry.ticket)
            runningOfKind[kind, default: 0] += 1
            started.append(entry.ticket)
        }
        return started
    }
}
