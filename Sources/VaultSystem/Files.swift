import Glibc

/// Whole-file reads and the few file-system calls vaultd and vaultctl need.
public enum Files {
    /// Reads all of `path`, refusing more than `limit` bytes.
    public static func read(_ path: String, limit: Int = 1 << 20) throws(SystemError) -> [UInt8] {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw SystemError("open \(path)") }
        defer { close(fd) }
        return try readAll(fd, limit: limit, name: path)
    }

    /// Reads `fd` to its end, refusing more than `limit` bytes.
    public static func readAll(_ fd: Int32, limit: Int, name: String) throws(SystemError) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                throw SystemError("read \(name)")
            }
            if n == 0 { break }
            out.append(contentsOf: chunk[0..<n])
            if out.count > limit { throw SystemError("\(name) is larger than \(limit) bytes", errno: EFBIG) }
        }
        chunk.withUnsafeMutableBytes { raw in
            for i in raw.indices { raw[i] = 0 }
        }
        return out
    }

    /// True when `path` exists (any kind of file).
    public static func exists(_ path: String) -> Bool {
        var st = stat()
        return lstat(path, &st) == 0
    }

}

extension Files {
    /// The names in `directory` (without `.` and `..`), sorted bytewise; empty
    /// when the directory does not exist.
    public static func list(_ directory: String) throws(SystemError) -> [String] {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else {
            if errno == ENOENT || errno == ENOTDIR { return [] }
            throw SystemError("opendir \(directory)")
        }
        return try list(descriptor: fd, name: directory)
    }

    /// The names in the directory open on `fd` (which this takes over and
    /// closes), sorted bytewise; `name` is for messages.
    public static func list(descriptor fd: Int32, name directory: String) throws(SystemError) -> [String] {
        guard let dir = fdopendir(fd) else {
            let error = SystemError("opendir \(directory)")
            close(fd)
            throw error
        }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            // The name is read where it lies: copying `pointee.d_name` would
            // copy all 256 bytes of the declared array, past the end of a
            // short record, and fault when that record ends glibc's buffer
            // just before an unmapped page.
            let nameOffset = MemoryLayout<dirent>.offset(of: \dirent.d_name)!
            let name = String(
                cString: UnsafeRawPointer(entry).advanced(by: nameOffset).assumingMemoryBound(to: CChar.self))
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
    }
}
