import Glibc

/// Whether a path can be trusted not to be changed by anyone but root and
/// vaultd's user: the one check behind the configuration files, the token
/// files' directories and the socket's directory.
///
/// The path is walked as given, component by component from `/` (or the
/// working directory), each opened with `O_NOFOLLOW` relative to the one
/// before, so what is checked is what is used:
///
/// - a directory above the last component must belong to one of `owners` and
///   be writable by its group or others only with the sticky bit (like
///   `/tmp`): nobody else can then rename or replace what lies below it;
/// - a symlink must belong to one of `owners` (it cannot be repointed by
///   anyone else then), and is followed;
/// - the last component, a directory or a file, must belong to one of
///   `owners` or `leafOwners` and be writable by no group or others, sticky
///   bit or not: in a sticky world-writable directory anyone can still put a
///   file of their own under a name not yet taken.
public struct PathTrust: Sendable, Equatable {
    /// Who may own a directory above the last component, or a symlink: root and vaultd's user.
    public var owners: Set<UInt32>
    /// Who else may own the last component (a token file's owner, for its directory).
    public var leafOwners: Set<UInt32>

    /// Trusts root, `owners` and, for the last component only, `leafOwners`.
    public init(owners: [UInt32], leafOwners: [UInt32] = []) {
        self.owners = Set(owners + [0])
        self.leafOwners = Set(leafOwners)
    }

    /// Root and the effective uid: vaultd's own paths.
    public static var vaultd: PathTrust { PathTrust(owners: [geteuid()]) }

    /// Where a component lies on the path.
    public enum Role: Sendable {
        /// A directory the walk goes through.
        case above
        /// A symlink the walk follows.
        case symlink
        /// The last component, which must be a directory.
        case leafDirectory
        /// The last component, a file.
        case leafFile
    }

    /// What the walk found at the end of the path.
    public enum Outcome: Sendable, Equatable {
        /// Every component is trusted; the last one is open (read-only, close-on-exec) on this descriptor.
        case opened(Int32)
        /// A component does not exist.
        case missing
        /// A component is not trusted: the component and why, for a message.
        case refused(String)
    }

    /// Why a component in `role`, with `owner` and `mode` (`st_mode`, type
    /// bits included), lets someone else change what the path leads to; nil
    /// when nothing does. Pure: the walk's decision, tested on its own.
    public func problem(_ role: Role, owner: UInt32, mode: UInt32) -> String? {
        let type = mode & UInt32(S_IFMT)
        let permissions = String(mode & 0o7777, radix: 8)
        let leaf = role == .leafDirectory || role == .leafFile
        let allowed = leaf ? owners.union(leafOwners) : owners
        switch role {
        case .symlink:
            guard allowed.contains(owner) else {
                return "is a symlink of uid \(owner), who could point it elsewhere (\(ownersText(allowed)))"
            }
            return nil
        case .above, .leafDirectory:
            if type != UInt32(S_IFDIR) { return "is not a directory" }
        case .leafFile:
            break
        }
        if !allowed.contains(owner) {
            return
                "belongs to uid \(owner), who could \(leaf ? "change" : "replace") \(role == .above ? "what is below it" : "it") (\(ownersText(allowed)))"
        }
        guard mode & 0o022 != 0 else { return nil }
        let who = mode & 0o002 != 0 ? "others" : "its group"
        switch role {
        case .above where mode & UInt32(S_ISVTX) != 0:
            return nil
        case .above:
            return
                "is writable by \(who) (mode \(permissions)) without the sticky bit, so they could replace what is below it"
        case .leafDirectory:
            return
                "is writable by \(who) (mode \(permissions)), who could put files of their own in it (the sticky bit does not stop that)"
        default:
            return "is writable by \(who) (mode \(permissions)), who could change it"
        }
    }

    /// "only root or uid 998 may own it", for a message.
    private func ownersText(_ allowed: Set<UInt32>) -> String {
        let names = allowed.sorted().map { $0 == 0 ? "root" : "uid \($0)" }
        let list = names.count == 1 ? names[0] : names.dropLast().joined(separator: ", ") + " or " + names.last!
        return "only \(list) may own it"
    }

    /// What the last component of a path must be.
    public enum Leaf: Sendable {
        /// A directory files go in: writable by no one else.
        case directory
        /// A file.
        case file
        /// A directory the caller makes a new entry in with `mkdirat`: checked
        /// like a directory above (sticky and world-writable, like /tmp, is fine).
        case parent
    }

