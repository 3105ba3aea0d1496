import Varlink

/// How much one local user may hold, so that none can starve the others.
/// Root is held to none of these: it owns the machine.
public struct UserLimits: Sendable, Equatable {
    /// Sessions one uid may own (`MaxSessionsPerUser=`).
    public var sessionsPerUser = 256
    /// Bytes one stored session record may take, tokens and profile included (`MaxSessionSize=`).
    public var sessionBytes = 32 * 1024
    /// Client-asked refreshes of one account are at least this far apart,
    /// unless the token has expired (`MinRefreshInterval=`), in seconds.
    public var minRefreshIntervalSeconds: Int64 = 60
    /// Provider requests (logins that ask the provider, refreshes a client
    /// asked for, revocations) one uid may cause: a token bucket of
    /// `ProviderRequestBurst=` refilled at `ProviderRequestsPerMinute=`
    /// (0: no limit). Root and the admin group are not limited.
    public var providerRequests = ProviderBudget.Settings()

    /// The defaults.
    public init() {}
}

/// Where a vaultd instance keeps its sessions.
public enum StoreEngine: String, Sendable, Equatable, CaseIterable {
    /// One Secret Service item per session (gnome-keyring, KeePassXC): the default.
    case secretService = "secret-service"
    /// One SQLite database, every row sealed under a data key kept in a
    /// systemd credential or in the Secret Service: for hosts with many sessions.
    case sqlite
    /// etcd (`[Etcd]`), every value sealed under the fleet's data key (the
    /// credential `data-key`): for hosts sharing their sessions.
    case etcd
}

/// The whole configuration of a vaultd instance.
public struct VaultConfig: Sendable, Equatable {
    /// The providers, by name.
    public var providers: [String: ProviderConfig]
    /// How long one secret store call may take before it is abandoned, in seconds.
    public var storeTimeoutSeconds: Int64
    /// The group (name or gid) whose members may see every session and force any logout.
    public var adminGroup: String?
    /// The `scope` attribute of this instance's items: instances sharing a keyring keep apart.
    public var storeScope: String
    /// Where sessions are kept (`Store=`): one Secret Service item each, or
    /// one sealed SQLite database.
    public var storeEngine = StoreEngine.secretService
    /// The SQLite database file (`Database=`); nil: the engine's default place.
    public var databasePath: String?
    /// How to reach etcd (`[Etcd]`), for `Store=etcd`.
    public var etcd = EtcdSettings()
    /// The mode of the socket vaultd binds (not of one systemd passes).
    public var socketMode: UInt32
    /// The accounts the administrator declared (`[Account PROVIDER USER]`).
    public var accounts: [Account: AccountSettings]
    /// What one local user may hold.
    public var limits: UserLimits
    /// What one user may take of the socket server: connections, time, queued output.
    public var serving = ServingLimits()
    /// The files this configuration was read from, in the order read (main
    /// files and drop-ins; see `ConfigSearch`). Empty for the built-in
    /// configuration and for one made in code.
    public var sources: [String] = []
    /// The main files vaultd looked for, in order, whether or not they
    /// exist: where a section the configuration lacks can be added.
    public var searchedFiles: [String] = []

    /// A configuration with the given providers and default settings.
    public init(providers: [String: ProviderConfig] = [:], storeTimeoutSeconds: Int64 = 30) {
        self.providers = providers
        self.storeTimeoutSeconds = storeTimeoutSeconds
        self.adminGroup = nil
        self.storeScope = "default"
        self.socketMode = 0o600
        self.accounts = [:]
        self.limits = UserLimits()
    }

    /// The configuration used when no file exists: one static provider, `demo`.
    public static let builtInText = """
        # Built-in default: one provider that keeps tokens as given.
        [Provider demo]
        Type=static
        Description=Tokens kept as given; the session ends when the token expires
        """
}

/// Reads vaultd's INI-style configuration, in the syntax of systemd's unit files:
/// `[Section]` headers, `Key=value` lines, `#` and `;` comments. A main file may
/// be followed by drop-ins, applied in order: a later file's key overrides an
/// earlier one's. Every error names the file, the line and the key, and says
/// what was expected; none quotes a value or a line, since a value may be a
/// secret and the file may not be a configuration at all (`--config /etc/shadow`).
public enum ConfigParser {
    /// The keys `[Vault]` accepts.
    static let vaultKeys =
        [
            "StoreTimeout", "StoreScope", "AdminGroup", "SocketMode", "MaxSessionsPerUser", "MaxSessionSize",
            "ProviderRequestsPerMinute", "ProviderRequestBurst",
            "MinRefreshInterval", "Store", "Database",
        ] + ServingLimits.keys

    /// Parses one file's `text`, read from `file` (used in error messages only).
    public static func parse(_ text: String, file: String) throws(VaultError) -> VaultConfig {
        try parse(layers: [(text: text, file: file)])
    }

    /// Parses a main file and its drop-ins, in the order given.
    public static func parse(layers: [(text: String, file: String)]) throws(VaultError) -> VaultConfig {
        var merged = MergedSections()
        for layer in layers { try scan(layer.text, file: layer.file, into: &merged) }
        var config = VaultConfig()
        try vaultSettings(merged.vault, into: &config)
        config.etcd = try etcdSettings(merged.etcd)
        try limits(merged.vault, into: &config.limits)
        config.serving = try servingLimits(merged.vault)
        for (account, entries) in merged.accounts {
            config.accounts[account] = try accountSettings(account, entries)
        }
        try checkTokenFilePaths(config.accounts)
        for name in merged.providerOrder {
            config.providers[name] = try providerConfig(name, merged.providers[name]!)
        }
        try checkAutoLogin(merged.accounts, config)
        return config
    }

