import Glibc
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// Why a call did not get a reply.
public enum ClientError: Error, Sendable, Equatable {
    /// Nothing answers on the socket.
    case unreachable(path: String, reason: String)
    /// The connection broke or the peer sent something that is not Varlink.
    case connection(String)
    /// The process serving the socket runs as `uid`, which is neither root,
    /// nor the caller, nor the system instance's service user: nothing was sent.
    case untrustedPeer(path: String, uid: UInt32)
    /// A connect, send or receive waited longer than the client's timeout.
    case timedOut(path: String, waiting: String)
}

extension ClientError: CustomStringConvertible {
    /// What happened and what to do, for a human.
    public var description: String {
        switch self {
        case .unreachable(let path, let reason): return "vaultd is not reachable at \(path) (\(reason))"
        case .connection(let message): return message
        case .untrustedPeer(let path, let uid):
            return
                "the socket \(path) is served by uid \(uid), not by root or you; refusing to send credentials. Someone may have put their own socket in vaultd's place: check who owns its directory, or pass the right --socket PATH"
        case .timedOut(let path, let waiting):
            return
                "vaultd at \(path) did not answer in time (waiting for \(waiting)); it may be stuck or overloaded: check its log (journalctl --user -u vaultd), or allow longer (vaultctl --timeout SECONDS)"
        }
    }
}

/// A blocking Varlink client on one Unix socket connection: send a call, read
/// its reply. Small enough that vaultctl starts in a few milliseconds.
public final class VarlinkClient {
    /// The socket this client is connected to.
    public let path: String
    private let fd: Int32
    private var decoder = VarlinkFrameDecoder(maximumSize: 16 << 20)
    /// Where replies are received before the decoder takes them: allocated
    /// once per client and not zeroed first (only received bytes are read;
    /// zeroing 64 KiB was a sixth of a short-lived vaultctl's work). The
    /// bytes received are zeroed when the client goes.
    private let receiveBuffer = UnsafeMutableRawBufferPointer.allocate(byteCount: 65536, alignment: 1)
    private var receivedHighWater = 0
    /// Why an earlier `call` failed: Varlink replies carry no call id, so a
    /// reply that comes late would be read as the next call's. The connection
    /// is shut down and every later `call` fails with this.
    private var broken: ClientError?

    /// Called with each message received, before it is decoded: for a program
    /// that logs the wire, or a test that checks what vaultd sent (that no
    /// reply or event carried a raw token).
    public var messageObserver: ((ArraySlice<UInt8>) -> Void)?

    /// The user the system instance of vaultd runs as (`DynamicUser=` of
    /// `vaultd.service` takes the unit's name); trusted like root.
    public static let systemServiceUser = "vaultd"

    /// Connects to `path` and checks, before anything is sent, that the process
    /// serving it is root, this process's effective user, or the system
    /// instance's service user: a socket someone else put in vaultd's place
    /// never sees a token. With `timeoutSeconds`, a send or a receive that
    /// waits longer fails with `timedOut` (tests, and callers that must not hang).
    ///
    /// `connectTimeoutSeconds` bounds the connect itself (default: the same as
    /// `timeoutSeconds`). A Unix socket connect does not go over a network, but
    /// it does wait when the listener's backlog is full (a vaultd that stopped
    /// accepting): Linux bounds that wait by the socket's send timeout, which is
    /// set before connecting.
    public convenience init(path: String, timeoutSeconds: Int? = nil, connectTimeoutSeconds: Int? = nil)
        throws(ClientError)
    {
        try self.init(
            path: path, timeoutSeconds: timeoutSeconds, connectTimeoutSeconds: connectTimeoutSeconds,
            serviceUID: VarlinkClient.serviceUID)
    }

