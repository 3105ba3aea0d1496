import Foundation
import Glibc
import Testing
import VaultCore
import VaultDaemon
import VaultSystem

/// A directory made for one test under `parent`, removed at the end.
private final class ScratchDirectory {
    let path: String

    init(under parent: String, mode: mode_t = 0o700) throws {
        path = parent + "/vaultd-tokenfile-\(UUID().uuidString.prefix(8))"
        guard mkdir(path, mode) == 0, chmod(path, mode) == 0 else {
            throw CocoaError(.fileWriteUnknown, userInfo: ["path": path])
        }
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// True when `path` is on tmpfs or ramfs.
private func inMemory(_ path: String) -> Bool {
    (try? Directory(path).isInMemory()) ?? false
}

/// A directory on a memory file system: `$XDG_RUNTIME_DIR` or `/dev/shm`, if either is one.
private let memoryParent: String? = {
    let candidates = [ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], "/dev/shm"].compactMap { $0 }
    return candidates.first { !$0.isEmpty && inMemory($0) && access($0, W_OK) == 0 }
}()

/// A directory on a disk file system: the temporary directory, if it is one.
private let diskParent: String? = {
    let candidates = [NSTemporaryDirectory(), "/var/tmp"].map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 }
    return candidates.first { !inMemory($0) && access($0, W_OK) == 0 }
}()

/// A configuration whose `[Account demo alice]` holds `lines`.
private func config(_ lines: String...) throws -> VaultConfig {
    try ConfigParser.parse(
        (["[Provider demo]", "Type=static", "[Account demo alice]"] + lines).joined(separator: "\n"),
        file: "/etc/vaultd/vaultd.conf")
}

/// The message `TokenFiles.check` refuses `config` with, for a vaultd running as `uid`.
private func refusal(_ config: VaultConfig, uid: UInt32 = getuid()) throws -> String {
    let error = try #require(throws: VaultError.self) { try TokenFiles.check(config, vaultdUID: uid) }
    #expect(error.code == .invalidConfig)
    return error.message
}

private let alice = Account(provider: "demo", user: "alice")

/// `TokenFiles.check`, the configuration check of token files, on this
/// host's real file systems: memory or disk, directory modes and owners.
@Suite("Token file checks", .timeLimit(.minutes(5)), .serialized)
struct TokenFileCheckTests {
    @Test(
        "Should accept a file on a memory file system, owned by vaultd's user",
        .enabled(if: memoryParent != nil, "no tmpfs at $XDG_RUNTIME_DIR or /dev/shm"))
    func memoryOrDisk() throws {
        let memory = try ScratchDirectory(under: memoryParent!)
        let plans = try TokenFiles.check(try config("TokenFile=\(memory.path)/alice.token"))
        #expect(plans[alice]?.settings.path == "\(memory.path)/alice.token")
        #expect(plans[alice]?.fileOwner == nil)
    }

    @Test(
        "Should refuse a directory on a disk file system unless TokenFileOnDisk=yes",
        .enabled(if: diskParent != nil, "no disk file system for temporary files"))
    func diskNeedsConsent() throws {
        let disk = try ScratchDirectory(under: diskParent!)
        let message = try refusal(try config("TokenFile=\(disk.path)/alice.token"))
        #expect(message.hasPrefix("/etc/vaultd/vaultd.conf:4: key 'TokenFile': \(disk.path) is on a disk file system"))
        #expect(message.contains("TokenFileOnDisk=yes") && message.contains("/run"), "\(message)")
        let plans = try TokenFiles.check(try config("TokenFile=\(disk.path)/alice.token", "TokenFileOnDisk=yes"))
        #expect(plans[alice] != nil)
    }

    @Test("Should refuse a missing directory and a path that is a directory")
    func missingOrDirectory() throws {
        let parent = try ScratchDirectory(under: memoryParent ?? diskParent!)
        let message = try refusal(try config("TokenFile=\(parent.path)/none/alice.token", "TokenFileOnDisk=yes"))
        #expect(message.contains("cannot open the directory \(parent.path)/none"), "\(message)")
        #expect(message.contains("create it"), "\(message)")
        #expect(mkdir(parent.path + "/sub", 0o700) == 0)
        let directory = try refusal(try config("TokenFile=\(parent.path)/sub", "TokenFileOnDisk=yes"))
        #expect(directory.contains("\(parent.path)/sub is a directory"), "\(directory)")
    }

