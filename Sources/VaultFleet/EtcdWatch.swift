import CHTTP
import Dispatch
import Glibc
import Synchronization
import Varlink
import VaultCore
import VaultDaemon
import VaultSystem

/// One change a watch delivers: a key put (its new value) or deleted.
struct EtcdWatchEvent: Sendable, Equatable {
    /// What happened to the key.
    enum Kind: Sendable, Equatable {
        case put
        case delete
    }

    var kind: Kind
    var key: [UInt8]
    /// The new value of a put; empty for a delete.
    var value: [UInt8]
    /// The revision of this change.
    var modRevision: Int64
    /// The revision the key was created at (0 for a delete).
    var createRevision: Int64
}

/// A watch of every key under a prefix (or of one key) through the etcd
/// gateway's streaming `/v3/watch`, from a given revision on.
///
/// The transfer blocks a thread of the watch's own (`vaultd-watch`), never
/// the cooperative pool nor `WorkerPool`. `onEvents` gets each batch
/// of changes in revision order, with the revision the watch has delivered
/// up to; `onReset` is called once when the watch cannot go on (its revision
/// was compacted away, or one message passed `maximumMessage`), and the
/// watch then ends: the owner reloads every key
/// with a range and starts a new watch from that range's revision + 1. Both
/// are called on the watch's thread, one at a time: they must return quickly
/// (hop to the owner's actor), and may call `stop()`.
///
/// When the stream ends for any other reason (the member died, lost its
/// leader, or sent nothing for `idleTimeoutSeconds`), the watch connects to
/// the next endpoint after a bounded backoff (50 ms doubling to 2 s) and
/// resumes from the last delivered revision + 1: no change is skipped, none
/// delivered twice. The watch asks for etcd's progress notifications (which
/// also move its revision on while nothing changes) and requires its member
/// to have a leader (`hasleader`, as etcd's own client's `WithRequireLeader`),
/// so a member cut off from the quorum ends the stream instead of going quiet.
/// etcd sends progress notifications every 10 minutes by default, so an idle
/// stream is also given up after `idleTimeoutSeconds` and resumed: cheap, and
/// the bound on how long a dead connection (a vanished host) goes unnoticed.
final class EtcdWatch: Sendable {
    /// What the watch thread and `stop()` share.
    private struct State {
        var started = false
        var stopping = false
        var finished = false
        /// The last revision delivered (the watch resumes from the next one).
        var delivered: Int64
        /// The endpoint streaming now, nil between connections.
        var connected: String?
        /// How many streams etcd created for the watch so far.
        var streams = 0
        /// The kernel thread id of the watch's thread while it runs.
        var threadID: Int32 = 0
        var thread: pthread_t?
        /// The transfer in progress, cancelled by `stop()`.
        var stream: HTTPStream?
    }

    /// The client whose endpoints the watch streams from.
    let client: EtcdClient
    /// The watched prefix, or the one watched key when `exactKey`.
    let prefix: [UInt8]
    /// True when only the key `prefix` itself is watched.
    let exactKey: Bool
    /// The first revision the watch delivers.
    let fromRevision: Int64
    /// How long a stream may send nothing before it is given up and resumed.
    let idleTimeoutSeconds: Double

    private let onEvents: @Sendable ([EtcdWatchEvent], Int64) -> Void
    private let onReset: @Sendable (VaultError) -> Void
    private let state: Mutex<State>
    /// Wakes the thread from its backoff when the watch stops.
    private let wake = DispatchSemaphore(value: 0)
    /// Signalled once when the thread ends.
    private let ended = DispatchSemaphore(value: 0)

    /// The longest one JSON object of the stream may be; a longer one ends the
    /// watch with `onReset` (reload with ranges, which etcd can page).
    static let maximumMessage = 32 * 1024 * 1024

    /// A watch of every key starting with `prefix` (only the key `prefix` when
    /// `exactKey`) from `fromRevision` on, not started yet. `onEvents(events,
    /// revision)` gets each batch of changes (never empty), `revision` being
    /// the last one delivered; `onReset` why the watch ended for good.
    init(
        client: EtcdClient, prefix: [UInt8], exactKey: Bool = false, fromRevision: Int64,
        idleTimeoutSeconds: Double = 30, onEvents: @escaping @Sendable ([EtcdWatchEvent], Int64) -> Void,
        onReset: @escaping @Sendable (VaultError) -> Void
    ) {
        self.client = client
        self.prefix = prefix
        self.exactKey = exactKey
        self.fromRevision = max(1, fromRevision)
        self.idleTimeoutSeconds = idleTimeoutSeconds
        self.onEvents = onEvents
        self.onReset = onReset
        state = Mutex(State(delivered: max(1, fromRevision) - 1))
    }

