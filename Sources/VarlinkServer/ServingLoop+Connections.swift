import CShim
import Glibc
import Varlink
import VaultSystem

/// A connection's life on the loop: accepted and admitted, served, closed.
extension ServingLoop {
    func acceptAll() {
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
            let admission = admissions.admit(caller, privileged: privileged, limits)
            guard admission == .admit else {
                refuse(fd, caller, admission)
                continue
            }
            caller.executable = ServingLoop.executable(of: pid)
            let id = nextID
            nextID += 1
            caller.connection = id
            let connection = Connection(
                id: id, fd: fd, caller: caller, maximumMessageSize: VarlinkServer.maximumMessageSize)
            connection.privileged = privileged
            connection.lastActivity = now
            connections[id] = connection
            settleDeadline(connection)
            connection.interest = VAULTD_EPOLLIN
            if vaultd_epoll_add(epollFD, fd, VAULTD_EPOLLIN, id) != 0 { disconnect(connection) }
        }
    }

    /// Refuses a new connection at once, so that no user can use up the
    /// daemon's descriptors or the connections kept for root and the admin
    /// group: the refusal is its only reply, sent if the socket takes it now.
    func refuse(_ fd: Int32, _ caller: Caller, _ admission: ServingLimits.Admission) {
        var reply = errors.refused(admission, caller, limits).encoded()
        reply.append(0)
        _ = reply.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, ServingLoop.sendFlags) }
        Glibc.close(fd)
        if now >= nextRefusalLog {
            let open = admissions.open
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

    func disconnect(_ connection: Connection) {
        if connection.isClosed { return }
        let closedStream = connection.streamClosed
        connection.streamClosed = nil
        connection.state = .closed
        admissions.release(connection.caller.uid, privileged: connection.privileged)
        if connection.scheduledAt != nil { deadlines.cancel(.connection(connection.id)) }
        connection.output.wipe(0..<connection.output.count)
        connection.decoder.wipe()
        if connection.interest != nil { _ = vaultd_epoll_del(epollFD, connection.fd) }
        Glibc.close(connection.fd)
        connections[connection.id] = nil
        closedStream?(StreamID(connection: connection.id))
        guard let closedWork = service.connectionClosed?(connection.caller) else { return }
        // Under an id of its own: the connection's may still have a deferred call in flight.
        let id = nextID
        nextID += 1
        startWork(id) { [self] in
            await closedWork()
            self.complete(id, nil)
        }
    }
}