    /// The keys of `[Vault]` about the store, the admin group and the socket.
    static func vaultSettings(_ vault: [String: Entry], into config: inout VaultConfig) throws(VaultError) {
        if let timeout = vault["StoreTimeout"] {
            config.storeTimeoutSeconds = try ConfigParser.timeout(timeout, key: "StoreTimeout")
        }
        if let group = vault["AdminGroup"] {
            guard !group.value.isEmpty, !group.value.contains(" ") else {
                throw group.error("key 'AdminGroup': expected one group name or gid")
            }
            config.adminGroup = group.value
        }
        if let scope = vault["StoreScope"] {
            guard !scope.value.isEmpty, scope.value.utf8.count <= 64,
                scope.value.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." })
            else {
                throw scope.error("key 'StoreScope': expected 1 to 64 letters, digits, '-', '_' or '.'")
            }
            config.storeScope = scope.value
        }
        if let engine = vault["Store"] {
            guard let value = StoreEngine(rawValue: engine.value) else {
                throw engine.error("key 'Store': expected secret-service, sqlite or etcd")
            }
            config.storeEngine = value
        }
        if let database = vault["Database"] {
            guard database.value.hasPrefix("/"), !database.value.hasSuffix("/") else {
                throw database.error("key 'Database': expected an absolute path to a file")
            }
            config.databasePath = database.value
        }
        if let mode = vault["SocketMode"] {
            guard let value = UInt32(mode.value, radix: 8), value <= 0o777, value & 0o600 == 0o600 else {
                throw mode.error(
                    "key 'SocketMode': expected an octal mode with owner read and write, such as 0600 or 0666")
            }
            config.socketMode = value
        }
    }

    /// The space-separated words of a list key (user and group names).
    static func words(_ entry: Entry?) -> [String] {
        entry.map { $0.value.split(separator: " ").map(String.init) } ?? []
    }

    /// The whole number `key` of `section` holds, if set; a value outside
    /// `range` is an error naming the file, the line and the key.
    static func wholeNumber(_ section: [String: Entry], _ key: String, in range: ClosedRange<Int>) throws(VaultError)
        -> Int?
    {
        guard let entry = section[key] else { return nil }
        guard let value = Int(entry.value), range.contains(value) else {
            throw entry.error("key '\(key)': expected a whole number from \(range.lowerBound) to \(range.upperBound)")
        }
        return value
    }

    /// The per-user limits of `[Vault]`.
    static func limits(_ vault: [String: Entry], into limits: inout UserLimits) throws(VaultError) {
        func count(_ key: String, _ range: ClosedRange<Int>) throws(VaultError) -> Int? {
            try wholeNumber(vault, key, in: range)
        }
        if let value = try count("MaxSessionsPerUser", 1...1_000_000) { limits.sessionsPerUser = value }
        if let value = try count("MaxSessionSize", 1024...(1 << 20)) { limits.sessionBytes = value }
        if let entry = vault["MinRefreshInterval"] {
            guard let seconds = DurationParser.seconds(entry.value), seconds <= 86400 else {
                throw entry.error("key 'MinRefreshInterval': expected a duration up to 1d (e.g. 60 or 1min)")
            }
            limits.minRefreshIntervalSeconds = seconds
        }
        if let value = try count("ProviderRequestsPerMinute", 0...100_000) { limits.providerRequests.perMinute = value }
        if let value = try count("ProviderRequestBurst", 1...100_000) { limits.providerRequests.burst = value }
    }

    /// The longest a timeout may be: one hour.
    public static let maximumTimeoutSeconds: Int64 = 3600

    /// A timeout: a duration from 1 s to an hour.
    static func timeout(_ entry: Entry, key: String) throws(VaultError) -> Int64 {
        guard let seconds = DurationParser.seconds(entry.value), seconds > 0 else {
            throw entry.error("key '\(key)': expected a duration of at least 1s, e.g. 30 or 15s or 1min")
        }
        guard seconds <= maximumTimeoutSeconds else {
            throw entry.error("key '\(key)': the duration is longer than the most allowed, 1h")
        }
        return seconds
    }

    /// A boolean as systemd writes one.
    static func boolean(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "yes", "true", "on", "1": return true
        case "no", "false", "off", "0": return false
        default: return nil
        }
    }

}

/// Parses durations as systemd writes them: `90`, `90s`, `5min`, `2h`, `1d`, `1h 30min`.
public enum DurationParser {
    /// The duration in seconds, or nil when the text is not a duration.
    public static func seconds(_ text: String) -> Int64? {
        let units: [(String, Int64)] = [
            ("days", 86400), ("day", 86400), ("d", 86400), ("hours", 3600), ("hour", 3600), ("h", 3600),
            ("minutes", 60), ("minute", 60), ("min", 60), ("m", 60), ("seconds", 1), ("second", 1),
            ("sec", 1), ("s", 1), ("", 1),
        ]
        var total: Int64 = 0
        var sawAny = false
        for part in text.split(separator: " ") {
            let digits = part.prefix(while: { $0.isASCII && $0.isNumber })
            guard !digits.isEmpty, let number = Int64(digits) else { return nil }
            let unit = String(part.dropFirst(digits.count))
            guard let multiplier = units.first(where: { $0.0 == unit })?.1 else { return nil }
            let (product, overflow) = number.multipliedReportingOverflow(by: multiplier)
            guard !overflow else { return nil }
            let (sum, sumOverflow) = total.addingReportingOverflow(product)
            guard !sumOverflow else { return nil }
            total = sum
            sawAny = true
        }
        return sawAny ? total : nil
    }
}
