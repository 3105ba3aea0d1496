import CSystemd
import Dispatch
import Glibc
import Synchronization
import VaultCore
import VaultSystem

/// The service manager protocol of systemd (sd_notify): READY, STATUS,
/// STOPPING, RELOADING and WATCHDOG. Every call is a no-op when vaultd was not
/// started by a service manager (no NOTIFY_SOCKET).
///
/// A datagram to a manager that does not read blocks once its queue is full,
/// so messages are sent from one serial queue of their own, in order, never
/// from the serving loop or the session manager; STATUS updates that pile up
/// meanwhile are coalesced into the latest.
public final class ServiceNotifier: Sendable {
    /// True when a service manager listens.
    public let isActive: Bool
    /// How often to send WATCHDOG=1 (half of WatchdogSec), in milliseconds, when enabled.
    public let watchdogIntervalMilliseconds: Int?
    private let queue = DispatchQueue(label: "io.vaultd.notify")
    private let pendingStatus = Mutex<String?>(nil)

    /// Reads NOTIFY_SOCKET and WATCHDOG_USEC/WATCHDOG_PID from the environment.
    public init() {
        isActive = Environment.get("NOTIFY_SOCKET") != nil
        var usec: UInt64 = 0
        if sd_watchdog_enabled(0, &usec) > 0, usec > 0 {
            watchdogIntervalMilliseconds = max(1, Int(usec / 2000))
        } else {
            watchdogIntervalMilliseconds = nil
        }
    }

    /// Start-up is complete: the store answered, sessions are restored, the socket listens.
    public func ready(status: String) { send("READY=1\nSTATUS=\(status)") }

    /// The one-line status shown by `systemctl status`; updates are coalesced.
    public func status(_ status: String) {
        guard isActive else { return }
        let scheduled = pendingStatus.withLock { pending -> Bool in
            defer { pending = status }
            return pending != nil
        }
        if scheduled { return }
        queue.async {
            guard
                let latest = self.pendingStatus.withLock({ pending -> String? in
                    defer { pending = nil }
                    return pending
                })
            else { return }
            _ = sd_notify(0, "STATUS=\(latest)")
        }
    }

    /// The daemon is shutting down. Sent before this returns, so that it is
    /// not lost when the process exits right after.
    public func stopping() {
        guard isActive else { return }
        queue.sync { _ = sd_notify(0, "STOPPING=1\nSTATUS=stopping") }
    }

    /// Waits until every message handed over so far is sent.
    public func flush() { queue.sync {} }

    /// A reload began; READY=1 follows when it is done.
    public func reloading() {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        let usec = UInt64(ts.tv_sec) * 1_000_000 + UInt64(ts.tv_nsec) / 1000
        send("RELOADING=1\nMONOTONIC_USEC=\(usec)\nSTATUS=reloading configuration")
    }

    /// The daemon still serves.
    public func watchdog() { send("WATCHDOG=1") }

    private func send(_ state: String) {
        guard isActive else { return }
        queue.async { _ = sd_notify(0, state) }
    }

    /// The STATUS line for the sessions in `table`.
    public static func statusLine(_ table: SessionTable) -> String {
        // From the table's running counts: this runs after every change.
        let counts = table.counts
        let (sessions, logging, refreshing, failing) = (
            counts.sessions, counts.loggingIn, counts.refreshing, counts.failing
        )
        let line =
            "\(sessions) session\(sessions == 1 ? "" : "s"), \(logging) logging in, \(refreshing) refreshing, "
            + "\(failing) failing to refresh"
        let files = table.tokenFilesFailing
        return files == 0 ? line : line + ", \(files) token file\(files == 1 ? "" : "s") failing"
    }
}
