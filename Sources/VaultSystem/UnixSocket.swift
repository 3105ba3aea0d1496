import Glibc

/// An errno value from a failed system call, with the call's name.
public struct SystemError: Error, Equatable, CustomStringConvertible, Sendable {
    /// The errno value.
    public var errno: Int32
    /// Which call failed.
    public var call: String

    /// Captures the current `errno` for `call`.
    public init(_ call: String, errno: Int32 = Glibc.errno) {
        self.call = call
        self.errno = errno
    }

    public var description: String { "\(call): \(String(cString: strerror(errno)))" }
}

/// Typed helpers around the socket calls vaultd and vaultctl make. EINTR is
/// retried here, once, for everyone.
public enum UnixSocket {
    /// The longest path a Unix socket address holds.
    public static let maximumPathLength = 107

    /// Calls `body` with a `sockaddr_un` for `path`.
    public static func withAddress<T>(
        _ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) throws(SystemError) -> T
    ) throws(SystemError) -> T {
        var address = sockaddr_un()
        address.sun_family = sa_family_t(AF_UNIX)
        let bytes = Array(path.utf8)
        guard bytes.count <= maximumPathLength, !bytes.contains(0) else {
            throw SystemError("socket path '\(path)' is too long or invalid", errno: ENAMETOOLONG)
        }
        withUnsafeMutableBytes(of: &address.sun_path) { raw in
            raw.copyBytes(from: bytes)
            raw[bytes.count] = 0
        }
        return try withUnsafePointer(to: &address) { (pointer) throws(SystemError) -> T in
            try pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { (p) throws(SystemError) -> T in
                try body(p, socklen_t(MemoryLayout<sockaddr_un>.size))
            }
        }
    }

    /// Opens a blocking stream socket connected to `path`.
    public static func connect(to path: String) throws(SystemError) -> Int32 {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw SystemError("socket") }
        do {
            try withAddress(path) { (address, length) throws(SystemError) in
                while Glibc.connect(fd, address, length) != 0 {
                    if errno == EINTR { continue }
                    throw SystemError("connect")
                }
            }
        } catch {
            close(fd)
            throw error
        }
        return fd
    }

    /// The uid of the process on the other end of a connected Unix socket
    /// (`SO_PEERCRED`, as it was when the peer called `listen` or `connect`).
    public static func peerUID(_ fd: Int32) throws(SystemError) -> uid_t {
        // struct ucred: pid_t pid, uid_t uid, gid_t gid.
        var credentials: (pid: Int32, uid: UInt32, gid: UInt32) = (0, 0, 0)
        var length = socklen_t(MemoryLayout.size(ofValue: credentials))
        guard getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &length) == 0 else {
            throw SystemError("getsockopt SO_PEERCRED")
        }
        guard Int(length) == MemoryLayout.size(ofValue: credentials) else {
            throw SystemError("getsockopt SO_PEERCRED", errno: EPROTO)
        }
        return credentials.uid
    }

    /// Writes all of `bytes`, retrying on EINTR and short writes. Never raises SIGPIPE.
    public static func sendAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) throws(SystemError) {
        var offset = 0
        while offset < bytes.count {
            let n = send(fd, bytes.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            if n < 0 {
                if errno == EINTR { continue }
                throw SystemError("send")
            }
            offset += n
        }
    }

    /// Reads up to `buffer.count` bytes; 0 means end of stream.
    public static func receive(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(SystemError) -> Int {
        while true {
            let n = recv(fd, buffer.baseAddress, buffer.count, 0)
            if n >= 0 { return n }
            if errno == EINTR { continue }
            throw SystemError("recv")
        }
    }
}
