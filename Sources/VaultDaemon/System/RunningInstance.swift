import Glibc
import VaultCore
import VaultSystem

/// Finds a vaultd process serving a socket, without connecting to it (a
/// connection to a socket-activated vaultd.socket would start the very
/// vaultd a migration must not run beside).
///
/// The kernel lists every listening Unix socket with its path and inode
/// (`/proc/net/unix`); a process holding it has a descriptor reading
/// `socket:[INODE]` under `/proc/PID/fd`. The service manager holds the
/// socket of vaultd.socket too, so only a process named `vaultd` counts.
/// Processes of other users cannot be looked into (their `fd` directory is
/// closed to us): for them this finds nothing, and the database lock is the
/// only guard. A vaultd on the Secret Service engine holds no database lock,
/// so this is how `--migrate-store` notices one.
enum RunningInstance {
    /// The pid of a vaultd (not this process) that listens on `socketPath`, if one is found.
    static func vaultd(serving socketPath: String) -> Int32? {
        let inodes = listeningInodes(socketPath)
        guard !inodes.isEmpty else { return nil }
        let wanted = Set(inodes.map { "socket:[\($0)]" })
        let own = getpid()
        guard let entries = try? Files.list("/proc") else { return nil }
        for entry in entries {
            guard let pid = Int32(entry), pid != own, command(of: pid) == "vaultd" else { continue }
            guard let descriptors = try? Files.list("/proc/\(entry)/fd") else { continue }
            for descriptor in descriptors where wanted.contains(link("/proc/\(entry)/fd/\(descriptor)") ?? "") {
                return pid
            }
        }
        return nil
    }

    /// The inodes of the listening sockets bound to `path` (`/proc/net/unix`:
    /// `Num RefCount Protocol Flags Type St Inode Path`, flag 0x10000 = listening).
    static func listeningInodes(_ path: String) -> [String] {
        guard let bytes = try? Files.read("/proc/net/unix", limit: 64 << 20) else { return [] }
        var inodes: [String] = []
        for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ", maxSplits: 7, omittingEmptySubsequences: true)
            guard fields.count == 8, fields[7] == path, let flags = UInt32(fields[3], radix: 16),
                flags & 0x10000 != 0
            else { continue }
            inodes.append(String(fields[6]))
        }
        return inodes
    }

    private static func command(of pid: Int32) -> String? {
        guard let bytes = try? Files.read("/proc/\(pid)/comm", limit: 64) else { return nil }
        return String(decoding: bytes, as: UTF8.self).trimmingSuffix("\n")
    }

    private static func link(_ path: String) -> String? {
        var buffer = [CChar](repeating: 0, count: 64)
        let count = readlink(path, &buffer, buffer.count - 1)
        guard count > 0 else { return nil }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// Refuses when a vaultd serves `socketPath`: a migration beside a
    /// running vaultd would lose what it writes meanwhile.
    static func refuseIfServed(_ socketPath: String) throws(VaultError) {
        guard let pid = vaultd(serving: socketPath) else { return }
        throw VaultError(
            .storeFailed,
            "vaultd (pid \(pid)) serves \(socketPath) and would keep writing to the store during the migration; stop it first (systemctl --user stop vaultd.service vaultd.socket, or systemctl stop for the system instance)"
        )
    }
}

extension String {
    fileprivate func trimmingSuffix(_ suffix: String) -> String {
        hasSuffix(suffix) ? String(dropLast(suffix.count)) : self
    }
}
