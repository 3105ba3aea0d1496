import Glibc
import VaultCore
import VaultSystem

/// Creates vaultd's listening socket: the directory 0700 when vaultd makes it
/// (0755 when the socket is meant for every user), the socket 0600 unless
/// configured otherwise, a stale socket file replaced, a live daemon left alone.
public enum Listener {
    /// Binds and listens on `path`; errors say what to do.
    public static func bind(_ path: String, mode: UInt32 = 0o600) throws(VaultError) -> Int32 {
        let directory = parentDirectory(of: path)
        if !Files.exists(directory) {
            guard mkdir(directory, mode & 0o066 == 0 ? 0o700 : 0o755) == 0 || errno == EEXIST else {
                throw VaultError(
                    .internalError,
                    "cannot create the socket directory \(directory): \(SystemError("mkdir").description); create it or pass --socket PATH"
                )
            }
        }
        var st = stat()
        if lstat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFSOCK else {
                throw VaultError(
                    .internalError, "\(path) exists and is not a socket; remove it or pass another --socket PATH")
            }
            if let fd = try? UnixSocket.connect(to: path) {
                close(fd)
                throw VaultError(
                    .internalError,
                    "another vaultd is already listening on \(path); stop it first or pass another --socket PATH")
            }
            unlink(path)  // stale: nobody answers on it
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw VaultError(.internalError, "socket: \(SystemError("socket"))") }
        let previousMask = umask(0o177)
        defer { umask(previousMask) }
        do throws(SystemError) {
            try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
                guard Glibc.bind(fd, address, length) == 0 else { throw SystemError("bind \(path)") }
            }
            guard chmod(path, mode_t(mode)) == 0 else { throw SystemError("chmod \(path)") }
            guard listen(fd, 512) == 0 else { throw SystemError("listen \(path)") }
        } catch {
            close(fd)
            throw VaultError(
                .internalError, "cannot listen on \(path): \(error.description); pass another --socket PATH")
        }
        return fd
    }

    static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let parent = String(path[..<slash])
        return parent.isEmpty ? "/" : parent
    }
}
