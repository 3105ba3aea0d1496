import CShim
import Glibc
import Varlink
import VaultSystem

/// Replies out: queued within the connection's output bound, sent as far
/// as the peer takes them, and the rest left to epoll.
extension ServingLoop {
    /// Sends what is queued on `connection`, then closes it when it is done
    /// and its peer left, or else updates what epoll watches for it.
    func sendAndSettle(_ connection: Connection) {
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

    /// Sends what a job queued on streams it did not send itself.
    func settleTouchedStreams() {
        guard !touchedStreams.isEmpty else { return }
        let touched = touchedStreams
        touchedStreams.removeAll(keepingCapacity: true)
        for connection in touched where !connection.isClosed && connection.pendingOutput > 0 {
            flush(connection)
            if !connection.isClosed { updateInterest(connection) }
        }
    }

    func queue(_ reply: VarlinkReply, on connection: Connection) {
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
    func queueBounded(
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

    func flush(_ connection: Connection) {
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

    func updateInterest(_ connection: Connection) {
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
}

extension VarlinkServer {
    /// Writes to the streams; handed to the jobs of `VarlinkServer.onLoop`,
    /// on the loop's thread, and valid only while the job runs.
    public struct Streams {
        unowned let loop: ServingLoop

        /// Queues `message` (a reply without its NUL) on `stream`; sent by
        /// `send`, or after the job. Nothing happens when the stream is gone.
        public func push(_ message: [UInt8], to stream: StreamID) {
            guard let connection = loop.connections[stream.connection],
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
            guard let connection = loop.connections[stream.connection],
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
            guard let connection = loop.connections[stream.connection],
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
