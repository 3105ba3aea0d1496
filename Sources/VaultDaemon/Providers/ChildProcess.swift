import CShim
import Glibc
import VaultSystem

/// A program started with posix_spawn: no shell, its own environment, its
/// standard input, output and error on pipes (non-blocking on this side),
/// every signal at its default disposition and none blocked, whatever the
/// parent ignores or blocks, and in a process group of its own (its id is the
/// child's pid), so that `killGroup` reaches whatever the child started too.
struct ChildProcess: Sendable {
    /// The child's process id; reap it with `waitpid`.
    let pid: pid_t
    /// The write end of the child's standard input.
    let stdin: Int32
    /// The read end of the child's standard output.
    let stdout: Int32
    /// The read end of the child's standard error.
    let stderr: Int32

    /// Starts `argv[0]` (an absolute path) with `argv` and exactly `environment`.
    static func spawn(_ argv: [String], environment: [String: String]) throws(SystemError) -> ChildProcess {
        guard let path = argv.first else { throw SystemError("posix_spawn: no program", errno: EINVAL) }
        // stdin, stdout, stderr: the child's ends are closed here once it has
        // them; this side's ends are returned, or closed when starting failed.
        var pipes: [(read: Int32, write: Int32)] = []
        var started = false
        defer {
            for (index, pipe) in pipes.enumerated() {
                close(index == 0 ? pipe.read : pipe.write)
                if !started { close(index == 0 ? pipe.write : pipe.read) }
            }
        }
        for _ in 0..<3 {
            var fds: [Int32] = [-1, -1]
            guard vaultd_pipe_cloexec(&fds) == 0 else { throw SystemError("pipe2") }
            pipes.append((fds[0], fds[1]))
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, pipes[0].read, 0)
        posix_spawn_file_actions_adddup2(&actions, pipes[1].write, 1)
        posix_spawn_file_actions_adddup2(&actions, pipes[2].write, 2)
        // Nothing else of vaultd's: descriptors opened without O_CLOEXEC (libcurl's
        // sockets, for one) would otherwise reach the helper and its children.
        guard vaultd_spawn_close_from(&actions, 3) == 0 else {
            throw SystemError("posix_spawn_file_actions_addclosefrom_np", errno: ENOSYS)
        }

        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))

        let arguments = argv.map { strdup($0) } + [nil]
        let entries = environment.sorted { $0.key < $1.key }.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            for pointer in arguments { free(pointer) }
            for pointer in entries { free(pointer) }
        }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, path, &actions, &attributes, arguments, entries)
        guard status == 0 else { throw SystemError("posix_spawn \(path)", errno: status) }
        started = true
        for fd in [pipes[0].write, pipes[1].read, pipes[2].read] {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        return ChildProcess(pid: pid, stdin: pipes[0].write, stdout: pipes[1].read, stderr: pipes[2].read)
    }

    /// SIGKILLs the child's process group: the child, unless it was reaped,
    /// and every process it started that stayed in the group. Call it only
    /// while the child is not reaped yet (running, or a zombie seen through
    /// `hasExited`): until then no other process can get its pid as a group id.
    func killGroup() {
        kill(-pid, SIGKILL)
    }

    /// True when the child has exited (or was killed). The child is not
    /// reaped (`WNOWAIT`): it stays a zombie, holding its pid and group id,
    /// until `waitpid` takes its status.
    func hasExited() -> Bool {
        var info = siginfo_t()
        guard waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 else { return errno == ECHILD }
        return info._sifields._sigchld.si_pid == pid
    }

    /// The signal that ended the process, from `waitpid`'s status; nil when it exited.
    static func signal(fromWaitStatus status: Int32) -> Int32? {
        let signal = status & 0x7f
        return signal == 0 || signal == 0x7f ? nil : signal
    }

    /// The exit status `waitpid` reported, as a shell shows it: the exit code,
    /// or 128 plus the signal that ended the process.
    static func exitCode(fromWaitStatus status: Int32) -> Int32 {
        let signal = status & 0x7f
        return signal == 0 ? (status >> 8) & 0xff : 128 + signal
    }
}