    deinit {
        // The thread holds the watch while it runs, so this runs after it ended.
        if let thread = state.withLock({ $0.thread }) { pthread_detach(thread) }
    }

    /// The last revision delivered to `onEvents` (or `fromRevision` - 1).
    var deliveredRevision: Int64 { state.withLock { $0.delivered } }

    /// The endpoint the watch streams from now; nil while it is between connections or ended.
    var connectedEndpoint: String? { state.withLock { $0.connected } }

    /// How many streams etcd created for the watch so far (1 + the times it resumed).
    var streamCount: Int { state.withLock { $0.streams } }

    /// The kernel thread id of the watch's thread (`/proc/self/task/ID`), 0 before it started.
    var threadID: Int32 { state.withLock { $0.threadID } }

    /// True once the watch's thread has ended (after `stop()` or `onReset`).
    var isFinished: Bool { state.withLock { $0.finished } }

    /// Starts the watch's thread; a second call does nothing. Throws when no
    /// thread could be started. The thread holds the watch until it ends:
    /// the owner calls `stop()` when done with it.
    func start() throws(VaultError) {
        let first = state.withLock { state in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        final class Box {
            let watch: EtcdWatch
            init(_ watch: EtcdWatch) { self.watch = watch }
        }
        let context = Unmanaged.passRetained(Box(self)).toOpaque()
        var thread = pthread_t()
        let status = pthread_create(
            &thread, nil,
            { context in
                let box = Unmanaged<Box>.fromOpaque(context!).takeRetainedValue()
                box.watch.run()
                return nil
            }, context)
        guard status == 0 else {
            Unmanaged<Box>.fromOpaque(context).release()
            state.withLock { $0.finished = true }
            throw VaultError(
                .internalError, "the etcd watch could not start its thread (error \(status)): too many threads?")
        }
        state.withLock { $0.thread = thread }
    }

    /// Stops the watch: the stream in progress is cut at once, no callback
    /// comes after this returns (unless called from a callback), and the
    /// thread has ended — waited for at most `seconds`; false when it had not
    /// ended by then (it ends by itself as soon as libcurl returns).
    @discardableResult
    func stop(waitingAtMost seconds: Double = 5) -> Bool {
        let (stream, thread, started) = state.withLock { state in
            state.stopping = true
            return (state.stream, state.thread, state.started)
        }
        stream?.cancel()
        wake.signal()
        guard started, let thread else { return true }
        // Called from onEvents or onReset: the thread ends when the callback returns.
        if pthread_equal(thread, pthread_self()) != 0 { return false }
        let done = ended.wait(timeout: .now() + .milliseconds(Int(seconds * 1000))) == .success
        if done {
            ended.signal()  // a second stop() finds it ended too
            let joined = state.withLock { state -> pthread_t? in
                defer { state.thread = nil }
                return state.thread
            }
            if let joined { pthread_join(joined, nil) }
        }
        return done
    }

    // MARK: The watch's thread

    /// How one stream ended.
    private enum StreamEnd {
        /// `stop()` was called.
        case stopped
        /// The watch cannot resume: `onReset` with this error.
        case reset(VaultError)
        /// The stream ended or failed; `progressed` when it was created or delivered.
        case broken(reason: String, progressed: Bool)
    }

    private func run() {
        let id = vaultd_http_stream_thread_begin("vaultd-watch")
        state.withLock { $0.threadID = id }
        defer {
            state.withLock { state in
                state.finished = true
                state.connected = nil
                state.threadID = 0
            }
            ended.signal()
        }
        let endpoints = client.endpoints
        var index = 0
        var failures = 0
        while !state.withLock({ $0.stopping }) {
            switch stream(from: endpoints[index % endpoints.count]) {
            case .stopped:
                return
            case .reset(let error):
                if !state.withLock({ $0.stopping }) { onReset(error) }
                return
            case .broken(_, let progressed):
                // The next member; a quick retry after a stream that worked,
                // a growing one while none do.
                index += 1
                failures = progressed ? 1 : failures + 1
                let backoff = min(50 << min(failures - 1, 6), 2000)
                _ = wake.wait(timeout: .now() + .milliseconds(backoff))
            }
        }
    }

    /// One stream from `endpoint`, resuming after the last delivered revision.
    private func stream(from endpoint: String) -> StreamEnd {
        guard let stream = HTTPStream() else {
            return .broken(reason: "out of memory", progressed: false)
        }
        let start = state.withLock { state -> Int64? in
            guard !state.stopping else { return nil }
            state.stream = stream
            return state.delivered + 1
        }
        guard let start else { return .stopped }
        defer {
            state.withLock { state in
                state.stream = nil
                state.connected = nil
            }
        }
        var create: [String: JSON] = [
            "key": .string(Base64.encode(prefix)), "start_revision": .string(String(start)),
            "progress_notify": true,
        ]
        if !exactKey { create["range_end"] = .string(Base64.encode(EtcdClient.prefixEnd(prefix))) }
        let request: JSON = ["create_request": .object(create)]

        var buffer: [UInt8] = []
        var outcome: StreamEnd?
        var progressed = false
        let end = stream.post(
            endpoint + "/v3/watch", body: request.serialized(), headers: ["Grpc-Metadata-hasleader: true"],
            connectTimeoutSeconds: min(2, client.timeoutSeconds), idleTimeoutSeconds: idleTimeoutSeconds
        ) { chunk in
            buffer.append(contentsOf: chunk)
            while let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = buffer[..<newline]
                defer { buffer.removeSubrange(...newline) }
                guard !line.allSatisfy({ $0 == 0x20 || $0 == 0x0D }) else { continue }
                if let end = handle(line, endpoint: endpoint, progressed: &progressed) {
                    outcome = end
                    return false
                }
            }
            if buffer.count > Self.maximumMessage {
                outcome = .reset(
                    VaultError(
                        .storeFailed,
                        "etcd at \(HTTPClient.host(of: endpoint)) sent a watch message larger than \(Self.maximumMessage) bytes: reload with a range and watch again from its revision"
                    ))
                return false
            }
            return true
        }
        if state.withLock({ $0.stopping }) || end.cancelled { return .stopped }
        if let outcome { return outcome }
        // Whatever is left is an answer without a newline: etcd's error object.
        if !buffer.isEmpty, let end = handle(buffer[...], endpoint: endpoint, progressed: &progressed) {
            return end
        }
        let reason = end.failure?.reason ?? "etcd at \(HTTPClient.host(of: endpoint)) ended the watch"
        return .broken(reason: reason, progressed: progressed)
    }

