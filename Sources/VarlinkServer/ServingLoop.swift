import CShim
import Glibc
import Synchronization
import Varlink
import VaultSystem

/// One epoll loop of a `VarlinkServer`, on a thread of its own: it serves
/// the connections handed to it (non-blocking sockets, one read per
/// readiness, replies written as far as the peer takes them and the rest
/// queued). Calls on one connection are answered in order (a deferred call
/// holds back the next); one slow or stuck client never delays another.
/// Loop 0, the primary, also accepts every connection (and hands each to the
/// loop with the fewest), reads the signals and proves liveness to the
/// watchdog; the others only serve.
///
/// The loop's own state is marked `@exclusivity(unchecked)`, as is each
/// `Connection`'s: only the loop thread touches it, never through
/// overlapping accesses, and the runtime's checks cost more than the serving.
final class ServingLoop: @unchecked Sendable {
    /// This loop's place in `VarlinkServer.loops`; 0 is the primary.
    let index: Int
    unowned let server: VarlinkServer
    let service: VarlinkService
    let log: any ServerLog
    let hooks: ServerHooks
    let errors: TransportErrors
    let listenFD: Int32
    let epollFD: Int32
    private let wakeFD: Int32
    private let signalFD: Int32
    private var isPrimary: Bool { index == 0 }
    @exclusivity(unchecked) var connections: [UInt64: Connection] = [:]
    @exclusivity(unchecked) var nextID: UInt64 = 16
    @exclusivity(unchecked) var stopping = false
    /// What one user may take: connections, time, queued output.
    @exclusivity(unchecked) var limits: ServingLimits
    /// Limits a reload put in force, handed from the reload thread to the loop.
    private let reloadedLimits = Mutex<ServingLimits?>(nil)
    /// Queued reply bytes past which a connection's input is no longer read.
    @exclusivity(unchecked) var outputHighWater: Int
    /// Connections the primary accepted for this loop, not yet served here,
    /// and whether the loop still takes them (false once its thread ended or
    /// never started: the primary then serves the connection itself).
    private let handedOver = Mutex<(open: Bool, list: [Handover])>((true, []))
    /// The primary asked this loop to drain (a secondary's SIGTERM).
    private let stopAsked = Mutex<Int?>(nil)
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
    /// Work handed to the loop thread (writing to streams), in order.
    private let jobs = Mutex<[@Sendable (VarlinkServer.Streams) -> Void]>([])
    /// Streams written to by the job running now, settled after it.
    @exclusivity(unchecked) var touchedStreams: [Connection] = []
    /// What one `recv` reads into, zeroed after each (loop thread only).
    let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 16)

    static let sendFlags = Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)
    static let listenerKey: UInt64 = 1
    private static let wakeKey: UInt64 = 2
    private static let signalKey: UInt64 = 3

    /// A loop of `server`; the primary (index 0) also watches `listenFD`
    /// and `signalFD`.
    init(
        index: Int, server: VarlinkServer, listenFD: Int32, signalFD: Int32, service: VarlinkService,
        log: any ServerLog, errors: TransportErrors, hooks: ServerHooks, limits: ServingLimits
    ) throws(SystemError) {
        self.index = index
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
        guard isPrimary else { return }
        let flags = fcntl(listenFD, F_GETFL)
        _ = fcntl(listenFD, F_SETFL, flags | O_NONBLOCK)
        guard vaultd_epoll_add(epollFD, listenFD, VAULTD_EPOLLIN, ServingLoop.listenerKey) == 0,
            vaultd_epoll_add(epollFD, signalFD, VAULTD_EPOLLIN, ServingLoop.signalKey) == 0
        else { throw SystemError("epoll_ctl") }
    }

    deinit {
        Glibc.close(epollFD)
        Glibc.close(wakeFD)
        readBuffer.deallocate()
    }

    /// Serves until SIGTERM or SIGINT (the primary) or until the primary
    /// asks it to stop (the others), then (for at most `drainSeconds`)
    /// answers every call clients already sent, deferred ones included, and
    /// sends every queued reply, and returns the signal (0 for the others).
    func run(drainSeconds: Int) -> Int32 {
        var events = [vaultd_event](repeating: vaultd_event(), count: 256)
        var stopSignal: Int32 = 0
        if isPrimary, let interval = hooks.watchdogIntervalMilliseconds {
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
                case ServingLoop.wakeKey: drainCompletions(drainSeconds: drainSeconds)
                case ServingLoop.signalKey: signalReady = true
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
                    // Accepting ends first, so no connection is handed to a loop told to stop.
                    beginStopping(drainSeconds: drainSeconds)
                    for loop in server.loops.dropFirst() { loop.askToStop(drainSeconds: drainSeconds) }
                } else if signal == SIGHUP {
                    hooks.reload(server)
                } else if signal > 0 {
                    log.info("signal ignored", ["signal": String(signal)])
                }
            }
        }
        for connection in connections.values { disconnect(connection) }
        retire()
        return stopSignal
    }

    /// Takes no more connections: the loop's thread ended (or never started).
    /// Connections handed over and not served are closed unread, and the
    /// primary hands this loop nothing more. Thread-safe.
    func retire() {
        let left = takeHandovers(closing: true)
        server.admissions.withLock { admissions in
            for handover in left {
                admissions.release(handover.caller.uid, privileged: handover.privileged, loop: index)
            }
            admissions.retire(index)
        }
        for handover in left { Glibc.close(handover.fd) }
    }

    /// Whether this loop serves (its thread runs and has not ended).
    var isServing: Bool { handedOver.withLock { $0.open } }

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

    /// Makes this loop drain and stop, as the primary does at SIGTERM. Thread-safe.
    private func askToStop(drainSeconds: Int) {
        stopAsked.withLock { $0 = drainSeconds }
        wake()
    }

    /// Serves a connection the primary accepted; false when this loop no
    /// longer serves (see `retire`). Thread-safe.
    func adopt(_ handover: Handover) -> Bool {
        let taken = handedOver.withLock { state -> Bool in
            guard state.open else { return false }
            state.list.append(handover)
            return true
        }
        if taken { wake() }
        return taken
    }

    /// The connections handed over since last asked (no allocation when none
    /// were); with `closing`, none are taken from now on.
    private func takeHandovers(closing: Bool = false) -> [Handover] {
        handedOver.withLock { state in
            if closing { state.open = false }
            var taken: [Handover] = []
            swap(&taken, &state.list)
            return taken
        }
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
    /// the cooperative pool and the service's own state, then through every
    /// other loop, and its completion comes back through this loop; only then
    /// is WATCHDOG=1 sent. A stuck part means no ping.
    func startWatchdogProbe() {
        guard !watchdogProbeInFlight else { return }
        watchdogProbeInFlight = true
        let probe = hooks.watchdogProbe
        let others = Array(server.loops.dropFirst())
        Task { [self] in
            await probe()
            // A loop that no longer serves (its thread ended) is not waited for.
            for loop in others where loop.isServing {
                await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
                    loop.onLoop { _ in done.resume() }
                }
            }
            self.complete(ServingLoop.watchdogProbeID, nil)
        }
    }

    // MARK: Stopping and handing work back

    /// Starts the drain: no more connections, streams ended, calls already
    /// sent answered (with `TransportErrors.stopping` for those not started).
    private func beginStopping(drainSeconds: Int) {
        stopping = true
        deadlines.schedule(.drainEnd, at: Monotonic.milliseconds() + UInt64(drainSeconds) * 1000)
        if isPrimary {
            _ = vaultd_epoll_del(epollFD, listenFD)
            log.notice("stopping: no new connections, answering calls in flight", [:])
        }
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

    /// Takes what other threads handed to the loop (connections, replies of
    /// deferred calls, stream jobs, reloaded limits, a secondary's stop) and
    /// acts on it.
    private func drainCompletions(drainSeconds: Int) {
        var counter: UInt64 = 0
        _ = read(wakeFD, &counter, 8)
        for handover in takeHandovers() { serve(handover) }
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
        if let drainSeconds = stopAsked.withLock({ $0.take() }), !stopping {
            // Every connection the primary handed over came before its ask:
            // served now, so that the drain answers or closes each.
            for handover in takeHandovers() { serve(handover) }
            beginStopping(drainSeconds: drainSeconds)
        }
    }
}