    /// Walks `path` as given (relative to the working directory unless
    /// absolute), checking every component as `problem` says, following
    /// trusted symlinks (at most 40), and opens the last one. A file is
    /// opened with `O_NONBLOCK | O_NOCTTY`, so a FIFO or a terminal never
    /// blocks the caller, which checks its kind. Other failures (a
    /// directory vaultd may not search, a file where a directory must be)
    /// are thrown.
    public func open(_ path: String, leaf: Leaf) throws(SystemError) -> Outcome {
        var walk = try Walk(path: path)
        defer { walk.closeAll() }
        if let problem = problem(.above, owner: walk.status.st_uid, mode: walk.status.st_mode) {
            return .refused("/ \(problem)")
        }
        var pending = Walk.components(path).reversed() as [Substring]
        var links = 0
        while let name = pending.popLast() {
            if name.isEmpty || name == "." { continue }
            if name == ".." {
                walk.up()
                continue
            }
            let shown = walk.shown(name)
            let isLast = pending.allSatisfy { $0.isEmpty || $0 == "." }
            var st = stat()
            guard fstatat(walk.fd, String(name), &st, AT_SYMLINK_NOFOLLOW) == 0 else {
                if errno == ENOENT { return .missing }
                throw SystemError("lstat \(shown)")
            }
            if st.st_mode & S_IFMT == S_IFLNK {
                if let problem = problem(.symlink, owner: st.st_uid, mode: st.st_mode) {
                    return .refused("\(shown) \(problem)")
                }
                links += 1
                guard links <= 40 else { throw SystemError("resolve \(path)", errno: ELOOP) }
                let target = try Walk.readLink(walk.fd, String(name), shown: shown)
                if target.hasPrefix("/") { try walk.restartAtRoot() }
                pending += Walk.components(target).reversed()
                continue
            }
            if isLast && leaf == .file {
                let fd = openat(walk.fd, String(name), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
                guard fd >= 0 else { throw SystemError("open \(shown)") }
                guard fstat(fd, &st) == 0 else {
                    close(fd)
                    throw SystemError("fstat \(shown)")
                }
                if let problem = problem(.leafFile, owner: st.st_uid, mode: st.st_mode) {
                    close(fd)
                    return .refused("\(shown) \(problem)")
                }
                return .opened(fd)
            }
            guard st.st_mode & S_IFMT == S_IFDIR else { throw SystemError("open \(shown)", errno: ENOTDIR) }
            try walk.enter(name, shown: shown)
            if !isLast, let problem = problem(.above, owner: walk.status.st_uid, mode: walk.status.st_mode) {
                return .refused("\(shown) \(problem)")
            }
        }
        if leaf == .file { throw SystemError("open \(walk.shown(""))", errno: EISDIR) }
        let role: Role = leaf == .parent ? .above : .leafDirectory
        if let problem = problem(role, owner: walk.status.st_uid, mode: walk.status.st_mode) {
            return .refused("\(walk.shown("")) \(problem)")
        }
        let fd = openat(walk.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw SystemError("open \(walk.shown(""))") }
        return .opened(fd)
    }
}

/// The directories a `PathTrust` walk is in: a stack of `O_PATH`
/// descriptors from `/`, with the names that led to them.
private struct Walk {
    /// `O_PATH` (010000000 on every Linux architecture vaultd builds for),
    /// which Swift's Glibc module leaves out: it needs `_GNU_SOURCE`.
    static let pathOnly: Int32 = 0o10_000_000

    private var fds: [Int32] = []
    private var names: [String] = []
    /// The status of the directory the walk is in, from its descriptor.
    private(set) var status = stat()

    var fd: Int32 { fds.last! }

    /// Starts at `/`, or at the working directory's path for a relative `path`.
    init(path: String) throws(SystemError) {
        try restartAtRoot()
        if !path.hasPrefix("/") {
            guard let cwd = getcwd(nil, 0) else { throw SystemError("getcwd") }
            let base = String(cString: cwd)
            free(cwd)
            do throws(SystemError) {
                for name in Walk.components(base) { try enter(name, shown: shown(name)) }
            } catch {
                closeAll()
                throw error
            }
        }
    }

    /// The non-empty components of `path`.
    static func components(_ path: String) -> [Substring] {
        path.split(separator: "/", omittingEmptySubsequences: true)
    }

    /// The path of `name` in the directory the walk is in, for messages.
    func shown(_ name: Substring) -> String {
        let parent = "/" + names.joined(separator: "/")
        if name.isEmpty { return parent }
        return parent.hasSuffix("/") ? parent + name : parent + "/" + name
    }

    mutating func restartAtRoot() throws(SystemError) {
        closeAll()
        let root = Glibc.open("/", Walk.pathOnly | O_DIRECTORY | O_CLOEXEC)
        guard root >= 0 else { throw SystemError("open /") }
        fds = [root]
        names = []
        guard fstat(root, &status) == 0 else { throw SystemError("fstat /") }
    }

    /// Goes into the directory `name` (never through a symlink).
    mutating func enter(_ name: Substring, shown: String) throws(SystemError) {
        let next = openat(fd, String(name), Walk.pathOnly | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
        guard next >= 0 else { throw SystemError("open \(shown)") }
        fds.append(next)
        names.append(String(name))
        guard fstat(next, &status) == 0 else { throw SystemError("fstat \(shown)") }
    }

    /// Goes back to the directory above (`..`); stays at `/`.
    mutating func up() {
        guard fds.count > 1 else { return }
        close(fds.removeLast())
        names.removeLast()
        fstat(fd, &status)
    }

    func closeAll() {
        for fd in fds { close(fd) }
    }

    /// The target of the symlink `name` in `directory`.
    static func readLink(_ directory: Int32, _ name: String, shown: String) throws(SystemError) -> String {
        var buffer = [CChar](repeating: 0, count: Int(PATH_MAX) + 1)
        let count = readlinkat(directory, name, &buffer, buffer.count - 1)
        guard count >= 0 else { throw SystemError("readlink \(shown)") }
        return String(decoding: buffer[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}