    /// Acts on one JSON object of the stream; how the stream ends, nil to go on.
    private func handle(_ line: ArraySlice<UInt8>, endpoint: String, progressed: inout Bool) -> StreamEnd? {
        let host = HTTPClient.host(of: endpoint)
        guard let message = try? JSON.parse(line) else {
            return .broken(reason: "etcd at \(host) sent a watch message that is no JSON", progressed: progressed)
        }
        guard let result = message["result"] else {
            // The gateway's error object: the member failed the stream (no leader, shutting down).
            let error = message["error"]
            let reason = error?["message"]?.stringValue ?? error?.stringValue ?? message["message"]?.stringValue
            return .broken(
                reason: "etcd at \(host) ended the watch: \(reason ?? "an answer without a result")",
                progressed: progressed)
        }
        if result["canceled"]?.boolValue == true {
            let compacted = EtcdClient.int(result["compact_revision"])
            if compacted > 0 {
                let from = state.withLock { $0.delivered } + 1
                return .reset(
                    VaultError(
                        .storeFailed,
                        "the etcd watch of \(String(decoding: prefix, as: UTF8.self)) cannot resume at revision \(from): etcd compacted its history up to revision \(compacted); reload every key with a range and watch again from its revision"
                    ))
            }
            let reason = result["cancel_reason"]?.stringValue ?? "no reason given"
            return .broken(reason: "etcd at \(host) cancelled the watch: \(reason)", progressed: progressed)
        }
        if result["created"]?.boolValue == true {
            progressed = true
            state.withLock { state in
                state.connected = endpoint
                state.streams += 1
            }
        }
        let items = result["events"]?.arrayValue ?? []
        guard !items.isEmpty else {
            // A progress notification (etcd sends them to watches that have
            // been sent every change): nothing under the prefix changed up to
            // the header's revision. A creation's header says nothing of the kind.
            if result["created"]?.boolValue != true {
                let revision = EtcdClient.int(result["header"]?["revision"])
                state.withLock { $0.delivered = max($0.delivered, revision) }
            }
            return nil
        }
        var events: [EtcdWatchEvent] = []
        events.reserveCapacity(items.count)
        for item in items {
            guard let kv = try? EtcdClient.keyValues(.array([item["kv"] ?? .null])).first else {
                return .broken(reason: "etcd at \(host) sent a watch event without a key", progressed: progressed)
            }
            events.append(
                EtcdWatchEvent(
                    kind: item["type"]?.stringValue == "DELETE" ? .delete : .put, key: kv.key, value: kv.value,
                    modRevision: kv.modRevision, createRevision: kv.createRevision))
        }
        progressed = true
        // Resumed streams start after the last delivered revision; this only
        // guards against delivering a change twice should a member repeat one.
        let delivered = state.withLock { $0.delivered }
        let fresh = events.filter { $0.modRevision > delivered }
        guard let last = fresh.last?.modRevision, !state.withLock({ $0.stopping }) else { return nil }
        state.withLock { $0.delivered = last }
        onEvents(fresh, last)
        return nil
    }
}
