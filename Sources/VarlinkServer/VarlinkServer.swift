import CShim
import Glibc
import Synchronization
import Varlink
import VaultSystem

/// Serves a `VarlinkService` on a listening Unix socket from one or more
/// epoll loops (`ServingLoop`), each on a thread of its own. The first loop
/// accepts every connection and hands it to the loop serving the fewest, so
/// that one busy client's calls and another's are answered on different
/// CPUs; a connection stays on its loop for its life, and its calls are
/// answered in order there. The server knows nothing of what it serves: the
/// service's method table answers calls, the errors it sends on its own come
/// from `TransportErrors`, and streams are written by their owner through
/// `Streams`, on the stream's own loop (`onLoop(_:_:)`).
///
/// Handlers are called on whichever loop serves the caller: with more than
/// one loop, two at a time. What they share must be safe to share.
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
    /// The most loops a server runs.
    public static let maximumLoops = 64

    /// How many loops serve when the caller does not say: 16, whatever the
    /// CPUs. Not one per CPU: a loop with few connections sleeps between
    /// their calls, so the reply it sends wakes its client on the loop's own
    /// CPU, as the loop goes back to sleep (the kernel's synchronous wakeup);
    /// a busy loop wakes every client on another CPU, which costs more than
    /// the call itself. Measured with 32 connections each calling GetToken
    /// back to back (docs/BENCHMARKS.md): on 2 CPUs 16 loops answered 40%
    /// more calls than one at the same CPU per call, on 1 CPU 7% more.
    public static let defaultLoopCount = 16

    /// The loops, the primary first; set once by `init`, read-only after.
    private(set) var loops: [ServingLoop] = []
    /// The connections open on every loop, counted for admission.
    let admissions: Mutex<Admissions>

    /// Prepares to serve `service` on `listenFD` from `loops` loops
    /// (`defaultLoopCount` unless given, clamped to 1...`maximumLoops`);
    /// `signalFD` delivers the signals that stop the server; `errors` are the
    /// replies the server sends on its own.
    public init(
        listenFD: Int32, signalFD: Int32, service: VarlinkService, log: any ServerLog, errors: TransportErrors,
        hooks: ServerHooks = ServerHooks(), limits: ServingLimits = ServingLimits(),
        loops count: Int = VarlinkServer.defaultLoopCount
    ) throws(SystemError) {
        let count = min(max(count, 1), VarlinkServer.maximumLoops)
        admissions = Mutex(Admissions(loops: count))
        var loops: [ServingLoop] = []
        for index in 0..<count {
            loops.append(
                try ServingLoop(
                    index: index, server: self, listenFD: listenFD, signalFD: signalFD, service: service, log: log,
                    errors: errors, hooks: hooks, limits: limits))
        }
        self.loops = loops
    }

    /// How many loops there are (`isServing(_:)` says which serve).
    public var loopCount: Int { loops.count }

    /// Whether loop `loop` serves: false once its thread ended, or when it
    /// could not start. Work handed to such a loop never runs.
    public func isServing(_ loop: Int) -> Bool { loops[loop].isServing }

    /// Serves until SIGTERM or SIGINT, then (for at most `drainSeconds`)
    /// answers every call clients already sent, deferred ones included, and
    /// sends every queued reply, on every loop, and returns the signal. The
    /// primary loop runs on the calling thread, the others on threads of
    /// their own, which have ended when this returns.
    @discardableResult
    public func run(drainSeconds: Int = 10) -> Int32 {
        var threads: [pthread_t] = []
        for loop in loops.dropFirst() {
            let context = Unmanaged.passRetained(LoopThread(loop: loop, drainSeconds: drainSeconds)).toOpaque()
            var thread = pthread_t()
            let created = pthread_create(
                &thread, nil,
                { context in
                    let work = Unmanaged<LoopThread>.fromOpaque(context!).takeRetainedValue()
                    _ = work.loop.run(drainSeconds: work.drainSeconds)
                    return nil
                }, context)
            if created == 0 {
                threads.append(thread)
            } else {
                // No thread: the loop never serves, is handed nothing, and is
                // left out of the watchdog's probe and of streams.
                Unmanaged<LoopThread>.fromOpaque(context).release()
                loop.retire()
            }
        }
        let signal = loops[0].run(drainSeconds: drainSeconds)
        for thread in threads { pthread_join(thread, nil) }
        return signal
    }

    /// Runs `job` on the thread of loop `loop` (a `StreamID`'s `loop`),
    /// where it may write to that loop's streams; the jobs of one loop run in
    /// the order they were handed over. Thread-safe.
    public func onLoop(_ loop: Int, _ job: @escaping @Sendable (Streams) -> Void) {
        loops[loop].onLoop(job)
    }

    /// Puts `limits` in force on every loop for connections accepted from now
    /// on (and the timeouts and output bound of all). Thread-safe.
    public func reload(_ limits: ServingLimits) {
        for loop in loops { loop.reload(limits) }
    }
}

