import Glibc
import VaultCore
import VaultSystem

/// The exclusive lock on a session database: `flock` on the file
/// `DATABASE.lock` beside it, held for as long as this value lives. vaultd
/// takes it when it opens its SQLite store, and so do `vaultd --rotate-key`
/// and `vaultd --migrate-store`, so that two of them never work on one
/// database at once: the second one refuses at once, naming the lock.
///
/// Why a lock file of its own and not SQLite's locking: SQLite locks per
/// transaction (a second vaultd would open the database happily and the two
/// would overwrite each other's rows), and `locking_mode=EXCLUSIVE` would also
/// shut out a read-only `sqlite3` looking at the file. A `flock` goes with
/// the open file description: the kernel releases it when the process dies,
/// however it dies (SIGKILL included), so no stale lock is ever left to
/// clean up; the file itself stays, empty, and is reused by the next holder.
public final class DatabaseLock: Sendable {
    /// The lock file.
    public let path: String
    private let fd: Int32

    private init(path: String, fd: Int32) {
        self.path = path
        self.fd = fd
    }

    deinit { close(fd) }

    /// The lock file of the database at `databasePath`.
    public static func lockPath(for databasePath: String) -> String { databasePath + ".lock" }

    /// Takes the lock of the database at `databasePath` (creating the lock
    /// file, mode 0600, when missing), without waiting: when another process
    /// holds it, the error says so and what to do.
    public static func acquire(for databasePath: String) throws(VaultError) -> DatabaseLock {
        let path = lockPath(for: databasePath)
        let fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw VaultError(
                .storeFailed, "cannot open the lock file \(path) of the session database: \(SystemError("open"))")
        }
        while flock(fd, LOCK_EX | LOCK_NB) != 0 {
            if errno == EINTR { continue }
            let failure = errno == EWOULDBLOCK ? nil : SystemError("flock")
            close(fd)
            if let failure {
                throw VaultError(.storeFailed, "cannot lock the session database \(databasePath): \(failure)")
            }
            throw VaultError(
                .storeFailed,
                "the session database \(databasePath) is in use: another vaultd, or a vaultd --rotate-key or --migrate-store, holds its lock \(path); stop it first (systemctl stop vaultd, or systemctl --user stop vaultd)"
            )
        }
        return DatabaseLock(path: path, fd: fd)
    }
}
