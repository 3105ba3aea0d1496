import Glibc
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

    /// The user the system instance of vaultd runs as (`DynamicUser=` of
    /// `vaultd.service` takes the unit's name); trusted like root.
    public static let systemServiceUser = "vaultd"

    /// Connects to `path` and checks, before anything is sent, that the process
    /// serving it is root, this process's effective user, or the system
    /// instance's service user: a socket someone else put in vaultd's place
    /// never sees a token. With `timeoutSeconds`, a send or a receive that
    /// waits longer fails (tests, and callers that must not hang).
    public init(path: String, timeoutSeconds: Int? = nil) throws(ClientError) {
        self.path = path
        do { fd = try UnixSocket.connect(to: path) } catch {
            throw .unreachable(path: path, reason: error.description)
        }
        if let timeoutSeconds {
            var limit = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
            let size = socklen_t(MemoryLayout<timeval>.size)
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, size)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, size)
        }
        let peer: uid_t
        do { peer = try UnixSocket.peerUID(fd) } catch {
            close(fd)
            throw .connection("cannot tell who serves \(path): \(error)")
        }
        guard VarlinkClient.trusts(peer: peer, euid: geteuid(), serviceUID: VarlinkClient.serviceUID) else {
            close(fd)
            throw .untrustedPeer(path: path, uid: peer)
        }
    }

    /// Whether a socket served by `peer` may receive this process's calls:
    /// root, the process's own effective user, or the system service user.
    /// `serviceUID` is asked only when the first two do not match, so the
    /// usual case costs one `getsockopt` and no name lookup.
    public static func trusts(peer: uid_t, euid: uid_t, serviceUID: () -> uid_t?) -> Bool {
        if peer == 0 || peer == euid { return true }
        return serviceUID() == peer
    }

    /// The uid of `systemServiceUser`, when that user exists (while the system
    /// instance runs, through nss-systemd).
    static func serviceUID() -> uid_t? {
        getpwnam(systemServiceUser).map { $0.pointee.pw_uid }
    }

    deinit { close(fd) }

    /// Sends one call and returns its (first) reply.
    public func call(_ method: String, _ parameters: [String: JSON] = [:], more: Bool = false) throws(ClientError)
        -> VarlinkReply
    {
        do {
            try send(VarlinkCall(method: method, parameters: parameters, more: more))
        } catch {
            // vaultd may have refused the connection (TooManyConnections) with a
            // reply and closed it before the call went out: that reply says why.
            if let reply = try? receive(), reply.error != nil { return reply }
            throw error
        }
        return try receive()
    }

    /// Sends a call without waiting for a reply.
    public func send(_ call: VarlinkCall) throws(ClientError) {
        var message = call.encoded()
        message.append(0)
        let failure: SystemError? = message.withUnsafeBytes { bytes in
            do throws(SystemError) {
                try UnixSocket.sendAll(fd, bytes)
                return nil
            } catch {
                return error
            }
        }
        if let failure { throw .connection("sending to \(path): \(failure)") }
    }

    /// Reads the next reply.
    public func receive() throws(ClientError) -> VarlinkReply {
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            do {
                if let message = try decoder.next() {
                    do { return try VarlinkReply(message: message) } catch {
                        throw ClientError.connection("vaultd at \(path) sent a message that is not a Varlink reply")
                    }
                }
            } catch let error as ClientError {
                throw error
            } catch {
                throw .connection("vaultd at \(path) sent a reply over the size limit")
            }
            let received: Result<Int, SystemError> = buffer.withUnsafeMutableBytes { raw in
                do throws(SystemError) { return .success(try UnixSocket.receive(fd, into: raw)) } catch {
                    return .failure(error)
                }
            }
            let n: Int
            switch received {
            case .success(let count): n = count
            case .failure(let error): throw .connection("reading from \(path): \(error)")
            }
            if n == 0 { throw .connection("vaultd at \(path) closed the connection before replying") }
            decoder.append(buffer[0..<n])
        }
    }
}