    @Test("Should refuse a directory writable by others or its group, sticky bit or not")
    func writableByOthers() throws {
        let parent = memoryParent ?? diskParent!
        // Sticky (like /dev/shm): another user could still create the file's name first.
        for mode: mode_t in [0o777, 0o770, 0o730, 0o1777, 0o1770] {
            let open = try ScratchDirectory(under: parent, mode: mode)
            let message = try refusal(try config("TokenFile=\(open.path)/alice.token", "TokenFileOnDisk=yes"))
            #expect(
                message.contains("\(open.path) is writable by")
                    && message.contains("the sticky bit does not stop that"),
                "\(String(mode, radix: 8)): \(message)")
            #expect(!message.contains("/dev/shm)"), "/dev/shm is no longer suggested: \(message)")
        }
        // A directory above the file's that others can write, without the sticky bit, is as bad.
        let above = try ScratchDirectory(under: parent, mode: 0o777)
        #expect(mkdir(above.path + "/private", 0o700) == 0)
        let message = try refusal(try config("TokenFile=\(above.path)/private/t", "TokenFileOnDisk=yes"))
        #expect(message.contains("\(above.path) is writable by others (mode 777) without the sticky bit"), "\(message)")
        // With the sticky bit, a directory above (like /tmp) cannot have root's directory renamed away.
        let sticky = try ScratchDirectory(under: parent, mode: 0o1777)
        #expect(mkdir(sticky.path + "/private", 0o700) == 0)
        #expect(
            try TokenFiles.check(try config("TokenFile=\(sticky.path)/private/t", "TokenFileOnDisk=yes"))[alice] != nil)
    }

    @Test(
        "Should refuse a path through another user's symlink, follow root's, accept the file owner's directory",
        .enabled(if: getuid() == 0, "needs root to give files away"))
    func symlinksAndTheFileOwner() throws {
        let parent = try ScratchDirectory(under: memoryParent ?? diskParent!)
        #expect(mkdir(parent.path + "/real", 0o700) == 0)
        #expect(Glibc.symlink(parent.path + "/real", parent.path + "/roots") == 0)
        #expect(Glibc.symlink("real", parent.path + "/theirs") == 0)
        #expect(lchown(parent.path + "/theirs", 65534, 65534) == 0)
        #expect(
            try TokenFiles.check(try config("TokenFile=\(parent.path)/roots/t", "TokenFileOnDisk=yes"))[alice] != nil)
        let message = try refusal(try config("TokenFile=\(parent.path)/theirs/t", "TokenFileOnDisk=yes"), uid: 0)
        #expect(
            message.contains("\(parent.path)/theirs is a symlink of uid 65534, who could point it elsewhere"),
            "\(message)")

        // The reader's own directory may hold the file given to it, not a directory above.
        let readers = parent.path + "/reader"
        #expect(mkdir(readers, 0o700) == 0 && chown(readers, 65534, 65534) == 0)
        let given = try TokenFiles.check(
            try config("TokenFile=\(readers)/t", "TokenFileOwner=65534", "TokenFileOnDisk=yes"), vaultdUID: 0)
        #expect(given[alice]?.fileOwner == 65534)
        #expect(mkdir(readers + "/sub", 0o700) == 0 && chown(readers + "/sub", 65534, 65534) == 0)
        let below = try refusal(
            try config("TokenFile=\(readers)/sub/t", "TokenFileOwner=65534", "TokenFileOnDisk=yes"), uid: 0)
        #expect(below.contains("\(readers) belongs to uid 65534"), "\(below)")
    }

    @Test(
        "Should refuse a directory of another user (root only: it makes one)",
        .enabled(if: getuid() == 0, "needs root to give a directory away"))
    func directoryOfAnotherUser() throws {
        let other = try ScratchDirectory(under: memoryParent ?? diskParent!)
        #expect(chown(other.path, 65534, 65534) == 0)
        let message = try refusal(try config("TokenFile=\(other.path)/t", "TokenFileOnDisk=yes"), uid: 0)
        #expect(message.contains("belongs to uid 65534"), "\(message)")
    }

    @Test("Should resolve TokenFileOwner= for root, and refuse another owner or an unknown user for anyone else")
    func owner() throws {
        let directory = try ScratchDirectory(under: memoryParent ?? diskParent!)
        #expect(chmod(directory.path, 0o755) == 0)
        let path = "TokenFile=\(directory.path)/t"
        let asRoot = try TokenFiles.check(try config(path, "TokenFileOwner=65534", "TokenFileOnDisk=yes"), vaultdUID: 0)
        #expect(asRoot[alice]?.fileOwner == 65534)
        let message = try refusal(
            try config(path, "TokenFileOwner=65534", "TokenFileOnDisk=yes"), uid: getuid() == 0 ? 4242 : getuid())
        #expect(message.hasPrefix("/etc/vaultd/vaultd.conf:5: key 'TokenFileOwner': vaultd runs as uid"), "\(message)")
        #expect(message.contains("cannot give a file to uid 65534"), "\(message)")
        let unknown = try refusal(try config(path, "TokenFileOwner=no-such-user-here", "TokenFileOnDisk=yes"))
        #expect(unknown.contains("no user 'no-such-user-here'"), "\(unknown)")
        // Naming vaultd's own user is no giving away.
        let own = try TokenFiles.check(
            try config(path, "TokenFileOwner=\(getuid())", "TokenFileOnDisk=yes"), vaultdUID: getuid())
        #expect(own[alice]?.fileOwner == nil)
    }
}
