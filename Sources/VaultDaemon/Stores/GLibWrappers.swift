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
/// block the store's queue for ever.
final class Cancellable: @unchecked Sendable {
    let pointer: UnsafeMutablePointer<GCancellable>

    init(timeoutSeconds: Int64) {
        pointer = g_cancellable_new()
        let box = Unmanaged.passRetained(self)
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(Int(timeoutSeconds))) {
            let cancellable = box.takeRetainedValue()
            withExtendedLifetime(cancellable) { g_cancellable_cancel(cancellable.pointer) }
        }
    }

    deinit { g_object_unref(UnsafeMutableRawPointer(pointer)) }
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
