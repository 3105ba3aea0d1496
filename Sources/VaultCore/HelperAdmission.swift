/// Who may start a helper run now: a pure state machine over a fixed number
/// of workers, a cap of runs at once per provider (`MaxConcurrentHelpers=`)
/// and, per provider, a FIFO queue of runs waiting for a free slot, each with
/// a deadline. Every operation returns the runs to start; the caller starts
/// them and reports each finished run. Time is an input: `expire(now:)`
/// removes the runs whose deadline passed in the queue.
///
/// A run waits only for its own provider's cap or for a free worker; when a
/// worker frees, the run that arrived first among the providers under their
/// cap starts, so a provider whose helpers hang holds at most its cap of the
/// workers and never the queue of another.
public struct HelperAdmission<Ticket: Hashable & Sendable>: Sendable {
    /// The workers, the most runs at once in all.
    public let workers: Int

    private struct Waiting: Sendable {
        var ticket: Ticket
        var deadline: UInt64
        var order: UInt64
        var urgent = false
    }

    private struct ProviderState: Sendable {
        var cap: Int
        var running: Set<Ticket> = []
        var waiting: [Waiting] = []
    }

    private var providers: [String: ProviderState] = [:]
    private var running = 0
    private var arrivals: UInt64 = 0
    /// The provider of every run not finished yet, started or waiting.
    private var providerOf: [Ticket: String] = [:]

    /// A machine over `workers` workers (at least one).
    public init(workers: Int) { self.workers = max(1, workers) }

    /// Runs started and not finished, in all.
    public var runningCount: Int { running }

    /// Runs started and not finished for `provider`.
    public func running(_ provider: String) -> Int { providers[provider]?.running.count ?? 0 }

    /// Runs waiting for `provider`.
    public func waiting(_ provider: String) -> Int { providers[provider]?.waiting.count ?? 0 }

    /// The earliest deadline of a waiting run, if any waits.
    public var nextDeadline: UInt64? {
        providers.values.compactMap { $0.waiting.map(\.deadline).min() }.min()
    }

    /// A run of `provider` (whose cap is `cap`, the newest value winning)
    /// arrives; it may wait until `deadline`. Returns the runs to start now:
    /// this one, or none. An `urgent` run waits behind the urgent runs that
    /// arrived before it and ahead of every other waiting run, of its provider
    /// and, for the next free worker, of the others (the secret store's write
    /// of rotated tokens, which a crash must find as soon as possible).
    public mutating func arrive(
        _ ticket: Ticket, provider: String, cap: Int, deadline: UInt64, urgent: Bool = false
    ) -> [Ticket] {
        arrivals += 1
        providerOf[ticket] = provider
        providers[provider, default: ProviderState(cap: max(1, cap))].cap = max(1, cap)
        let run = Waiting(ticket: ticket, deadline: deadline, order: arrivals, urgent: urgent)
        if urgent {
            let place = providers[provider]!.waiting.firstIndex { !$0.urgent } ?? providers[provider]!.waiting.count
            providers[provider]!.waiting.insert(run, at: place)
        } else {
            providers[provider]!.waiting.append(run)
        }
        return startWhatCan()
    }

    /// A started run ended. Returns the runs to start now.
    public mutating func finished(_ ticket: Ticket) -> [Ticket] {
        guard let provider = providerOf.removeValue(forKey: ticket),
            providers[provider]?.running.remove(ticket) != nil
        else { return [] }
        running -= 1
        return startWhatCan()
    }

    /// Removes the waiting runs whose deadline is at or before `now`; returns them.
    public mutating func expire(now: UInt64) -> [Ticket] {
        var expired: [Ticket] = []
        for name in providers.keys {
            let gone = providers[name]!.waiting.filter { $0.deadline <= now }
            guard !gone.isEmpty else { continue }
            providers[name]!.waiting.removeAll { $0.deadline <= now }
            for entry in gone {
                providerOf[entry.ticket] = nil
                expired.append(entry.ticket)
            }
        }
        return expired
    }

    /// Starts waiting runs while a worker is free, urgent ones first, then
    /// first come first served among the providers under their cap.
    private mutating func startWhatCan() -> [Ticket] {
        var started: [Ticket] = []
        while running < workers {
            var best: (name: String, urgent: Bool, order: UInt64)?
            for (name, state) in providers where state.running.count < state.cap {
                guard let head = state.waiting.first else { continue }
                if best == nil || (head.urgent && !best!.urgent)
                    || (head.urgent == best!.urgent && head.order < best!.order)
                {
                    best = (name, head.urgent, head.order)
                }
            }
            guard let name = best?.name else { break }
            let entry = providers[name]!.waiting.removeFirst()
            providers[name]!.running.insert(entry.ticket)
            running += 1
            started.append(entry.ticket)
        }
        return started
    }
}