/// What a loop's thread runs.
private final class LoopThread {
    let loop: ServingLoop
    let drainSeconds: Int

    init(loop: ServingLoop, drainSeconds: Int) {
        self.loop = loop
        self.drainSeconds = drainSeconds
    }
}

/// A connection the primary accepted, on its way to the loop that serves it.
struct Handover: Sendable {
    var id: UInt64
    var fd: Int32
    var caller: Caller
    /// The caller is root or privileged: it may use the reserved connections.
    var privileged: Bool
}

/// The connections open on all loops, as admission counts them: admitted on
/// the primary (which picks the loop), released on the loop that closes them.
struct Admissions {
    /// Open connections, every loop's.
    private(set) var open = 0
    /// Open connections of callers neither root nor privileged.
    private var unprivileged = 0
    private var perUID: [UInt32: Int] = [:]
    /// Open connections per loop; a loop without a thread counts as full.
    private var perLoop: [Int]
    /// The loop the last tie went to, so that ties go round.
    private var lastChosen = 0

    init(loops: Int) { perLoop = Array(repeating: 0, count: loops) }

    /// Counts `caller`'s new connection in when `limits` admit it, and picks
    /// the loop to serve it: the one with the fewest open, ties going round.
    mutating func admit(_ caller: Caller, privileged: Bool, _ limits: ServingLimits) -> (
        ServingLimits.Admission, loop: Int
    ) {
        let admission = limits.admission(
            isRoot: caller.isRoot, privileged: privileged, open: open, openUnprivileged: unprivileged,
            openForUser: perUID[caller.uid] ?? 0)
        guard admission == .admit else { return (admission, 0) }
        open += 1
        if !privileged { unprivileged += 1 }
        perUID[caller.uid, default: 0] += 1
        var chosen = 0
        var fewest = Int.max
        for step in 1...perLoop.count {
            let loop = (lastChosen + step) % perLoop.count
            if perLoop[loop] < fewest {
                fewest = perLoop[loop]
                chosen = loop
            }
        }
        lastChosen = chosen
        perLoop[chosen] += 1
        return (.admit, chosen)
    }

    /// Counts a closed connection of `uid`, served on `loop`, out.
    mutating func release(_ uid: UInt32, privileged: Bool, loop: Int) {
        open -= 1
        if !privileged { unprivileged -= 1 }
        perUID[uid, default: 1] -= 1
        if perUID[uid] == 0 { perUID[uid] = nil }
        perLoop[loop] -= 1
    }

    /// Hands `loop` no more connections (it stopped serving, or never started).
    mutating func retire(_ loop: Int) {
        if loop != 0 { perLoop[loop] = Int.max / 2 }
    }

    /// Counts a connection picked for `from`, which no longer serves, on `to`.
    mutating func move(from: Int, to: Int) {
        perLoop[from] -= 1
        perLoop[to] += 1
    }
}
