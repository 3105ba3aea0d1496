import CSystemd
import Dispatch
import Glibc
import Synchronization
import VaultCore
import VaultSystem

/// The listening socket handed over by systemd (socket activation).
public enum SocketActivation {
    /// The one listening socket passed by systemd, nil when none was passed.
    /// More than one, or one that is not a listening Unix stream socket, is an error.
    public static func listeningSocket() throws(VaultError) -> Int32? {
        // sd_listen_fds checks LISTEN_PID against our pid and clears the variables.
        let count = sd_listen_fds(1)
        if count < 0 {
            throw VaultError(.internalError, "cannot read the sockets passed by systemd (errno \(-count))")
        }
        if count == 0 { return nil }
        guard count == 1 else {
            throw VaultError(
                .invalidConfig,
                "systemd passed \(count) sockets, vaultd takes exactly one: give vaultd.socket a single ListenStream=")
        }
        let fd = SD_LISTEN_FDS_START
        guard sd_is_socket_unix(fd, Int32(SOCK_STREAM.rawValue), 1, nil, 0) > 0 else {
            throw VaultError(
                .invalidConfig, "the socket passed by systemd is not a listening Unix stream socket; fix vaultd.socket")
        }
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        return fd
    }
}
