import CShim
import Dispatch
import Glibc
import Synchronization

/// Keeps SIGTERM and SIGINT working while vaultd starts. They are blocked in
/// every thread from the first moment (the serving loop reads them from a
/// signalfd), so until that loop runs a start-up step that blocks (a secret
/// store that does not answer, a slow name service) would leave vaultd deaf to
/// them. A watcher thread reads the signalfd meanwhile: SIGTERM or SIGINT ends
/// vaultd at once, with a log line; a SIGHUP is kept and raised again when the
/// serving loop takes over. `handOff()` ends the watch before the socket is
/// bound, so the watcher never leaves a socket file behind.
final class StartupSignals: Sendable {
    private enum Phase {
        case starting
        case handedOff
        case exiting
    }

    private struct State {
        var phase = Phase.starting
        /// A SIGHUP came during start-up: raised again at the hand-off.
        var hangup = false
    }

    private let signalFD: Int32
    private let wakeFD: Int32
    private let state = Mutex(State())

    /// Starts watching `signalFD` (SIGTERM, SIGINT, SIGHUP) on a thread of its own.
    init(signalFD: Int32, log: Logger) {
        self.signalFD = signalFD
        wakeFD = vaultd_eventfd()
        DispatchQueue(label: "io.vaultd.startup-signals").async { [self] in watch(log) }
    }

    /// The serving loop reads the signals from now on. A SIGTERM or SIGINT
    /// that came meanwhile is still pending for it, and so is a SIGHUP.
    func handOff() {
        let (exiting, hangup) = state.withLock { state -> (Bool, Bool) in
            if state.phase == .exiting { return (true, false) }
            state.phase = .handedOff
            return (false, state.hangup)
        }
        // The watcher is ending the process: wait for it, do nothing more.
        while exiting { pause() }
        var one: UInt64 = 1
        _ = write(wakeFD, &one, 8)
        if hangup { kill(getpid(), SIGHUP) }
    }

    private func watch(_ log: Logger) {
        var fds = [
            pollfd(fd: signalFD, events: Int16(POLLIN), revents: 0),
            pollfd(fd: wakeFD, events: Int16(POLLIN), revents: 0),
        ]
        while true {
            if poll(&fds, 2, -1) < 0 {
                if errno == EINTR { continue }
                log.warning("cannot watch for signals during start-up: poll: \(String(cString: strerror(errno)))")
                return
            }
            // Whoever owns the phase owns the signalfd: once handed off, the
            // serving loop reads it and the watcher must not take a signal away.
            let mine = state.withLock { state -> Bool in state.phase == .starting }
            guard mine else { return }
            guard fds[0].revents & Int16(POLLIN) != 0 else { continue }
            let signal = vaultd_signalfd_read(signalFD)
            guard signal == SIGTERM || signal == SIGINT || signal == SIGHUP else { continue }
            enum Decision { case keep, exit, giveBack }
            let decision = state.withLock { state -> Decision in
                guard state.phase == .starting else { return .giveBack }
                if signal == SIGHUP {
                    state.hangup = true
                    return .keep
                }
                state.phase = .exiting
                return .exit
            }
            switch decision {
            case .keep: continue
            case .giveBack:
                // Handed off between the read and now: the serving loop gets it.
                kill(getpid(), signal)
                return
            case .exit: break
            }
            log.notice(
                "stopped by \(signal == SIGTERM ? "SIGTERM" : "SIGINT") during start-up, before serving",
                ["signal": String(signal)])
            log.flush()
            // _exit: other threads may be inside the secret store or the name
            // service; atexit handlers must not wait for them.
            _exit(0)
        }
    }
}
