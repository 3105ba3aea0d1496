import Foundation
import Glibc
import Testing
import VaultSystem

/// A private directory (0700) under the temporary directory, removed at the end.
private final class Scratch {
    let path: String

    init() throws {
        path = NSTemporaryDirectory() + "vaultd-trust-\(UUID().uuidString.prefix(8))"
        guard mkdir(path, 0o700) == 0 else { throw CocoaError(.fileWriteUnknown, userInfo: ["path": path]) }
    }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// `PathTrust`: its decision for one component, and its walk of real paths.
@Suite("Path trust")
struct PathTrustTests {
    let trust = PathTrust(owners: [998], leafOwners: [1000])
    let directory = UInt32(S_IFDIR)
    let file = UInt32(S_IFREG)
    let link = UInt32(S_IFLNK)

    @Test("Should trust a directory above of root or vaultd's user, writable by others only when sticky")
    func above() {
        #expect(trust.problem(.above, owner: 0, mode: directory | 0o755) == nil)
        #expect(trust.problem(.above, owner: 998, mode: directory | 0o700) == nil)
        #expect(trust.problem(.above, owner: 0, mode: directory | 0o1777) == nil, "like /tmp")
        let other = trust.problem(.above, owner: 1000, mode: directory | 0o755)
        #expect(other?.hasPrefix("belongs to uid 1000") == true, "the file's owner owns only the last: \(other ?? "")")
        #expect(other?.contains("only root or uid 998 may own it") == true, "\(other ?? "")")
        #expect(trust.problem(.above, owner: 0, mode: directory | 0o777)?.contains("without the sticky bit") == true)
        #expect(trust.problem(.above, owner: 0, mode: directory | 0o775)?.contains("writable by its group") == true)
        #expect(trust.problem(.above, owner: 0, mode: file | 0o644) == "is not a directory")
    }

    @Test("Should refuse a last directory anyone else can write, sticky bit or not")
    func leafDirectory() {
        #expect(trust.problem(.leafDirectory, owner: 0, mode: directory | 0o755) == nil)
        #expect(trust.problem(.leafDirectory, owner: 1000, mode: directory | 0o700) == nil, "the file's owner's")
        for mode: UInt32 in [0o1777, 0o777, 0o1770, 0o730] {
            let problem = trust.problem(.leafDirectory, owner: 0, mode: directory | mode)
            #expect(problem?.contains("who could put files of their own in it") == true, "\(String(mode, radix: 8))")
        }
        #expect(
            trust.problem(.leafDirectory, owner: 4242, mode: directory | 0o700)?.hasPrefix("belongs to uid 4242")
                == true)
    }

    @Test("Should refuse a last file of another user or writable by others")
    func leafFile() {
        #expect(trust.problem(.leafFile, owner: 0, mode: file | 0o644) == nil)
        #expect(
            trust.problem(.leafFile, owner: 0, mode: file | 0o666)
                == "is writable by others (mode 666), who could change it")
        #expect(trust.problem(.leafFile, owner: 0, mode: file | 0o664)?.contains("its group") == true)
        #expect(trust.problem(.leafFile, owner: 4242, mode: file | 0o600)?.hasPrefix("belongs to uid 4242") == true)
    }

    @Test("Should follow a symlink of root or vaultd's user only, whatever its mode")
    func symlink() {
        #expect(trust.problem(.symlink, owner: 0, mode: link | 0o777) == nil)
        #expect(trust.problem(.symlink, owner: 998, mode: link | 0o777) == nil)
        let other = trust.problem(.symlink, owner: 1000, mode: link | 0o777)
        #expect(other?.hasPrefix("is a symlink of uid 1000, who could point it elsewhere") == true, "\(other ?? "")")
    }

    @Test(
        "Should walk a real path as given: trusted symlinks followed, another user's refused, a missing part reported",
        .enabled(if: geteuid() == 0, "needs root to give a symlink away"))
    func walk() throws {
        let scratch = try Scratch()
        let real = scratch.path + "/real"
        #expect(mkdir(real, 0o700) == 0)
        try "x".write(toFile: real + "/f", atomically: false, encoding: .utf8)
        #expect(Glibc.symlink(real, scratch.path + "/mine") == 0)
        #expect(Glibc.symlink("real", scratch.path + "/theirs") == 0)
        #expect(lchown(scratch.path + "/theirs", 65534, 65534) == 0)
        let vaultd = PathTrust(owners: [])

        guard case .opened(let fd) = try vaultd.open(scratch.path + "/mine/f", leaf: .file) else {
            Issue.record("root's symlink is followed")
            return
        }
        close(fd)
        let refused = try vaultd.open(scratch.path + "/theirs/f", leaf: .file)
        #expect(
            refused
                == .refused(
                    "\(scratch.path)/theirs is a symlink of uid 65534, who could point it elsewhere (only root may own it)"
                ))
        #expect(try vaultd.open(scratch.path + "/mine/none", leaf: .file) == .missing)
        // Relative to the working directory, through `..`.
        let cwd = FileManager.default.currentDirectoryPath
        defer { FileManager.default.changeCurrentDirectoryPath(cwd) }
        #expect(FileManager.default.changeCurrentDirectoryPath(real))
        guard case .opened(let relative) = try vaultd.open("../mine/./f", leaf: .file) else {
            Issue.record("a relative path is walked from the working directory")
            return
        }
        close(relative)

        #expect(chmod(real, 0o1777) == 0)
        guard case .refused(let sticky) = try vaultd.open(real, leaf: .directory) else {
            Issue.record("a sticky world-writable last directory is refused")
            return
        }
        #expect(sticky.hasPrefix("\(real) is writable by others (mode 1777)"), "\(sticky)")
        guard case .opened(let below) = try vaultd.open(real + "/f", leaf: .file) else {
            Issue.record("a root file below a sticky directory is trusted")
            return
        }
        close(below)
    }
}
