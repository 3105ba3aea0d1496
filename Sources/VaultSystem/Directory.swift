import CShim
import Glibc

/// A directory opened once, in which files are written atomically and
/// removed by name: every call is relative to the open descriptor
/// (`openat`, `renameat`, `unlinkat`), so a path swapped after the checks
/// cannot redirect a write elsewhere. Closed when released.
public final class Directory {
    /// The descriptor, open for reading (fsync needs that, O_PATH is not enough).
    public let fd: Int32
    /// The path it was opened by, for messages.
    public let path: String

    /// The `f_type` of tmpfs (`statfs(2)`, `TMPFS_MAGIC`).
    public static let tmpfsMagic = 0x0102_1994
    /// The `f_type` of ramfs (`RAMFS_MAGIC`).
    public static let ramfsMagic = 0x8584_58f6

    /// Opens the directory `path`; an error when it is missing or not a directory.
    public init(_ path: String) throws(SystemError) {
        let fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw SystemError("open \(path)") }
        self.fd = fd
        self.path = path
    }

    /// Takes over `fd`, a directory open for reading (as `PathTrust.open`
    /// gives one), opened by `path`.
    public init(descriptor fd: Int32, path: String) {
        self.fd = fd
        self.path = path
    }

    deinit { close(fd) }

    /// The directory's own status (owner, mode), from the open descriptor.
    public func status() throws(SystemError) -> stat {
        var st = stat()
        guard fstat(fd, &st) == 0 else { throw SystemError("fstat \(path)") }
        return st
    }

    /// The `f_type` of the file system the directory is on.
    public func fileSystemType() throws(SystemError) -> Int {
        var type = 0
        while vaultd_fstatfs_type(fd, &type) != 0 {
            if errno != EINTR { throw SystemError("fstatfs \(path)") }
        }
        return type
    }

    /// True when the directory is on a file system kept in memory only (tmpfs, ramfs).
    public func isInMemory() throws(SystemError) -> Bool {
        let type = try fileSystemType()
        return type == Directory.tmpfsMagic || type == Directory.ramfsMagic
    }

    /// Replaces (or creates) the file `name` with `bytes`, atomically: a
    /// reader sees the old content or the new, whole, never a part. The
    /// bytes go to a new temporary file in this directory, created with
    /// O_CREAT|O_EXCL|O_NOFOLLOW (nothing planted under its name is
    /// followed or reused) and `mode` (set again with fchmod, past the
    /// umask), given to `owner` when one is named, written, fsynced, renamed
    /// over `name`, and the directory fsynced. On failure the temporary file
    /// is removed and `name` is left as it was.
    public func writeAtomically(
        _ name: String, mode: mode_t, owner: (uid: uid_t, gid: gid_t)? = nil, bytes: UnsafeBufferPointer<UInt8>
    ) throws(SystemError) {
        var temporary = ""
        var fd: Int32 = -1
        for _ in 0..<8 {
            temporary = ".vaultd-" + String(UInt64.random(in: 0...UInt64.max), radix: 16) + ".tmp"
            fd = openat(self.fd, temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
            if fd >= 0 || errno != EEXIST { break }
        }
        guard fd >= 0 else { throw SystemError("create a temporary file in \(path)") }
        var isOpen = true
        defer {
            if isOpen { close(fd) }
        }
        do throws(SystemError) {
            guard fchmod(fd, mode) == 0 else { throw SystemError("fchmod \(path)/\(temporary)") }
            if let owner, fchown(fd, owner.uid, owner.gid) != 0 {
                throw SystemError("fchown \(path)/\(temporary) to uid \(owner.uid)")
            }
            var offset = 0
            while offset < bytes.count {
                let n = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
                if n < 0 {
                    if errno == EINTR { continue }
                    throw SystemError("write \(path)/\(temporary)")
                }
                offset += n
            }
            guard fsync(fd) == 0 else { throw SystemError("fsync \(path)/\(temporary)") }
            isOpen = false
            // close() reports a failed write-back on some file systems.
            guard close(fd) == 0 else { throw SystemError("close \(path)/\(temporary)") }
            guard renameat(self.fd, temporary, self.fd, name) == 0 else {
                throw SystemError("rename \(path)/\(temporary) to \(path)/\(name)")
            }
        } catch {
            unlinkat(self.fd, temporary, 0)
            throw error
        }
        try sync()
    }

    /// Removes the file `name`; false when there was none.
    @discardableResult
    public func remove(_ name: String) throws(SystemError) -> Bool {
        guard unlinkat(fd, name, 0) == 0 else {
            if errno == ENOENT { return false }
            throw SystemError("unlink \(path)/\(name)")
        }
        try sync()
        return true
    }

    /// Flushes the directory's entries (a rename or an unlink) to its file system.
    public func sync() throws(SystemError) {
        while fsync(fd) != 0 {
            if errno != EINTR { throw SystemError("fsync \(path)") }
        }
    }
}
