import Glibc
import VaultCore

/// Whether an exec provider's helper program can be run: checked when the
/// configuration is read (start-up, `--check-config`, a SIGHUP reload), so a
/// missing or non-executable helper is a configuration error there, and
/// classified when starting it fails later (it was removed meanwhile), which
/// is `ERR_HELPER_UNAVAILABLE`, not a network error.
enum HelperProgram {
    /// What is wrong with running `path`, or nil when it looks runnable: it
    /// must exist, be a regular file and be executable by the user vaultd
    /// runs as; a script's `#!` interpreter must exist and be executable too.
    static func problem(_ path: String) -> String? {
        var st = stat()
        guard stat(path, &st) == 0 else { return "cannot be found (\(String(cString: strerror(errno))))" }
        guard st.st_mode & S_IFMT == S_IFREG else { return "is \(Daemon.fileKind(st.st_mode)), not a program" }
        guard access(path, X_OK) == 0 else {
            return "is not executable by uid \(getuid()) (\(String(cString: strerror(errno))))"
        }
        guard let interpreter = interpreter(of: path) else { return nil }
        guard stat(interpreter, &st) == 0, st.st_mode & S_IFMT == S_IFREG, access(interpreter, X_OK) == 0 else {
            return "names an interpreter on its #! line that cannot be run"
        }
        return nil
    }

    /// The interpreter a script names on its `#!` line, if it has one.
    static func interpreter(of path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buffer = [UInt8](repeating: 0, count: 256)
        let count = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard count > 2, buffer[0] == UInt8(ascii: "#"), buffer[1] == UInt8(ascii: "!") else { return nil }
        let line = buffer[2..<count].prefix { $0 != UInt8(ascii: "\n") }
        let word = line.drop { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
            .prefix { $0 != UInt8(ascii: " ") && $0 != UInt8(ascii: "\t") && $0 != UInt8(ascii: "\r") }
        guard let first = word.first, first == UInt8(ascii: "/") else { return nil }
        return String(decoding: word, as: UTF8.self)
    }

    /// Refuses a configuration with an exec provider whose helper cannot be
    /// run, naming the file, the line, the provider, the key and the fix.
    static func check(_ config: VaultConfig) throws(VaultError) {
        for name in config.providers.keys.sorted() {
            guard let exec = config.providers[name]?.exec, let program = exec.command.first,
                let problem = problem(program)
            else { continue }
            // The line is named, its value is not (configuration errors never quote one).
            let location = exec.commandLocation.map { "\($0): " } ?? ""
            throw VaultError(
                .invalidConfig,
                "\(location)[Provider \(name)] key 'Command': the helper program \(problem); install it (executable by the user vaultd runs as) or fix Command="
            )
        }
    }

    /// What starting a helper failed with, as a reason it is unavailable, or
    /// nil when the failure was something else (out of descriptors, memory).
    static func spawnProblem(_ errno: Int32) -> String? {
        switch errno {
        case ENOENT, EACCES, ENOEXEC, ENOTDIR, ELOOP, EPERM, ENAMETOOLONG, EISDIR:
            return String(cString: strerror(errno))
        default:
            return nil
        }
    }
}
