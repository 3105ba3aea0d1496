import Glibc
import VaultCore
import VaultSystem

/// Creates vaultd's listening socket: the directory 0700 when vaultd makes it
/// (0755 when the socket is meant for every user), the socket 0600 unless
/// configured otherwise, a stale socket file replaced, a live daemon left alone.
///
/// Whoever may write the socket's directory may rename vaultd's socket away and
/// bind one of their own in its place, then receive what clients send, tokens
/// included. So an existing directory must be a real directory (not a symlink)
/// owned by vaultd's user or root and writable by no one else, sticky bit or
/// not, reached through directories and symlinks only they could change; and
/// the socket gets its mode from the umask at bind, never from a chmod by path,
/// which would follow a symlink planted there. A socket systemd passes
/// (socket activation) is systemd's to place and is not checked here.
public enum Listener {
    /// Binds and listens on `path`; errors say what to do.
    public static func bind(_ path: String, mode: UInt32 = 0o600) throws(VaultError) -> Int32 {
        let directory = parentDirectory(of: path)
        try makeDirectory(directory, mode: mode & 0o066 == 0 ? 0o700 : 0o755)
        try checkDirectory(directory)
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
        do throws(SystemError) {
            try bindWithMode(fd, path, mode: mode)
            guard listen(fd, 512) == 0 else { throw SystemError("listen \(path)") }
        } catch {
            close(fd)
            throw VaultError(
                .internalError, "cannot listen on \(path): \(error.description); pass another --socket PATH")
        }
        return fd
    }

    /// Binds `fd` to `path` so that the socket file is created with exactly
    /// `mode`. Linux gives a new socket file the mode 0777 less the umask, and
    /// an fchmod of a socket descriptor changes the socket, not the file, so
    /// the umask is the one way to set the mode without naming the path again.
    /// The umask is the process's: it is set only for the bind.
    static func bindWithMode(_ fd: Int32, _ path: String, mode: UInt32) throws(SystemError) {
        let previousMask = umask(mode_t(~mode & 0o777))
        defer { umask(previousMask) }
        try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
            guard Glibc.bind(fd, address, length) == 0 else { throw SystemError("bind \(path)") }
        }
    }

    /// Creates the socket directory when it does not exist, inside its parent
    /// as opened by a `PathTrust` walk (`.parent`): never through a symlink
    /// or a directory another user could change, so vaultd makes no
    /// directory where someone else pointed it.
    static func makeDirectory(_ directory: String, mode: mode_t) throws(VaultError) {
        var st = stat()
        guard lstat(directory, &st) != 0, errno == ENOENT else { return }
        func fail(_ reason: String) -> VaultError {
            VaultError(
                .internalError,
                "cannot create the socket directory \(directory): \(reason); create it or pass --socket PATH")
        }
        let parent = parentDirectory(of: directory)
        let outcome: PathTrust.Outcome
        do { outcome = try PathTrust.vaultd.open(parent, leaf: .parent) } catch { throw fail(error.description) }
        switch outcome {
        case .missing: throw fail("\(parent) does not exist")
        case .refused(let problem):
            throw fail("\(problem), so another user could choose where it is made or replace it")
        case .opened(let fd):
            defer { close(fd) }
            let name = String(directory.split(separator: "/").last ?? "")
            if mkdirat(fd, name, mode) != 0 && errno != EEXIST { throw fail(SystemError("mkdir").description) }
        }
    }

    /// Refuses a socket directory that someone other than vaultd's user and
    /// root could change: a symlink itself (vaultd makes the directory and
    /// would have made a real one), or, walking the path as given component
    /// by component (`PathTrust.vaultd`), a directory not owned by root or
    /// vaultd's user, or writable by group or others (sticky bit or not),
    /// a directory above it that another user could change, or a symlink on
    /// the way that another user owns and could point elsewhere.
    static func checkDirectory(_ directory: String) throws(VaultError) {
        let owner = geteuid()
        func refuse(_ problem: String) -> VaultError {
            VaultError(
                .internalError,
                "the socket directory \(directory) is not safe: \(problem), so another user could replace vaultd's socket; use a directory owned by root or uid \(owner) that only its owner may write (chmod go-w), below directories only root or uid \(owner) can change, or pass another --socket PATH"
            )
        }
        var st = stat()
        if lstat(directory, &st) == 0, st.st_mode & S_IFMT == S_IFLNK { throw refuse("\(directory) is a symlink") }
        let outcome: PathTrust.Outcome
        do { outcome = try PathTrust.vaultd.open(directory, leaf: .directory) } catch {
            throw VaultError(
                .internalError,
                "cannot inspect the socket directory \(directory): \(error.description); create it or pass --socket PATH"
            )
        }
        switch outcome {
        case .opened(let fd): close(fd)
        case .missing:
            throw VaultError(
                .internalError,
                "cannot inspect the socket directory \(directory): it does not exist; create it or pass --socket PATH")
        case .refused(let problem): throw refuse(problem)
        }
    }

    static func parentDirectory(of path: String) -> String {
        guard let slash = path.lastIndex(of: "/") else { return "." }
        let parent = String(path[..<slash])
        return parent.isEmpty ? "/" : parent
    }
}