    /// Connects as above, trusting root, this process's effective user and
    /// whoever `serviceUID` names. `UserLookup` passes `{ nil }`: a lookup of
    /// the service user must not look up the service user.
    init(path: String, timeoutSeconds: Int?, connectTimeoutSeconds: Int?, serviceUID: () -> uid_t?)
        throws(ClientError)
    {
        self.path = path
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else {
            throw .unreachable(path: path, reason: SystemError("socket").description)
        }
        if let connectTimeout = connectTimeoutSeconds ?? timeoutSeconds {
            VarlinkClient.setTimeout(fd, SO_SNDTIMEO, seconds: connectTimeout)
        }
        do {
            try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
                while Glibc.connect(fd, address, length) != 0 {
                    if errno == EINTR { continue }
                    throw SystemError("connect")
                }
            }
        } catch {
            close(fd)
            if error.errno == EAGAIN || error.errno == EINPROGRESS {
                throw .timedOut(path: path, waiting: "connect: vaultd accepts no connections")
            }
            throw .unreachable(path: path, reason: error.description)
        }
        self.fd = fd
        // Unset when only the connect is bounded, so a long watch is not cut short.
        VarlinkClient.setTimeout(fd, SO_SNDTIMEO, seconds: timeoutSeconds ?? 0)
        if let timeoutSeconds { VarlinkClient.setTimeout(fd, SO_RCVTIMEO, seconds: timeoutSeconds) }
        let peer: uid_t
        do { peer = try UnixSocket.peerUID(fd) } catch {
            throw .connection("cannot tell who serves \(path): \(error)")
        }
        guard VarlinkClient.trusts(peer: peer, euid: geteuid(), serviceUID: serviceUID) else {
            throw .untrustedPeer(path: path, uid: peer)
        }
    }

    /// Changes how long a receive waits (0: without limit), for a stream
    /// whose messages may be far apart once it has started.
    public func setReceiveTimeout(seconds: Int) { VarlinkClient.setTimeout(fd, SO_RCVTIMEO, seconds: seconds) }

    /// Sets `SO_SNDTIMEO` or `SO_RCVTIMEO`; 0 waits forever.
    private static func setTimeout(_ fd: Int32, _ option: Int32, seconds: Int) {
        var limit = timeval(tv_sec: seconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, option, &limit, socklen_t(MemoryLayout<timeval>.size))
    }

    /// The connected socket, for callers that poll it, shut it down, or write
    /// to it in ways `send` does not (tests of malformed input). The client
    /// owns it and closes it when it goes away.
    public var fileDescriptor: Int32 { fd }

    /// Whether a socket served by `peer` may receive this process's calls:
    /// root, the process's own effective user, or the system service user.
    /// `serviceUID` is asked only when the first two do not match, so the
    /// usual case costs one `getsockopt` and no name lookup.
    public static func trusts(peer: uid_t, euid: uid_t, serviceUID: () -> uid_t?) -> Bool {
        if peer == 0 || peer == euid { return true }
        return serviceUID() == peer
    }

    /// The uid of `systemServiceUser`, when that user exists (while the system
    /// instance runs, from systemd's user database; see `UserLookup`).
    static func serviceUID() -> uid_t? {
        UserLookup.uid(named: systemServiceUser)
    }

    deinit {
        close(fd)
        receiveBuffer.wipe(first: receivedHighWater)
        receiveBuffer.deallocate()
    }

    /// Sends one call and returns its (first) reply. After a call that failed
    /// (a timeout, a broken connection) the connection is not used again:
    /// every later call fails, so a late reply is never taken for another's.
    public func call(_ method: String, _ parameters: [String: JSON] = [:], more: Bool = false) throws(ClientError)
        -> VarlinkReply
    {
        if let broken {
            throw .connection("an earlier call on this connection to \(path) failed (\(broken)); open a new connection")
        }
        do {
            try send(VarlinkCall(method: method, parameters: parameters, more: more))
        } catch {
            // vaultd may have refused the connection (TooManyConnections) with a
            // reply and closed it before the call went out: that reply says why.
            if let reply = try? receive(), reply.error != nil { return reply }
            breakConnection(error)
            throw error
        }
        do {
            return try receive()
        } catch {
            breakConnection(error)
            throw error
        }
    }

    private func breakConnection(_ error: ClientError) {
        broken = error
        shutdown(fd, Int32(SHUT_RDWR))
    }

    /// Sends a call without waiting for a reply.
    public func send(_ call: VarlinkCall) throws(ClientError) {
        var message = call.encoded()
        message.append(0)
        try send(bytes: message)
    }

    /// Sends `bytes` as they are: no framing is added, nothing is checked.
    /// For tests of what a well-behaved client never sends (bad JSON, a
    /// message cut short, pipelined calls in one write).
    public func send(bytes: [UInt8]) throws(ClientError) {
        let failure: SystemError? = bytes.withUnsafeBytes { raw in
            do throws(SystemError) {
                try UnixSocket.sendAll(fd, raw)
                return nil
            } catch {
                return error
            }
        }
        guard let failure else { return }
        if failure.errno == EAGAIN { throw .timedOut(path: path, waiting: "send") }
        throw .connection("sending to \(path): \(failure)")
    }

    /// Reads the next reply; a connection vaultd closed before replying is an error.
    public func receive() throws(ClientError) -> VarlinkReply {
        guard let reply = try nextReply() else {
            throw .connection("vaultd at \(path) closed the connection before replying")
        }
        return reply
    }

    /// Reads the next reply, or nil when vaultd closed the connection between
    /// messages (the end of a stream, a connection it dropped). A close in the
    /// middle of a message is an error.
    public func nextReply() throws(ClientError) -> VarlinkReply? {
        guard let message = try nextMessage() else { return nil }
        do { return try VarlinkReply(message: message) } catch {
            throw ClientError.connection("vaultd at \(path) sent a message that is not a Varlink reply")
        }
    }

    /// Reads the next message as it came, without its NUL, or nil when vaultd
    /// closed the connection between messages; for a caller that reads the
    /// reply itself (`vaultctl token`'s short path) and decodes only what it
    /// does not expect.
    public func nextMessage() throws(ClientError) -> ArraySlice<UInt8>? {
        while true {
            do {
                if let message = try decoder.next() {
                    messageObserver?(message)
                    return message
                }
            } catch {
                throw .connection("vaultd at \(path) sent a reply over the size limit")
            }
            let n: Int
            do { n = try UnixSocket.receive(fd, into: receiveBuffer) } catch {
                if error.errno == EAGAIN { throw .timedOut(path: path, waiting: "a reply") }
                throw .connection("reading from \(path): \(error)")
            }
            if n == 0 {
                if decoder.hasPartialMessage {
                    throw .connection("vaultd at \(path) closed the connection in the middle of a reply")
                }
                return nil
            }
            receivedHighWater = max(receivedHighWater, n)
            decoder.append(UnsafeRawBufferPointer(rebasing: receiveBuffer[0..<n]))
        }
    }
}
