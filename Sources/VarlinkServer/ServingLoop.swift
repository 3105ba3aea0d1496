import CShim
import Glibc
import Synchronization
import Varlink
import VaultSystem

/// The epoll loop of a `VarlinkServer`: it accepts connections and serves
/// them (non-blocking sockets, one read per readiness, replies written as
/// far as the peer takes them and the rest queued), reads the signals and
/// proves liveness to the watchdog. Calls on one connection are answered in
/// order (a deferred call holds back the next); one slow or stuck client
/// never delays another.
///
/// The loop's own state is marked `@exclusivity(unchecked)`, as is each
/// `Connection`'s: only the loop thread touches it, never through
/// overlapping accesses, and the runtime's checks cost more than the serving.
final class ServingLoop: @unchecked Sendable {
    unowned let server: VarlinkServer
    let service: VarlinkService
    let log: any ServerLog
    let hooks: ServerHooks
    let errors: TransportErrors
    let listenFD: Int32
    let epollFD: Int32
    private let wakeFD: Int32
    private let signalFD: Int32
    @exclusivity(unchecked) var connections: [UInt64: Connection] = [:]
    @exclusivity(unchecked) var nextID: UInt64 = 16
    @exclusivity(unchecked) var stopping = false
    /// What one user may take: connections, time, queued output.
    @exclusivity(unchecked) var limits: ServingLimits
    /// Limits a reload put in force, handed from the reload thread to the loop.
    private let reloadedLimits = Mutex<ServingLimits?>(nil)
    /// Queued reply bytes past which a connection's input is no longer read.
    @exclusivity(unchecked) var outputHighWater: Int
    /// The open connections, counted for admission.
    @exclusivity(unchecked) var admissions = Admissions()
    var nextRefusalLog: UInt64 = 0
    var nextReplyTooLargeLog: UInt64 = 0
    /// Every deadline of the loop, in monotonic milliseconds; the nearest one
    /// is the epoll timeout.
    @exclusivity(unchecked) var deadlines = LoopDeadlines()
    /// The monotonic time of the current loop iteration, in milliseconds.
    @exclusivity(unchecked) var now: UInt64 = Monotonic.milliseconds()
    /// The drain's time is up.
    var drainOver = false
    /// Replies of deferred calls (nil: none is sent, the call was oneway),
    /// handed to the loop thread by worker tasks.
    private let completions = Mutex<[(UInt64, VarlinkReply?)]>([])
    var nextCallTooLargeLog: UInt64 = 0
    /// Calls over `inlineParseLimit` bytes waiting for their parse off the
    /// loop, oldest first; one is parsed at a time (`parsingAside`).
    @exclusivity(unchecked) var asideParses: [(connection: UInt64, message: [UInt8])] = []
    @exclusivity(unchecked) var parsingAside = false
    /// Work handed to the loop thread (writing to streams), in order.
    private let jobs = Mutex<[@Sendable (VarlinkServer.Streams) -> Void]>([])
    /// The loop's work off the loop thread, by the id it reports back under:
    /// deferred calls (their connection's id), the watchdog's probe, the large
    /// parse, the work closed connections leave (`startWork`). Each is taken
    /// out when it reports back; what is left when the loop ends is cancelled.
    @exclusivity(unchecked) var offLoopWork: [UInt64: Task<Void, Never>] = [:]
    /// Streams written to by the job running now, settled after it.
    @exclusivity(unchecked) var touchedStreams: [Connection] = []
    /// What one `recv` reads into, zeroed after each (loop thread only).
    let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 16)

    static let sendFlags = Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)
    static let listenerKey: UInt64 = 1
    private static let wakeKey: UInt64 = 2
    private static let signalKey: UInt64 = 3
    private static let ownWorkKey: UInt64 = 4

    /// The loop of `server`, watching `listenFD` and `signalFD`.
    init(
        server: VarlinkServer, listenFD: Int32, signalFD: Int32, service: VarlinkService,
        log: any ServerLog, errors: TransportErrors, hooks: ServerHooks, limits: ServingLimits
    ) throws(SystemError) {
        self.server = server
        self.hooks = hooks
        self.errors = errors
        self.limits = limits
        self.outputHighWater = limits.outputHighWater
        self.listenFD = listenFD
        self.signalFD = signalFD
        self.service = service
        self.log = log
        epollFD = vaultd_epoll_create()
        guard epollFD >= 0 else { throw SystemError("epoll_create1") }
        wakeFD = vaultd_eventfd()
        guard wakeFD >= 0 else { throw SystemError("eventfd") }
        guard vaultd_epoll_add(epollFD, wakeFD, VAULTD_EPOLLIN, ServingLoop.wakeKey) == 0 else {
            throw SystemError("epoll_ctl")
        }
        let flags = fcntl(listenFD, F_GETFL)
        _ = fcntl(listenFD, F_SETFL, flags | O_NONBLOCK)
        guard vaultd_epoll_add(epollFD, listenFD, VAULTD_EPOLLIN, ServingLoop.listenerKey) == 0,
            vaultd_epoll_add(epollFD, signalFD, VAULTD_EPOLLIN, ServingLoop.signalKey) == 0,
            hooks.ownWork.map({ vaultd_epoll_add(epollFD, $0.wakeFD, VAULTD_EPOLLIN, ServingLoop.ownWorkKey) }) ?? 0
                == 0
        else { throw SystemError("epoll_ctl") }
    }

    deinit {
        Glibc.close(epollFD)
        Glibc.close(wakeFD)
        readBuffer.deallocate()
    }

    /// Serves until SIGTERM or SIGINT, then (for at most `drainSeconds`)
    /// answers every call clients already sent, deferred ones included, and
    /// sends every queued reply, and returns the signal; work still running
    /// at the drain's end (`offLoopWork`) is cancelled.
    func run(drainSeconds: Int) -> Int32 {
        var events = [vaultd_event](repeating: vaultd_event(), count: 256)
        var stopSignal: Int32 = 0
        if let interval = hooks.watchdogIntervalMilliseconds {
            deadlines.schedule(.watchdog, at: Monotonic.milliseconds() + UInt64(interval))
        }
        while true {
            now = Monotonic.milliseconds()
            runDueTimers()
            // A connection closes once it is done (see `process`): the drain
            // ends when all are, or at its deadline.
            if stopping && (connections.isEmpty || drainOver) { break }
            let timeout: Int32 = deadlines.nearest.map { Int32(clamping: $0 > now ? $0 - now : 0) } ?? -1
            let count: Int32 = events.withUnsafeMutableBufferPointer {
                (buffer: inout UnsafeMutableBufferPointer<vaultd_event>) -> Int32 in
                vaultd_epoll_wait(epollFD, buffer.baseAddress, Int32(buffer.count), timeout)
            }
            if count < 0 {
                if errno == EINTR { continue }
                log.error("epoll_wait failed", ["errno": String(errno)])
                break
            }
            now = Monotonic.milliseconds()
            var signalReady = false
            for i in 0..<Int(count) {
                let event = events[i]
                switch event.data {
                case ServingLoop.listenerKey: acceptAll()
                case ServingLoop.wakeKey: drainCompletions()
                case ServingLoop.signalKey: signalReady = true
                case ServingLoop.ownWorkKey: hooks.ownWork?.run()
                default:
                    guard let connection = connections[event.data] else { continue }
                    serve(connection, events: event.events)
                }
            }
            if signalReady {
                let signal = vaultd_signalfd_read(signalFD)
                if (signal == SIGTERM || signal == SIGINT) && !stopping {
                    stopSignal = signal
                    hooks.stopping()
                    beginStopping(drainSeconds: drainSeconds)
                } else if signal == SIGHUP {
                    hooks.reload(server)
                } else if signal > 0 {
                    log.info("signal ignored", ["signal": String(signal)])
                }
            }
        }
        for connection in connections.values { disconnect(connection) }
        // The drain is over: what still runs has nobody to answer.
        for task in offLoopWork.values { task.cancel() }
        offLoopWork = [:]
        return stopSignal
    }

    /// Runs `body` off the loop as work of the loop, under `id`; `body` must
    /// report back under that id (`complete`, or a job that takes it out of
    /// `offLoopWork`), which ends it. Loop thread only.
    func startWork(_ id: UInt64, _ body: @escaping @Sendable () async -> Void) {
        offLoopWork[id] = Task { await body() }
    }

    /// Runs `job` on the loop thread, where it may write to this loop's
    /// streams; jobs run in the order they were handed over. Thread-safe.
    func onLoop(_ job: @escaping @Sendable (VarlinkServer.Streams) -> Void) {
        jobs.withLock { $0.append(job) }
        wake()
    }

    /// Puts `limits` in force for connections accepted from now on (and the
    /// timeouts and output bound of all). Thread-safe.
    func reload(_ limits: ServingLimits) {
        reloadedLimits.withLock { $0 = limits }
        wake()
    }

    private func wake() {
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
    }

    /// Hands the reply of a deferred call back to the loop. Thread-safe.
    func complete(_ id: UInt64, _ reply: VarlinkReply?) {
        completions.withLock { $0.append((id, reply)) }
        wake()
    }

    // MARK: Watchdog

    private static let watchdogProbeID: UInt64 = 0
    private var watchdogProbeInFlight = false

    /// Proves the daemon serves before telling the watchdog: a probe runs through
    /// the cooperative pool and the service's own state, and its completion
    /// comes back through the loop; only then is WATCHDOG=1 sent. A stuck
    /// part means no ping.
    func startWatchdogProbe() {
        guard !watchdogProbeInFlight else { return }
        watchdogProbeInFlight = true
        let probe = hooks.watchdogProbe
        startWork(ServingLoop.watchdogProbeID) { [self] in
            await probe()
            self.complete(ServingLoop.watchdogProbeID, nil)
        }
    }

    // MARK: Stopping and handing work back

    /// Starts the drain: no more connections, streams ended, calls already
    /// sent answered (with `TransportErrors.stopping` for those not started).
    private func beginStopping(drainSeconds: Int) {
        stopping = true
        deadlines.schedule(.drainEnd, at: Monotonic.milliseconds() + UInt64(drainSeconds) * 1000)
        _ = vaultd_epoll_del(epollFD, listenFD)
        log.notice("stopping: no new connections, answering calls in flight", [:])
        // Streams get a last word; idle connections are closed now; busy ones after their reply.
        for connection in connections.values where connection.isStream {
            queue(errors.streamStopping, on: connection)
            flush(connection)
            disconnect(connection)
        }
        // The others answer what they sent, with "stopping" for calls not yet
        // started, and close once their replies are out.
        for connection in connections.values where !connection.busy && !connection.isClosed { process(connection) }
    }

    /// Takes what other threads handed to the loop (replies of deferred
    /// calls, stream jobs, reloaded limits) and acts on it.
    private func drainCompletions() {
        var counter: UInt64 = 0
        _ = read(wakeFD, &counter, 8)
        let done: [(UInt64, VarlinkReply?)] = completions.withLock { list in
            let taken = list
            list.removeAll(keepingCapacity: true)
            return taken
        }
        let work: [@Sendable (VarlinkServer.Streams) -> Void] = jobs.withLock { list in
            let taken = list
            list.removeAll(keepingCapacity: true)
            return taken
        }
        for job in work {
            job(VarlinkServer.Streams(loop: self))
            settleTouchedStreams()
        }
        if let reloaded = reloadedLimits.withLock({ $0.take() }) {
            limits = reloaded
            outputHighWater = reloaded.outputHighWater
            log.info("serving limits reloaded", ["maxConnectionsPerUser": String(reloaded.maxConnectionsPerUser)])
        }
        for (id, reply) in done {
            offLoopWork[id] = nil
            if id == ServingLoop.watchdogProbeID {
                watchdogProbeInFlight = false
                hooks.watchdog()
                continue
            }
            guard let connection = connections[id], case .waiting = connection.state else { continue }
            connection.state = .open
            if let reply { queue(reply, on: connection) }
            if !connection.isClosed { process(connection) }
        }
    }
}
