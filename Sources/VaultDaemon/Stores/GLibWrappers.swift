import CSecret
import Dispatch

/// A GHashTable of owned strings, freed with its keys and values in deinit.
final class GHashTableBox {
    let table: OpaquePointer

    init() {
        table = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free)
    }

    deinit { g_hash_table_unref(table) }
}

/// A GCancellable that cancels itself after a timeout, so no store call can
/// block the store's queue for ever. Its end stops the timer: nothing wakes
/// for a call that is over.
final class Cancellable: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<GCancellable>
    private let timer: any DispatchSourceTimer

    init(timeoutSeconds: Int64) {
        let pointer = g_cancellable_new()!
        self.pointer = pointer
        // The cancellable's own reference, for the timer, until it is cancelled.
        g_object_ref(UnsafeMutableRawPointer(pointer))
        timer = DispatchSource.makeTimerSource(queue: .global())
        timer.schedule(deadline: .now() + .seconds(Int(timeoutSeconds)))
        timer.setEventHandler { g_cancellable_cancel(pointer) }
        timer.setCancelHandler { g_object_unref(UnsafeMutableRawPointer(pointer)) }
        timer.resume()
    }

    /// Whether the timeout passed (the call in progress was cancelled).
    var isCancelled: Bool { g_cancellable_is_cancelled(pointer) != 0 }

    deinit {
        timer.cancel()
        g_object_unref(UnsafeMutableRawPointer(pointer))
    }
}

/// A GError, read once at the boundary: its message, domain and code, and
/// the D-Bus error name when it came from the other side.
struct GLibFailure {
    var message: String
    var domain: GQuark
    var code: Int32
    var remoteName: String?
    /// The call was cancelled (vaultd's timeout).
    var cancelled: Bool {
        domain == g_io_error_quark() && code == Int32(G_IO_ERROR_CANCELLED.rawValue)
    }

    /// The failure `error` holds, freeing it; nil when there is none.
    static func take(_ error: inout UnsafeMutablePointer<GError>?) -> GLibFailure? {
        guard let e = error else { return nil }
        defer {
            g_error_free(e)
            error = nil
        }
        var remoteName: String?
        if let name = g_dbus_error_get_remote_error(e) {
            remoteName = String(cString: name)
            g_free(name)
        }
        return GLibFailure(
            message: e.pointee.message.map { String(cString: $0) } ?? "unknown error", domain: e.pointee.domain,
            code: e.pointee.code, remoteName: remoteName)
    }
}
