import Glibc
import VaultSystem

// In VaultDaemon, not VaultSystem: vaultctl links VaultSystem and is a static
// executable, where `getpwuid` (an NSS lookup) would need the shared glibc of
// the build machine at run time. vaultd is dynamically linked and may ask NSS.
extension Files {
    /// The user's home directory: `$HOME`, else the password database.
    public static func homeDirectory() -> String? {
        if let home = getenv("HOME") { return String(cString: home) }
        guard let entry = getpwuid(getuid()), let dir = entry.pointee.pw_dir else { return nil }
        return String(cString: dir)
    }
}
