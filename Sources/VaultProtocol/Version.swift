/// The version of vaultd and vaultctl, written in this one place: both print
/// it for `--version`, vaultd reports it over Varlink, and `scripts/package`
/// takes the Debian package's version from `vaultctl --version`.
public enum VaultdVersion {
    /// The version, `MAJOR.MINOR.PATCH`.
    public static let current = "0.1.0"
}
