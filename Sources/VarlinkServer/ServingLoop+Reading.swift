import CShim
import Glibc
import Varlink

/// What a connection's events do: its bytes read into its decoder, or,
/// after a malformed message, read and dropped while it lingers.
extension ServingLoop {
    func serve(_ connection: Connection, events: UInt32) {
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

    /// Ends a connection that sent something that is no call: its last reply
    /// says what was wrong, then it lingers (see `Connection.State.lingering`).
    /// What it sent after is never read as calls.
    func refuseMalformed(on connection: Connection, problem: String) {
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
    func settleLingering(_ connection: Connection) {
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
}
