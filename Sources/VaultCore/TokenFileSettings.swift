/// What a token file holds (`TokenFileFormat=`).
public enum TokenFileFormat: String, Sendable, CaseIterable {
    /// The access token alone, as `GetToken` serves it (the default).
    case raw
    /// A JSON object with the session's fields (`SessionFields.json()`).
    case json
    /// `VARIABLE=VALUE` lines for systemd's `EnvironmentFile=` (`SessionFields.environmentFile()`).
    case env
}

/// Where and how vaultd writes one account's token for programs that cannot
/// speak Varlink (`[Account PROVIDER USER] TokenFile=`): the file holds the
/// access token vaultd serves (with `TokenFileFormat=json` or `env`, beside
/// the session's other fields), and is replaced atomically on every change
/// and removed when the session ends.
///
/// This is what the configuration says; whether the directory is fit for a
/// token (a memory file system, not writable by others, the owner allowed)
/// is checked where files are, by the daemon, at `--check-config`, start-up
/// and reload.
public struct TokenFileSettings: Sendable, Equatable {
    /// The file, an absolute path (`TokenFile=`).
    public var path: String
    /// Its permission bits (`TokenFileMode=`, default 0600): owner read, at
    /// most owner write and group read.
    public var mode: UInt32
    /// The user (name or uid) the file is given to (`TokenFileOwner=`); nil
    /// leaves it to the user vaultd runs as. Only root can give files away.
    public var owner: String?
    /// `TokenFileOnDisk=yes`: the directory may be on a disk file system,
    /// where the token outlives a reboot and may be in backups.
    public var onDisk: Bool
    /// What the file holds (`TokenFileFormat=`, default raw).
    public var format: TokenFileFormat
    /// `FILE:LINE` of `TokenFile=`, for the daemon's checks to name.
    public var location: String
    /// `FILE:LINE` of `TokenFileOwner=`, when set.
    public var ownerLocation: String?

    /// The default of `TokenFileMode=`.
    public static let defaultMode: UInt32 = 0o600
    /// The bits `TokenFileMode=` may hold: owner read and write, group read.
    public static let allowedModeBits: UInt32 = 0o640

    /// Settings for `path` with the defaults for the rest.
    public init(
        path: String, mode: UInt32 = TokenFileSettings.defaultMode, owner: String? = nil, onDisk: Bool = false,
        format: TokenFileFormat = .raw, location: String = "", ownerLocation: String? = nil
    ) {
        self.path = path
        self.mode = mode
        self.owner = owner
        self.onDisk = onDisk
        self.format = format
        self.location = location
        self.ownerLocation = ownerLocation
    }

    /// The directory the file is in (`/` for a file at the root).
    public var directory: String {
        let parent = path.utf8.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true).dropLast()
        return "/" + parent.map { String(decoding: $0, as: UTF8.self) }.joined(separator: "/")
    }

    /// The file's own name, without the directory.
    public var name: String {
        String(decoding: path.utf8.split(separator: UInt8(ascii: "/")).last ?? [], as: UTF8.self)
    }
}

extension ConfigParser {
    /// The keys of `[Account]` that configure its token file.
    static let tokenFileKeys = ["TokenFile", "TokenFileMode", "TokenFileOwner", "TokenFileOnDisk", "TokenFileFormat"]

    /// The token file an `[Account]` section asks for, if any; every error
    /// names the file, the line and the key, and what to write instead.
    static func tokenFile(_ entries: [String: Entry], _ account: Account) throws(VaultError) -> TokenFileSettings? {
        let section = "[Account \(account.provider) \(account.user)]"
        guard let entry = entries["TokenFile"] else {
            if let other = tokenFileKeys.dropFirst().first(where: { entries[$0] != nil }), let stray = entries[other] {
                throw stray.error("key '\(other)' needs TokenFile= in the same section \(section)")
            }
            return nil
        }
        let path = entry.value
        let components = path.split(separator: "/", omittingEmptySubsequences: false).dropFirst()
        guard path.hasPrefix("/"), !path.hasSuffix("/"), path.utf8.count <= 4095,
            components.allSatisfy({ !$0.isEmpty && $0 != "." && $0 != ".." && $0.utf8.count <= 255 })
        else {
            throw entry.error(
                "key 'TokenFile': expected an absolute path to a file, without '.', '..' or '//' parts, e.g. /run/user/1000/vaultd/demo-alice.token"
            )
        }
        var settings = TokenFileSettings(path: path, location: "\(entry.file):\(entry.line)")
        if let mode = entries["TokenFileMode"] {
            guard let value = UInt32(mode.value, radix: 8), value & ~TokenFileSettings.allowedModeBits == 0,
                value & 0o400 != 0
            else {
                throw mode.error(
                    "key 'TokenFileMode': expected an octal mode with owner read and at most owner write and group read (0400, 0440, 0600 or 0640); a token file is never writable by others, executable or readable by everyone"
                )
            }
            settings.mode = value
        }
        if let owner = entries["TokenFileOwner"] {
            guard !owner.value.isEmpty, !owner.value.contains(" "), !owner.value.contains("\t") else {
                throw owner.error("key 'TokenFileOwner': expected one user name or uid")
            }
            settings.owner = owner.value
            settings.ownerLocation = "\(owner.file):\(owner.line)"
        }
        if let onDisk = entries["TokenFileOnDisk"] {
            guard let value = boolean(onDisk.value) else {
                throw onDisk.error("key 'TokenFileOnDisk': expected yes or no")
            }
            settings.onDisk = value
        }
        if let format = entries["TokenFileFormat"] {
            guard let value = TokenFileFormat(rawValue: format.value) else {
                throw format.error("key 'TokenFileFormat': expected raw, json or env")
            }
            settings.format = value
        }
        return settings
    }

    /// Refuses two accounts writing one token file: each would overwrite and
    /// remove the other's token.
    static func checkTokenFilePaths(_ accounts: [Account: AccountSettings]) throws(VaultError) {
        var seen: [String: Account] = [:]
        for account in accounts.keys.sorted() {
            guard let file = accounts[account]?.tokenFile else { continue }
            if let first = seen[file.path] {
                throw VaultError(
                    .invalidConfig,
                    "\(file.location): key 'TokenFile': [Account \(first.provider) \(first.user)] writes the same file; give each account a file of its own"
                )
            }
            seen[file.path] = account
        }
    }
}
