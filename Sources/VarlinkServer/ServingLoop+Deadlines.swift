import CShim
import Varlink

/// What the loop waits for besides descriptors: a connection's timeouts,
/// resuming accepting, the watchdog, the end of the drain.
extension ServingLoop {
    /// What the loop waits for besides descriptors, one entry each.
    enum Timer: Hashable, Sendable {
        /// A connection is looked at for lack of progress. The entry may be
        /// earlier than the connection's real deadline (activity only moves
        /// that later): it is then moved when it comes due, so activity itself
        /// costs a few comparisons, not a heap update.
        case connection(UInt64)
        /// Accepting, paused for lack of descriptors, resumes.
        case resumeAccepting
        /// The watchdog is next proven to.
        case watchdog
        /// The drain after SIGTERM ends, whatever is still open.
        case drainEnd
    }

    /// When `connection` is closed unless it makes progress; nil for never.
    private func dueTime(_ connection: Connection) -> UInt64? {
        switch connection.state {
        case .ending(let deadline), .lingering(let deadline): return deadline
        case .open, .waiting, .streaming, .closed: break
        }
        return limits.deadline(
            streaming: connection.isStream, busy: connection.busy, lastActivity: connection.lastActivity,
            partialSince: connection.partialSince)?.at
    }

    /// Keeps the connection's heap entry at or before its deadline: a few
    /// comparisons unless the deadline came nearer (or went away).
    func settleDeadline(_ connection: Connection) {
        guard let due = dueTime(connection) else {
            if connection.scheduledAt != nil {
                deadlines.cancel(.connection(connection.id))
                connection.scheduledAt = nil
            }
            return
        }
        if let at = connection.scheduledAt, at <= due { return }
        deadlines.schedule(.connection(connection.id), at: due)
        connection.scheduledAt = due
    }

    /// Does what is due: closes the connections whose deadline passed (and
    /// moves the entries that came due early, the connection having been
    /// active since, to the real deadline), resumes accepting, proves
    /// liveness to the watchdog, ends the drain.
    func runDueTimers() {
        guard let nearest = deadlines.nearest, nearest <= now else { return }
        for timer in deadlines.popDue(at: now) {
            switch timer {
            case .connection(let id): expire(id)
            case .resumeAccepting:
                if !stopping { _ = vaultd_epoll_add(epollFD, listenFD, VAULTD_EPOLLIN, ServingLoop.listenerKey) }
            case .watchdog:
                startWatchdogProbe()
                if let interval = hooks.watchdogIntervalMilliseconds {
                    deadlines.schedule(.watchdog, at: now + UInt64(interval))
                }
            case .drainEnd: drainOver = true
            }
        }
    }

    /// Closes connection `id` if its deadline passed, else schedules it again.
    private func expire(_ id: UInt64) {
        guard let connection = connections[id] else { return }
        connection.scheduledAt = nil
        guard let due = dueTime(connection) else { return }
        if due > now {
            settleDeadline(connection)
            return
        }
        let reason: String
        if case .ending = connection.state {
            reason = "ended stream"
        } else if connection.isLingering {
            reason = "malformed message"
        } else {
            reason = connection.partialSince != nil ? "unfinished message" : "idle"
        }
        log.info(
            "connection closed: \(reason) past its timeout",
            ["uid": String(connection.caller.uid), "pid": String(connection.caller.pid)])
        disconnect(connection)
    }
}

/// The loop's deadlines, with the nearest one kept beside the heap: the heap
/// is generic code of another module, and asking it for its first entry costs
/// runtime metadata lookups (thousands of instructions), which the loop would
/// otherwise pay twice per iteration. The heap changes far less often.
struct LoopDeadlines {
    private var heap = DeadlineHeap<ServingLoop.Timer, UInt64>()
    /// The nearest deadline, nil when there is none.
    private(set) var nearest: UInt64?

    mutating func schedule(_ timer: ServingLoop.Timer, at deadline: UInt64) {
        heap.schedule(timer, at: deadline)
        nearest = heap.next?.deadline
    }

    mutating func cancel(_ timer: ServingLoop.Timer) {
        heap.cancel(timer)
        nearest = heap.next?.deadline
    }

    mutating func popDue(at now: UInt64) -> [ServingLoop.Timer] {
        let due = heap.popDue(at: now)
        nearest = heap.next?.deadline
        return due
    }
}
