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
    private unowned let server: VarlinkServer
    private let service: VarlinkService
    private let log: any ServerLog
    private let hooks: ServerHooks
    private let errors: TransportErrors
    private let listenFD: Int32
    private let epollFD: Int32
    private let wakeFD: Int32
    private let signalFD: Int32
    private var isPrimary: Bool { index == 0 }
    @exclusivity(unchecked) fileprivate var connections: [UInt64: Connection] = [:]
    @exclusivity(unchecked) private var nextID: UInt64 = 16
    @exclusivity(unchecked) private var stopping = false
    /// What one user may take: connections, time, queued output.
    @exclusivity(unchecked) private var limits: ServingLimits
    /// Limits a reload put in force, handed from the reload thread to the loop.
    private let reloadedLimits = Mutex<ServingLimits?>(nil)
    /// Queued reply bytes past which a connection's input is no longer read.
    @exclusivity(unchecked) private var outputHighWater: Int
    /// Connections the primary accepted for this loop, not yet served here,
    /// and whether the loop still takes them (false once its thread ended or
    /// never started: the primary then serves the connection itself).
    private let handedOver = Mutex<(open: Bool, list: [Handover])>((true, []))
    /// The primary asked this loop to drain (a secondary's SIGTERM).
    private let stopAsked = Mutex<Int?>(nil)
    private var nextRefusalLog: UInt64 = 0
    private var nextReplyTooLargeLog: UInt64 = 0
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
    /// Every deadline of the loop, in monotonic milliseconds; the nearest one
    /// is the epoll timeout.
    @exclusivity(unchecked) private var deadlines = LoopDeadlines()
    /// The monotonic time of the current loop iteration, in milliseconds.
    @exclusivity(unchecked) fileprivate var now: UInt64 = Monotonic.milliseconds()
    /// The drain's time is up.
    private var drainOver = false
    /// What worker tasks and the parse thread hand back to the loop thread.
    enum Completion: Sendable {
        /// The reply of a deferred call (nil: none is sent, the call was oneway).
        case reply(VarlinkReply?)
        /// A large message read off the loop: the call, or why it is none, and its size.
        case parsed(Result<VarlinkCall, VarlinkCall.DecodingFailure>, size: Int)
    }
    /// Replies of deferred calls and large calls parsed, handed to the loop thread.
    private let completions = Mutex<[(UInt64, Completion)]>([])
    /// Reads large messages off the loop.
    private lazy var parser = ParseThread(loop: self)
    private var nextCallTooLargeLog: UInt64 = 0
    /// Work handed to the loop thread (writing to streams), in order.
    private let jobs = Mutex<[@Sendable (VarlinkServer.Streams) -> Void]>([])
    /// Streams written to by the job running now, settled after it.
    @exclusivity(unchecked) fileprivate var touchedStreams: [Connection] = []
    /// What one `recv` reads into, zeroed after each (loop thread only).
    private let readBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 16)

    private static let sendFlags = Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT)
    private static let listenerKey: UInt64 = 1
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
            // One round: answer every ready connection, then hand the round's log
            // (audit) lines to the log writer in one piece, then send the replies.
            var signalReady = false
            beginRound()
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
            endRound()
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
    private func adopt(_ handover: Handover) -> Bool {
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
        complete(id, .reply(reply))
    }

    /// Hands what a worker did for connection `id` back to the loop. Thread-safe.
    func complete(_ id: UInt64, _ completion: Completion) {
        completions.withLock { $0.append((id, completion)) }
        wake()
    }

    // MARK: Rounds

    /// Connections answered in this round whose replies wait for `endRound()`.
    @exclusivity(unchecked) private var answered: [Connection] = []
    @exclusivity(unchecked) private var inRound = false

    /// Starts a round: log lines are held and replies queued until its end.
    private func beginRound() {
        inRound = true
        log.hold()
    }

    /// Ends a round: the held log lines go to the log writer first (one write
    /// for the round, done off this thread, in order), then the replies are sent.
    private func endRound() {
        inRound = false
        log.release()
        let round = answered
        answered.removeAll(keepingCapacity: true)
        for connection in round {
            connection.answeredThisRound = false
            if !connection.isClosed { sendAndSettle(connection) }
        }
    }

    // MARK: Watchdog

    private static let watchdogProbeID: UInt64 = 0
    private var watchdogProbeInFlight = false

    /// Proves the daemon serves before telling the watchdog: a probe runs through
    /// the cooperative pool and the service's own state, then through every
    /// other loop, and its completion comes back through this loop; only then
    /// is WATCHDOG=1 sent. A stuck part means no ping.
    private func startWatchdogProbe() {
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

    // MARK: Connections

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

    private func acceptAll() {
        for _ in 0..<64 {
            let fd = vaultd_accept_nonblocking(listenFD)
            if fd < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED { return }
                let error = SystemError("accept4")
                if errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM {
                    // Out of descriptors: the listener would stay readable and spin the
                    // loop; stop watching it for a second and let connections drain.
                    _ = vaultd_epoll_del(epollFD, listenFD)
                    deadlines.schedule(.resumeAccepting, at: Monotonic.milliseconds() + 1000)
                    log.warning("too many open connections; accepting paused for 1s", ["error": error.description])
                    return
                }
                log.warning("accept failed", ["error": error.description])
                return
            }
            var pid: pid_t = 0
            var uid: uid_t = 0
            var gid: gid_t = 0
            guard vaultd_peer_credentials(fd, &pid, &uid, &gid) == 0 else {
                log.warning("peer credentials unavailable; connection refused")
                Glibc.close(fd)
                continue
            }
            var groups = [gid_t](repeating: 0, count: 256)
            let groupCount = max(0, vaultd_peer_groups(fd, &groups, Int32(groups.count)))
            var caller = Caller(uid: uid, gid: gid, pid: pid, groups: Array(groups.prefix(Int(groupCount))))
            let privileged = caller.isRoot || hooks.privileged(caller)
            let limits = self.limits
            let (admission, loop) = server.admissions.withLock { $0.admit(caller, privileged: privileged, limits) }
            guard admission == .admit else {
                refuse(fd, caller, admission)
                continue
            }
            caller.executable = ServingLoop.executable(of: pid)
            let id = nextID
            nextID += 1
            caller.connection = id
            let handover = Handover(id: id, fd: fd, caller: caller, privileged: privileged)
            if loop != index, server.loops[loop].adopt(handover) { continue }
            // This loop's, or one that stopped serving since it was picked.
            if loop != index { server.admissions.withLock { $0.move(from: loop, to: index) } }
            serve(handover)
        }
    }

    /// Starts serving a connection accepted by the primary.
    private func serve(_ handover: Handover) {
        let connection = Connection(
            id: handover.id, fd: handover.fd, caller: handover.caller,
            maximumMessageSize: VarlinkServer.maximumMessageSize)
        connection.privileged = handover.privileged
        connection.lastActivity = now
        connections[handover.id] = connection
        settleDeadline(connection)
        connection.interest = VAULTD_EPOLLIN
        if vaultd_epoll_add(epollFD, handover.fd, VAULTD_EPOLLIN, handover.id) != 0 {
            disconnect(connection)
        }
    }

    /// Refuses a new connection at once, so that no user can use up the
    /// daemon's descriptors or the connections kept for root and the admin
    /// group: the refusal is its only reply, sent if the socket takes it now.
    private func refuse(_ fd: Int32, _ caller: Caller, _ admission: ServingLimits.Admission) {
        var reply = errors.refused(admission, caller, limits).encoded()
        reply.append(0)
        _ = reply.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, ServingLoop.sendFlags) }
        Glibc.close(fd)
        if now >= nextRefusalLog {
            let open = server.admissions.withLock { $0.open }
            log.warning(
                "connection limit reached; connection refused",
                [
                    "uid": String(caller.uid), "pid": String(caller.pid), "open": String(open),
                    "limit": "\(admission)",
                ])
            nextRefusalLog = now + 10_000
        }
    }

    /// The peer's executable from /proc, for the audit log.
    static func executable(of pid: pid_t) -> String? {
        var buffer = [CChar](repeating: 0, count: 4096)
        let n = readlink("/proc/\(pid)/exe", &buffer, buffer.count - 1)
        guard n > 0 else { return nil }
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    private func serve(_ connection: Connection, events: UInt32) {
        let failed = events & (VAULTD_EPOLLHUP | VAULTD_EPOLLERR) != 0
        if connection.isLingering {
            linger(connection, events: events)
            return
        }
        if failed && connection.isStream {
            disconnect(connection)
            return
        }
        if connection.isStream {
            if events & VAULTD_EPOLLOUT != 0 { flush(connection) }
            if connection.isClosed { return }
            if case .ending = connection.state, connection.pendingOutput == 0 {
                disconnect(connection)
                return
            }
            if events & VAULTD_EPOLLIN != 0 {
                // A stream's peer sends nothing more; reading only tells whether it left.
                let n: Int = withUnsafeTemporaryAllocation(byteCount: 4096, alignment: 16) {
                    (buffer: UnsafeMutableRawBufferPointer) -> Int in
                    recv(connection.fd, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT))
                }
                if n == 0 {
                    // Half-closed: it sends nothing more but may still read its stream.
                    connection.peerClosedInput = true
                } else if n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                    disconnect(connection)
                    return
                }
            }
            updateInterest(connection)
            return
        }
        if failed && connection.busy {
            // The peer is gone while its call is in flight. epoll reports a hang-up
            // whatever the interest, so stop watching; the reply is dropped when it comes.
            connection.peerClosedInput = true
            _ = vaultd_epoll_del(epollFD, connection.fd)
            connection.interest = nil
            return
        }
        if events & VAULTD_EPOLLOUT != 0 {
            flush(connection)
            if connection.isClosed { return }
        }
        if events & VAULTD_EPOLLIN != 0 || failed, connection.wantsInput {
            readOnce(connection)
            if connection.isClosed { return }
        }
        process(connection)
    }

    private func readOnce(_ connection: Connection) {
        let fd = connection.fd
        let n: Int = recv(fd, readBuffer.baseAddress, readBuffer.count, Int32(MSG_DONTWAIT))
        if n > 0 {
            connection.decoder.append(UnsafeRawBufferPointer(rebasing: readBuffer[0..<n]))
            // A call may carry a secret: the decoder keeps the only copy.
            vaultd_explicit_bzero(readBuffer.baseAddress, n)
        }
        if n > 0 { connection.lastActivity = now }
        if n == 0 {
            connection.peerClosedInput = true
        } else if n < 0, errno != EAGAIN, errno != EWOULDBLOCK, errno != EINTR {
            disconnect(connection)
        }
    }

    /// Answers the complete messages buffered on `connection`, one at a time,
    /// until a deferred call or a full output queue holds it back.
    private func process(_ connection: Connection) {
        answer(connection)
        // A log line written for this round's calls (an audit line) goes to
        // the log writer before any reply of the round is sent; without one,
        // the reply goes now: sent right after its call was read, it reaches
        // a client still waking from that read (one wakeup, not two).
        if inRound && log.holdsLines {
            if !connection.answeredThisRound {
                connection.answeredThisRound = true
                answered.append(connection)
            }
            return
        }
        sendAndSettle(connection)
    }

    /// The loop of `process`: answers what is buffered, without sending.
    private func answer(_ connection: Connection) {
        while !connection.isClosed, !connection.busy, connection.pendingOutput < outputHighWater {
            let message: ArraySlice<UInt8>
            do throws(VarlinkFrameDecoder.Failure) {
                guard let next = try connection.decoder.next() else { break }
                message = next
                connection.partialSince = nil
            } catch {
                let limit = VarlinkServer.maximumMessageSize
                log.warning("message over \(limit) bytes; connection closed", ["pid": String(connection.caller.pid)])
                refuseMalformed(
                    on: connection,
                    problem:
                        "a message grew past \(limit) bytes without its NUL terminator; vaultd closes the connection; end each call with a NUL byte and keep it under \(limit) bytes"
                )
                return
            }
            if message.count > VarlinkServer.inlineParseLimit {
                parseLarge(message, on: connection)
                continue
            }
            do throws(VarlinkCall.DecodingFailure) {
                dispatch(
                    try VarlinkCall(message: message, methods: service.methodNames), size: message.count,
                    on: connection)
            } catch {
                refuse(error, on: connection)
            }
        }
        connection.heldBack = !connection.isClosed && !connection.busy && connection.pendingOutput >= outputHighWater
        // Bytes of an unfinished message start the request timeout while the
        // connection is read; complete messages held back by queued output do not.
        if connection.decoder.hasPartialMessage && connection.wantsInput
            && connection.pendingOutput < outputHighWater
        {
            if connection.partialSince == nil { connection.partialSince = now }
        } else {
            connection.partialSince = nil
        }
    }

    /// Answers a message that is no call: the connection is closed when it
    /// is not JSON, else the wrong field is named.
    private func refuse(_ failure: VarlinkCall.DecodingFailure, on connection: Connection) {
        switch failure {
        case .invalidJSON(let reason):
            log.warning("invalid JSON; connection closed", ["pid": String(connection.caller.pid), "reason": reason])
            refuseMalformed(
                on: connection,
                problem:
                    "a message is not JSON (\(reason)); vaultd closes the connection; send each call as one JSON object ended by a NUL byte"
            )
        case .invalidField(let field):
            queue(VarlinkServiceError.invalidParameter(field), on: connection)
        }
    }

    /// Ends a connection that sent something that is no call: its last reply
    /// says what was wrong, then it lingers (see `Connection.State.lingering`).
    /// What it sent after is never read as calls.
    private func refuseMalformed(on connection: Connection, problem: String) {
        connection.decoder.wipe()
        connection.partialSince = nil
        queue(errors.malformedMessage(problem), on: connection)
        connection.state = .lingering(deadline: now + VarlinkServer.lingerMilliseconds)
    }

    /// A lingering connection's events: its error reply goes out, then what
    /// the peer sends is read and dropped, a bounded amount per event.
    private func linger(_ connection: Connection, events: UInt32) {
        if events & VAULTD_EPOLLOUT != 0 {
            flush(connection)
            if connection.isClosed { return }
        }
        if events & (VAULTD_EPOLLIN | VAULTD_EPOLLHUP | VAULTD_EPOLLERR) != 0 {
            for _ in 0..<16 {
                let n: Int = recv(connection.fd, readBuffer.baseAddress, readBuffer.count, Int32(MSG_DONTWAIT))
                if n > 0 {
                    vaultd_explicit_bzero(readBuffer.baseAddress, n)
                    continue
                }
                if n == 0 {
                    connection.peerClosedInput = true
                } else if errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR {
                    disconnect(connection)
                    return
                }
                break
            }
        }
        settleLingering(connection)
    }

    /// Shuts the write side once the error reply is out; closes when the
    /// peer has closed too (or the server stops).
    private func settleLingering(_ connection: Connection) {
        if connection.pendingOutput == 0 {
            if connection.peerClosedInput || stopping {
                disconnect(connection)
                return
            }
            if !connection.writeShut {
                connection.writeShut = true
                _ = shutdown(connection.fd, Int32(SHUT_WR))
            }
        }
        updateInterest(connection)
    }

    /// Answers one call read from a message of `size` bytes: queues its
    /// reply, starts its stream or its deferred work.
    private func dispatch(_ call: VarlinkCall, size: Int, on connection: Connection) {
        if stopping {
            if !call.oneway { queue(errors.stopping, on: connection) }
            return
        }
        // A large call of a method that takes small parameters, read off the
        // loop because its method was not named first: refused as if it had been.
        if size > VarlinkServer.inlineParseLimit {
            let limit = service.callSizeLimit(of: call.method)
            if size > limit {
                if !call.oneway { queue(errors.callTooLarge(call.method, size, limit), on: connection) }
                return
            }
        }
        switch service.check(call) {
        case .refused(let outcome):
            perform(outcome, of: call, on: connection)
        case .passed(let checked):
            perform(service.run(checked, caller: connection.caller), of: call, on: connection)
        }
    }

    /// Carries out a handler's (or the service's refusal's) outcome for `call`.
    private func perform(_ outcome: HandlerOutcome, of call: VarlinkCall, on connection: Connection) {
        switch outcome {
        case .reply(let reply):
            if !call.oneway { queueBounded(on: connection, method: call.method) { reply.encode(into: &$0) } }
        case .encoded(let writer):
            if !call.oneway { queueBounded(on: connection, method: call.method) { writer.write(into: &$0) } }
        case .stream(let start):
            var first = start.first
            first.continues = true
            let stream = StreamID(connection: connection.id, loop: index)
            guard queueBounded(on: connection, method: call.method, { first.encode(into: &$0) }) else {
                start.closed(stream)
                return
            }
            connection.state = .streaming
            connection.streamClosed = start.closed
            start.opened(stream)
        case .deferred(let work):
            log.debug("call in flight", ["method": call.method, "pid": String(connection.caller.pid)])
            connection.state = .waiting
            let id = connection.id
            let oneway = call.oneway
            Task { [self] in
                let reply = await work()
                self.complete(id, oneway ? nil : reply)
            }
        }
    }

    /// A message over `inlineParseLimit` bytes: refused at once when it names
    /// first a method whose calls may not be that large (no parse at all),
    /// else parsed on the parse thread, off this loop, while the connection
    /// waits; `drainCompletions` answers it.
    private func parseLarge(_ message: ArraySlice<UInt8>, on connection: Connection) {
        if let method = VarlinkCall.leadingMethod(of: message, methods: service.methodNames) {
            let limit = service.callSizeLimit(of: method)
            if message.count > limit {
                // Oneway or not is unknown without a parse: the refusal is always sent.
                queue(errors.callTooLarge(method, message.count, limit), on: connection)
                if now >= nextCallTooLargeLog {
                    log.warning(
                        "call over its method's size limit refused",
                        [
                            "method": method, "bytes": String(message.count), "uid": String(connection.caller.uid),
                            "pid": String(connection.caller.pid),
                        ])
                    nextCallTooLargeLog = now + 10_000
                }
                return
            }
        }
        connection.state = .waiting
        parser.parse(message, for: connection.id, methods: service.methodNames)
    }

    /// Sends what is queued on `connection`, then closes it when it is done
    /// and its peer left, or else updates what epoll watches for it.
    private func sendAndSettle(_ connection: Connection) {
        flush(connection)
        if connection.isClosed { return }
        if connection.isLingering {
            settleLingering(connection)
            return
        }
        // Calls held back by queued output the peer has now taken: answer them,
        // since no more input may come to wake this connection.
        while connection.heldBack, !connection.busy, connection.pendingOutput < outputHighWater {
            answer(connection)
            flush(connection)
            if connection.isClosed { return }
        }
        // A stream whose last reply has now gone out is done.
        if case .ending = connection.state, connection.pendingOutput == 0 {
            disconnect(connection)
            return
        }
        let idle = !connection.busy && connection.pendingOutput == 0
        if idle && (connection.peerClosedInput || (stopping && !ServingLoop.hasUnreadInput(connection.fd))) {
            disconnect(connection)
            return
        }
        updateInterest(connection)
    }

    private func drainCompletions(drainSeconds: Int) {
        var counter: UInt64 = 0
        _ = read(wakeFD, &counter, 8)
        for handover in takeHandovers() { serve(handover) }
        let done: [(UInt64, Completion)] = completions.withLock { list in
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
        for (id, completion) in done {
            if id == ServingLoop.watchdogProbeID {
                watchdogProbeInFlight = false
                hooks.watchdog()
                continue
            }
            guard let connection = connections[id], case .waiting = connection.state else { continue }
            connection.state = .open
            switch completion {
            case .reply(let reply): if let reply { queue(reply, on: connection) }
            case .parsed(.success(let call), let size): dispatch(call, size: size, on: connection)
            case .parsed(.failure(let failure), _): refuse(failure, on: connection)
            }
            if !connection.isClosed { process(connection) }
        }
        if let drainSeconds = stopAsked.withLock({ $0.take() }), !stopping {
            // Every connection the primary handed over came before its ask:
            // served now, so that the drain answers or closes each.
            for handover in takeHandovers() { serve(handover) }
            beginStopping(drainSeconds: drainSeconds)
        }
    }

    // MARK: Streams

    /// Sends what a job queued on streams it did not send itself.
    private func settleTouchedStreams() {
        guard !touchedStreams.isEmpty else { return }
        let touched = touchedStreams
        touchedStreams.removeAll(keepingCapacity: true)
        for connection in touched where !connection.isClosed && connection.pendingOutput > 0 {
            flush(connection)
            if !connection.isClosed { updateInterest(connection) }
        }
    }

    fileprivate func queue(_ reply: VarlinkReply, on connection: Connection) {
        connection.output.reserveWiping(Connection.replyReserve)
        reply.encode(into: &connection.output)
        connection.output.append(0)
    }

    /// Appends the reply `write` encodes, unless it would take the connection's
    /// queued output past `MaxOutputPerConnection`: then it is taken back and
    /// `ReplyTooLarge` goes in its place, and the result is false. Calls are
    /// answered only below the high-water mark (at most half the bound), so the
    /// error always fits.
    @discardableResult
    private func queueBounded(
        on connection: Connection, method: String, _ write: (inout [UInt8]) -> Void
    ) -> Bool {
        connection.output.reserveWiping(Connection.replyReserve)
        let start = connection.output.count
        write(&connection.output)
        let size = connection.output.count - start + 1
        guard connection.output.count + 1 - connection.outputOffset > limits.maxOutputPerConnection else {
            connection.output.append(0)
            return true
        }
        connection.output.wipe(start..<connection.output.count)
        connection.output.removeSubrange(start...)
        if connection.output.capacity > 2 * max(connection.output.count, 65536) {
            // Give back what the reply took: a peer that does not read keeps it otherwise.
            var kept: [UInt8] = []
            kept.reserveCapacity(connection.output.count)
            kept.append(contentsOf: connection.output)
            connection.output = kept
        }
        queue(errors.replyTooLarge(method, size, limits.maxOutputPerConnection), on: connection)
        if now >= nextReplyTooLargeLog {
            log.warning(
                "reply over the output bound refused",
                [
                    "method": method, "bytes": String(size), "uid": String(connection.caller.uid),
                    "pid": String(connection.caller.pid),
                ])
            nextReplyTooLargeLog = now + 10_000
        }
        return false
    }

    fileprivate func flush(_ connection: Connection) {
        while connection.pendingOutput > 0 {
            let fd = connection.fd
            let offset = connection.outputOffset
            let length = connection.pendingOutput
            let n: Int = connection.output.withUnsafeBytes { (bytes: UnsafeRawBufferPointer) -> Int in
                send(fd, bytes.baseAddress! + offset, length, ServingLoop.sendFlags)
            }
            if n < 0 {
                if errno == EINTR { continue }
                if errno == EAGAIN || errno == EWOULDBLOCK { break }
                disconnect(connection)
                return
            }
            connection.outputOffset += n
            connection.lastActivity = now
        }
        if connection.pendingOutput == 0 {
            // Sent: a reply may carry a secret, so zero what was queued.
            connection.output.wipe(0..<connection.output.count)
            connection.output.removeAll(keepingCapacity: connection.output.capacity <= 65536)
            connection.outputOffset = 0
        }
    }

    /// True when the peer sent bytes not read yet.
    private static func hasUnreadInput(_ fd: Int32) -> Bool {
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)) > 0
    }

    fileprivate func updateInterest(_ connection: Connection) {
        var wanted: UInt32 = 0
        if connection.wantsInput && connection.pendingOutput < outputHighWater {
            wanted |= VAULTD_EPOLLIN
        }
        if (connection.isStream || connection.isLingering) && !connection.peerClosedInput { wanted |= VAULTD_EPOLLIN }
        if connection.pendingOutput > 0 { wanted |= VAULTD_EPOLLOUT }
        if let interest = connection.interest, wanted != interest {
            connection.interest = wanted
            _ = vaultd_epoll_mod(epollFD, connection.fd, wanted, connection.id)
        }
        settleDeadline(connection)
    }

    // MARK: Deadlines

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
    private func settleDeadline(_ connection: Connection) {
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
    private func runDueTimers() {
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

    fileprivate func disconnect(_ connection: Connection) {
        if connection.isClosed { return }
        let closedStream = connection.streamClosed
        connection.streamClosed = nil
        connection.state = .closed
        server.admissions.withLock {
            $0.release(connection.caller.uid, privileged: connection.privileged, loop: index)
        }
        if connection.scheduledAt != nil { deadlines.cancel(.connection(connection.id)) }
        connection.output.wipe(0..<connection.output.count)
        connection.decoder.wipe()
        if connection.interest != nil { _ = vaultd_epoll_del(epollFD, connection.fd) }
        Glibc.close(connection.fd)
        connections[connection.id] = nil
        closedStream?(StreamID(connection: connection.id, loop: index))
        service.connectionClosed?(connection.caller)
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

extension VarlinkServer {
    /// Writes to the streams of one loop; handed to the jobs of
    /// `VarlinkServer.onLoop`, on that loop's thread, and valid only while
    /// the job runs. A stream of another loop is as good as gone here.
    public struct Streams {
        fileprivate unowned let loop: ServingLoop

        /// Queues `message` (a reply without its NUL) on `stream`; sent by
        /// `send`, or after the job. Nothing happens when the stream is gone.
        public func push(_ message: [UInt8], to stream: StreamID) {
            guard stream.loop == loop.index, let connection = loop.connections[stream.connection],
                case .streaming = connection.state
            else { return }
            if connection.pendingOutput == 0 { loop.touchedStreams.append(connection) }
            connection.output.append(contentsOf: message)
            connection.output.append(0)
        }

        /// Sends what the peer of `stream` takes now, and answers the bytes
        /// still queued on it; nil when the stream is gone.
        @discardableResult
        public func send(_ stream: StreamID) -> Int? {
            guard stream.loop == loop.index, let connection = loop.connections[stream.connection],
                connection.isStream
            else { return nil }
            loop.flush(connection)
            if connection.isClosed { return nil }
            loop.updateInterest(connection)
            return connection.pendingOutput
        }

        /// Ends `stream`: the message being sent is finished, the rest of the
        /// queue dropped, and `reply` sent last; the connection closes once it is
        /// out, or after `milliseconds` at most.
        public func end(_ stream: StreamID, with reply: VarlinkReply, within milliseconds: UInt64) {
            guard stream.loop == loop.index, let connection = loop.connections[stream.connection],
                case .streaming = connection.state
            else { return }
            let rest = connection.output[connection.outputOffset...]
            let end = rest.firstIndex(of: 0).map { $0 + 1 } ?? connection.output.count
            connection.output.removeSubrange(end...)
            loop.queue(reply, on: connection)
            connection.state = .ending(deadline: loop.now + milliseconds)
            loop.flush(connection)
            if connection.pendingOutput == 0 { loop.disconnect(connection) }
            if connection.isClosed { return }
            loop.updateInterest(connection)
        }
    }
}
