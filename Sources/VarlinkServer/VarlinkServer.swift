import Varlink
import VaultSystem

/// Serves a `VarlinkService` on a listening Unix socket from one epoll loop
/// (`ServingLoop`) on the thread that calls `run`: it accepts every
/// connection and answers each one's calls in order. The server knows
/// nothing of what it serves: the service's method table answers calls, the
/// errors it sends on its own come from `TransportErrors`, and streams are
/// written by their owner through `Streams`, on the loop (`onLoop(_:)`).
///
/// Handlers are called on the loop's thread, one at a time.
public final class VarlinkServer: @unchecked Sendable {
    /// The largest message accepted from a client.
    public static let maximumMessageSize = 1 << 20
    /// The largest message parsed without a look at its method first. A
    /// larger one is refused unparsed when it names first a method whose
    /// calls may not be that large (`VarlinkService.callSizeLimit(of:)`),
    /// and parsed on the loop like any other when it does not.
    public static let inlineParseLimit = 4096
    /// How long a connection that sent a malformed message is read (and what
    /// it sends dropped) after its error reply, before it is closed anyway.
    public static let lingerMilliseconds: UInt64 = 2000

    /// The loop; set once by `init`, read-only after.
    private var loop: ServingLoop!

    /// Prepares to serve `service` on `listenFD`; `signalFD` delivers the
    /// signals that stop the server; `errors` are the replies the server
    /// sends on its own.
    public init(
        listenFD: Int32, signalFD: Int32, service: VarlinkService, log: any ServerLog, errors: TransportErrors,
        hooks: ServerHooks = ServerHooks(), limits: ServingLimits = ServingLimits()
    ) throws(SystemError) {
        loop = try ServingLoop(
            server: self, listenFD: listenFD, signalFD: signalFD, service: service, log: log, errors: errors,
            hooks: hooks, limits: limits)
    }

    /// Serves until SIGTERM or SIGINT, then (for at most `drainSeconds`)
    /// answers every call clients already sent, deferred ones included, and
    /// sends every queued reply, and returns the signal. The loop runs on the
    /// calling thread; deferred work still running when it returns is cancelled.
    @discardableResult
    public func run(drainSeconds: Int = 10) -> Int32 {
        loop.run(drainSeconds: drainSeconds)
    }

    /// Runs `job` on the loop's thread, where it may write to streams; jobs
    /// run in the order they were handed over. Thread-safe.
    public func onLoop(_ job: @escaping @Sendable (Streams) -> Void) {
        loop.onLoop(job)
    }

    /// Puts `limits` in force for connections accepted from now on (and the
    /// timeouts and output bound of all). Thread-safe.
    public func reload(_ limits: ServingLimits) {
        loop.reload(limits)
    }
}

/// The open connections, as admission counts them.
struct Admissions {
    /// Open connections.
    private(set) var open = 0
    /// Open connections of callers neither root nor privileged.
    private var unprivileged = 0
    private var perUID: [UInt32: Int] = [:]

    /// Counts `caller`'s new connection in when `limits` admit it.
    mutating func admit(_ caller: Caller, privileged: Bool, _ limits: ServingLimits) -> ServingLimits.Admission {
        let admission = limits.admission(
            isRoot: caller.isRoot, privileged: privileged, open: open, openUnprivileged: unprivileged,
            openForUser: perUID[caller.uid] ?? 0)
        guard admission == .admit else { return admission }
        open += 1
        if !privileged { unprivileged += 1 }
        perUID[caller.uid, default: 0] += 1
        return .admit
    }

    /// Counts a closed connection of `uid` out.
    mutating func release(_ uid: UInt32, privileged: Bool) {
        open -= 1
        if !privileged { unprivileged -= 1 }
        perUID[uid, default: 1] -= 1
        if perUID[uid] == 0 { perUID[uid] = nil }
    }
}
