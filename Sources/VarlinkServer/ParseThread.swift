import CShim
import Dispatch
import Glibc
import Synchronization
import Varlink

/// Parses the large messages of the serving loop (over
/// `VarlinkServer.inlineParseLimit` bytes) on a thread of its own at the
/// lowest priority (nice 19), so that a client sending megabytes of numbers
/// or nested objects takes the CPU from nobody who is busy serving, and
/// delays no other client's call. One message at a time, in the order they
/// came; the connection waits meanwhile (it is not read), so at most one
/// message per connection is queued. The result goes back to the loop through
/// `ServingLoop.complete(_:_:)` (one parse thread per loop, started at its
/// first large message).
final class ParseThread: Sendable {
    private struct Job: Sendable {
        var connection: UInt64
        var message: [UInt8]
        var methods: VarlinkMethodNames
    }

    private struct State {
        var jobs: [Job] = []
        var started = false
    }

    private weak let loop: ServingLoop?
    private let state = Mutex(State())
    private let ready = DispatchSemaphore(value: 0)

    init(loop: ServingLoop) { self.loop = loop }

    /// Queues `message` (copied; the copy is zeroed once parsed) for the call
    /// of connection `connection`.
    func parse(_ message: ArraySlice<UInt8>, for connection: UInt64, methods: VarlinkMethodNames) {
        let job = Job(connection: connection, message: Array(message), methods: methods)
        let start = state.withLock { state -> Bool in
            state.jobs.append(job)
            defer { state.started = true }
            return !state.started
        }
        if start { startThread() }
        ready.signal()
    }

    private func startThread() {
        let context = Unmanaged.passRetained(self).toOpaque()
        var thread = pthread_t()
        let created = pthread_create(
            &thread, nil,
            { context in
                let parser = Unmanaged<ParseThread>.fromOpaque(context!).takeRetainedValue()
                parser.run()
                return nil
            }, context)
        if created == 0 {
            pthread_detach(thread)
        } else {
            // No thread: parse on the caller's; the loop then pays for it.
            Unmanaged<ParseThread>.fromOpaque(context).release()
            state.withLock { $0.started = false }
            drain()
        }
    }

    private func run() {
        // The nice value is per thread on Linux: who 0 is this thread.
        _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, 19)
        while true {
            ready.wait()
            drain()
        }
    }

    /// Parses every queued message.
    private func drain() {
        while var job = state.withLock({ $0.jobs.isEmpty ? nil : $0.jobs.removeFirst() }) {
            // Taken out of the job, so that this is the only reference and the
            // zeroing below reaches the bytes themselves, not a copy.
            var message: [UInt8] = []
            swap(&message, &job.message)
            let parsed: Result<VarlinkCall, VarlinkCall.DecodingFailure>
            do throws(VarlinkCall.DecodingFailure) {
                parsed = .success(try VarlinkCall(message: message[...], methods: job.methods))
            } catch {
                parsed = .failure(error)
            }
            let size = message.count
            // A call may carry a secret (a Login's token): zero the copy.
            message.withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) }
            guard let loop else { return }
            loop.complete(job.connection, .parsed(parsed, size: size))
        }
    }
}
