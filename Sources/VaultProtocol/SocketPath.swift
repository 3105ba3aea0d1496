/// Where vaultd listens unless told otherwise. vaultd and vaultctl both call
/// this, so they agree in every environment.
public enum SocketPath {
    /// The system instance's socket.
    public static let system = "/run/vaultd/socket"

    /// The default socket: `VAULTD_SOCKET` when set; else
    /// `$XDG_RUNTIME_DIR/vaultd/socket`; else the system socket for root and
    /// `/run/user/UID/vaultd/socket` for anyone else.
    public static func `default`(environment: [String: String], uid: UInt32) -> String {
        `default`(lookup: { environment[$0] }, uid: uid)
    }

    /// The default socket, reading the environment through `lookup` (a
    /// caller that has no dictionary of it, such as `getenv`).
    public static func `default`(lookup: (String) -> String?, uid: UInt32) -> String {
        if let explicit = lookup("VAULTD_SOCKET"), !explicit.isEmpty { return explicit }
        if let runtime = lookup("XDG_RUNTIME_DIR"), runtime.hasPrefix("/") {
            return runtime + "/vaultd/socket"
        }
        return uid == 0 ? system : "/run/user/\(uid)/vaultd/socket"
    }
}
