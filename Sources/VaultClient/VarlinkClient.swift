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
}

/// A blocking Varlink client on one Unix socket connection: send a call, read
/// its reply. Small enough that vaultctl starts in a few milliseconds.
public final class VarlinkClient {
    /// The socket this client is connected to.
    public let path: String
    private let fd: Int32
    private var decoder = VarlinkFrameDecoder(maximumSize: 16 << 20)

    /// Connects to `path`.
    public init(path: String) throws(ClientError) {
        self.path = path
        do { fd = try UnixSocket.connect(to: path) } catch {
            throw .unreachable(path: path, reason: error.description)
        }
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
