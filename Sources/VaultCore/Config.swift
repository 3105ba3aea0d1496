import Varlink

/// How a provider keeps its tokens fresh.
public enum ProviderType: String, Sendable, CaseIterable {
    /// The token is used as given; the session ends when it expires.
    case `static`
    /// An OAuth 2.0 token endpoint (RFC 6749) refreshes the access token.
    case oauth2
    /// A helper program vaultd runs logs in and refreshes (the seeds' trusted backend).
    case exec
}

/// The settings of an `exec` provider.
public struct ExecSettings: Sendable, Equatable {
    /// The program (an absolute path) and its arguments; never run through a shell.
    public var command: [String]
    /// How long one run may take, in seconds, waiting for a free helper slot included.
    public var timeoutSeconds: Int64
    /// The most runs of this provider's helper at once (`MaxConcurrentHelpers=`);
    /// further runs wait in line, first come first served.
    public var maxConcurrentHelpers: Int
    /// `DefaultLifetime=`, in seconds, when set: the lifetime assumed for a
    /// token the helper hands out without `expires_in`, so that vaultd
    /// refreshes it on a schedule. Unset, such a token never expires and is
    /// refreshed only when a client asks.
    public var defaultLifetime: Int64?
    /// Where `Command=` was written (`FILE:LINE`), for errors about the program.
    public var commandLocation: String?

    /// The default of `MaxConcurrentHelpers=`.
    public static let defaultMaxConcurrentHelpers = 4
    /// The largest `MaxConcurrentHelpers=` accepted.
    public static let maximumConcurrentHelpers = 64

    /// Settings for `command`.
    public init(
        command: [String], timeoutSeconds: Int64 = 30, maxConcurrentHelpers: Int = defaultMaxConcurrentHelpers
    ) {
        self.command = command
        self.timeoutSeconds = timeoutSeconds
        self.maxConcurrentHelpers = maxConcurrentHelpers
    }
}

/// The settings of an `oauth2` provider.
public struct OAuth2Settings: Sendable, Equatable {
    /// The token endpoint (`grant_type=refresh_token`, `client_credentials`).
    public var tokenURL: String
    /// The client id sent with every request.
    public var clientID: String
    /// The RFC 7009 revocation endpoint, used at logout.
    public var revocationURL: String?
    /// The scope asked for, space separated.
    public var scope: String?
    /// `DefaultLifetime=`, in seconds, when set: the token lifetime assumed
    /// when the server sends no `expires_in` (Salesforce). Unset, such a token
    /// has no expiry and is never refreshed on a schedule.
    public var defaultLifetime: Int64?
    /// After this long a session is ended whatever its tokens say, in seconds.
    public var maxSessionLifetime: Int64?
    /// A file holding the client secret (systemd credentials), never the secret itself.
    public var clientSecretFile: String?
    /// How long one request to the token or revocation endpoint may take, in seconds.
    public var timeoutSeconds: Int64 = 30
    /// `AllowInsecureHTTP=yes`: `http://` endpoints on other hosts than
    /// loopback are accepted, though refresh tokens and the client secret then
    /// cross the network in clear. Off by default.
    public var allowInsecureHTTP = false

    /// Settings with the required fields and defaults for the rest.
    public init(tokenURL: String, clientID: String) {
        self.tokenURL = tokenURL
        self.clientID = clientID
    }
}

/// One `[Provider NAME]` section of the configuration.
public struct ProviderConfig: Sendable, Equatable {
    /// The provider's name, as clients address it.
    public var name: String
    /// How tokens are refreshed.
    public var type: ProviderType
    /// A free-text description shown by `vaultctl`.
    public var description: String?
    /// At most one logged-in user: logging in another switches accounts, after
    /// the old session's logout finished (OpenIM's account switching).
    public var singleAccount: Bool
    /// The token endpoint and friends, for `oauth2`.
    public var oauth2: OAuth2Settings?
    /// The helper program, for `exec`.
    public var exec: ExecSettings?
    /// Users (names or uids) who may have this provider issue tokens (`MintUsers=`).
    public var mintUsers: [String] = []
    /// Groups (names or gids) whose members may have this provider issue tokens (`MintGroups=`).
    public var mintGroups: [String] = []

    /// Makes a provider entry.
    public init(
        name: String, type: ProviderType, description: String? = nil, singleAccount: Bool = false,
        oauth2: OAuth2Settings? = nil, exec: ExecSettings? = nil
    ) {
        self.name = name
        self.type = type
        self.description = description
        self.singleAccount = singleAccount
        self.oauth2 = oauth2
        self.exec = exec
    }
}

/// An `[Account PROVIDER USER]` section: a shared account the administrator
/// declared, by names as written.
public struct AccountSettings: Sendable, Equatable {
    /// The local user (name or uid) whose session this account is; nil means
    /// the user vaultd runs as.
    public var owner: String?
    /// Users (names or uids) who may read the owner's token.
    public var readUsers: [String]
    /// Groups (names or gids) whose members may read the owner's token.
    public var readGroups: [String]
    /// `AutoLogin=yes`: vaultd logs the account in at start and again after
    /// its session ended as `tokenExpired` or `tokenInvalid` (oauth2 and
    /// exec providers only: they log in without a user).
    public var autoLogin = false
    /// `ReloginAfterKick=yes`: an automatic account is logged in again after a kick too.
    public var reloginAfterKick = false
    /// Where the owner's token is written for programs that cannot speak Varlink (`TokenFile=`).
    public var tokenFile: TokenFileSettings? = nil

    /// A declaration.
    public init(owner: String? = nil, readUsers: [String] = [], readGroups: [String] = []) {
        self.owner = owner
        self.readUsers = readUsers
        self.readGroups = readGroups
    }
}

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
    /// How many threads serve the socket (`ServingThreads=`), each an epoll
    /// loop of its own; nil: the server's default. Read at start only.
    public var servingThreads: Int?
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
    /// The keys each kind of section accepts.
    static let vaultKeys =
        [
            "StoreTimeout", "StoreScope", "AdminGroup", "SocketMode", "MaxSessionsPerUser", "MaxSessionSize",
            "ProviderRequestsPerMinute", "ProviderRequestBurst",
            "MinRefreshInterval", "Store", "Database", "ServingThreads",
        ] + ServingLimits.keys
    static let providerKeys = [
        "Type", "Description", "SingleAccount", "TokenURL", "ClientID", "RevocationURL", "Scope", "DefaultLifetime",
        "MaxSessionLifetime", "ClientSecretFile", "AllowInsecureHTTP", "Command", "Timeout", "MaxConcurrentHelpers",
        "MintUsers", "MintGroups",
    ]
    /// The keys only some types of provider take.
    static let typeKeys: [ProviderType: Set<String>] = [
        .exec: ["Command", "Timeout", "MaxConcurrentHelpers", "DefaultLifetime"],
        .oauth2: [
            "TokenURL", "ClientID", "RevocationURL", "Scope", "DefaultLifetime", "MaxSessionLifetime",
            "ClientSecretFile", "AllowInsecureHTTP", "Timeout",
        ],
    ]
    static let accountKeys =
        ["Owner", "TokenReadUsers", "TokenReadGroups", "AutoLogin", "ReloginAfterKick"] + tokenFileKeys

    /// The text of a configuration file read as `bytes`: UTF-8, or an error
    /// naming the file and the first line that is not (never quoting it).
    public static func text(of bytes: [UInt8], file: String) throws(VaultError) -> String {
        if let text = String(validating: bytes, as: UTF8.self) { return text }
        // A multi-byte sequence never holds a LF byte: the lines can be checked one by one.
        var lineNumber = 0
        for line in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            if String(validating: line, as: UTF8.self) == nil { break }
        }
        throw VaultError(.invalidConfig, "\(file):\(lineNumber): not UTF-8 text; write the file in UTF-8")
    }

    /// Parses one file's `text`, read from `file` (used in error messages only).
    public static func parse(_ text: String, file: String) throws(VaultError) -> VaultConfig {
        try parse(layers: [(text: text, file: file)])
    }

    /// Parses a main file and its drop-ins, in the order given.
    public static func parse(layers: [(text: String, file: String)]) throws(VaultError) -> VaultConfig {
        var merged = MergedSections()
        for layer in layers { try scan(layer.text, file: layer.file, into: &merged) }
        var config = VaultConfig()
        if let timeout = merged.vault["StoreTimeout"] {
            config.storeTimeoutSeconds = try ConfigParser.timeout(timeout, key: "StoreTimeout")
        }
        if let group = merged.vault["AdminGroup"] {
            guard !group.value.isEmpty, !group.value.contains(" ") else {
                throw group.error("key 'AdminGroup': expected one group name or gid")
            }
            config.adminGroup = group.value
        }
        if let scope = merged.vault["StoreScope"] {
            guard !scope.value.isEmpty, scope.value.utf8.count <= 64,
                scope.value.allSatisfy({ $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" || $0 == "." })
            else {
                throw scope.error("key 'StoreScope': expected 1 to 64 letters, digits, '-', '_' or '.'")
            }
            config.storeScope = scope.value
        }
        if let engine = merged.vault["Store"] {
            guard let value = StoreEngine(rawValue: engine.value) else {
                throw engine.error("key 'Store': expected secret-service, sqlite or etcd")
            }
            config.storeEngine = value
        }
        if let database = merged.vault["Database"] {
            guard database.value.hasPrefix("/"), !database.value.hasSuffix("/") else {
                throw database.error("key 'Database': expected an absolute path to a file")
            }
            config.databasePath = database.value
        }
        if let mode = merged.vault["SocketMode"] {
            guard let value = UInt32(mode.value, radix: 8), value <= 0o777, value & 0o600 == 0o600 else {
                throw mode.error(
                    "key 'SocketMode': expected an octal mode with owner read and write, such as 0600 or 0666")
            }
            config.socketMode = value
        }
        config.etcd = try etcdSettings(merged.etcd)
        try limits(merged.vault, into: &config.limits)
        config.serving = try servingLimits(merged.vault)
        config.servingThreads = try wholeNumber(merged.vault, "ServingThreads", in: 1...64)
        for (account, entries) in merged.accounts {
            var settings = AccountSettings(
                readUsers: words(entries["TokenReadUsers"]), readGroups: words(entries["TokenReadGroups"]))
            if let owner = entries["Owner"] {
                guard !owner.value.isEmpty, !owner.value.contains(" ") else {
                    throw owner.error("key 'Owner': expected one user name or uid")
                }
                settings.owner = owner.value
            }
            for key in ["AutoLogin", "ReloginAfterKick"] {
                guard let entry = entries[key] else { continue }
                guard let value = ConfigParser.boolean(entry.value) else {
                    throw entry.error("key '\(key)': expected yes or no")
                }
                if key == "AutoLogin" { settings.autoLogin = value } else { settings.reloginAfterKick = value }
            }
            settings.tokenFile = try tokenFile(entries, account)
            config.accounts[account] = settings
        }
        try checkTokenFilePaths(config.accounts)
        for name in merged.providerOrder {
            let section = merged.providers[name]!
            guard let type = section.entries["Type"] else {
                throw VaultError(
                    .invalidConfig,
                    "\(section.file):\(section.line): [Provider \(name)] has no Type= (one of: \(typeNames))")
            }
            guard let providerType = ProviderType(rawValue: type.value) else {
                throw type.error("key 'Type': expected a provider type, one of: \(typeNames)")
            }
            var singleAccount = false
            if let entry = section.entries["SingleAccount"] {
                guard let value = ConfigParser.boolean(entry.value) else {
                    throw entry.error("key 'SingleAccount': expected yes or no")
                }
                singleAccount = value
            }
            let ownKeys = typeKeys[providerType] ?? []
            for (key, entry) in section.entries.sorted(by: { $0.key < $1.key }) where !ownKeys.contains(key) {
                let owners = ProviderType.allCases.filter { typeKeys[$0]?.contains(key) == true }
                guard !owners.isEmpty else { continue }
                let types = owners.map { "Type=\($0.rawValue)" }.joined(separator: " or ")
                throw entry.error("key '\(key)' is for \(types), not Type=\(providerType.rawValue)")
            }
            var oauth2: OAuth2Settings?
            var exec: ExecSettings?
            if providerType == .oauth2 { oauth2 = try oauth2Settings(name, section) }
            if providerType == .exec {
                exec = try execSettings(name, section)
            }
            var provider = ProviderConfig(
                name: name, type: providerType, description: section.entries["Description"]?.value,
                singleAccount: singleAccount, oauth2: oauth2, exec: exec)
            provider.mintUsers = words(section.entries["MintUsers"])
            provider.mintGroups = words(section.entries["MintGroups"])
            config.providers[name] = provider
        }
        try checkAutoLogin(merged.accounts, config)
        return config
    }

    /// `AutoLogin=yes` only for providers that log in without a user: oauth2
    /// (client credentials) and exec (the helper's own credential).
    /// `ReloginAfterKick=yes` only beside `AutoLogin=yes`.
    static func checkAutoLogin(_ accounts: [Account: [String: Entry]], _ config: VaultConfig) throws(VaultError) {
        for (account, entries) in accounts.sorted(by: { $0.key.description < $1.key.description }) {
            let section = "[Account \(account.provider) \(account.user)]"
            let settings = config.accounts[account]
            if let entry = entries["ReloginAfterKick"], settings?.reloginAfterKick == true,
                settings?.autoLogin != true
            {
                throw entry.error("key 'ReloginAfterKick': \(section) needs AutoLogin=yes for it")
            }
            guard let entry = entries["AutoLogin"], settings?.autoLogin == true else { continue }
            guard let provider = config.providers[account.provider] else {
                throw entry.error(
                    "key 'AutoLogin': \(section) names provider '\(account.provider)', which is not configured; add a [Provider \(account.provider)] section"
                )
            }
            guard provider.type == .oauth2 || provider.type == .exec else {
                throw entry.error(
                    "key 'AutoLogin': [Provider \(account.provider)] is Type=\(provider.type.rawValue), which cannot log in without a user; AutoLogin=yes needs Type=oauth2 (client credentials) or Type=exec (the helper's own credential)"
                )
            }
        }
    }

    static func oauth2Settings(_ name: String, _ section: ProviderSection) throws(VaultError) -> OAuth2Settings {
        func required(_ key: String) throws(VaultError) -> Entry {
            guard let entry = section.entries[key], !entry.value.isEmpty else {
                throw VaultError(
                    .invalidConfig, "\(section.file):\(section.line): [Provider \(name)] with Type=oauth2 needs \(key)="
                )
            }
            return entry
        }
        var allowInsecureHTTP = false
        if let entry = section.entries["AllowInsecureHTTP"] {
            guard let value = ConfigParser.boolean(entry.value) else {
                throw entry.error("key 'AllowInsecureHTTP': expected yes or no")
            }
            allowInsecureHTTP = value
        }
        func url(_ entry: Entry, _ key: String) throws(VaultError) -> String {
            let value = entry.value
            guard value.hasPrefix("https://") || value.hasPrefix("http://"), value.count > 8, !value.contains(" ")
            else { throw entry.error("key '\(key)': expected an http:// or https:// URL without spaces") }
            // The request carries the refresh token and the client secret.
            if value.hasPrefix("http://"), !allowInsecureHTTP, !ProviderURL.isLoopbackHTTP(value) {
                throw entry.error(
                    "key '\(key)': an http:// URL sends refresh tokens and the client secret in clear, so it is accepted only for a loopback host (127.0.0.1, [::1], localhost); use https://, or add AllowInsecureHTTP=yes to [Provider \(name)] if the network to that host is trusted"
                )
            }
            return value
        }
        func duration(_ key: String) throws(VaultError) -> Int64? {
            guard let entry = section.entries[key] else { return nil }
            guard let seconds = DurationParser.seconds(entry.value), seconds > 0 else {
                throw entry.error("key '\(key)': expected a duration of at least 1s, e.g. 7200 or 2h")
            }
            return seconds
        }
        let tokenURL = try required("TokenURL")
        var settings = OAuth2Settings(tokenURL: try url(tokenURL, "TokenURL"), clientID: try required("ClientID").value)
        if let entry = section.entries["RevocationURL"] { settings.revocationURL = try url(entry, "RevocationURL") }
        settings.scope = section.entries["Scope"]?.value
        if let lifetime = try duration("DefaultLifetime") { settings.defaultLifetime = lifetime }
        settings.maxSessionLifetime = try duration("MaxSessionLifetime")
        settings.clientSecretFile = section.entries["ClientSecretFile"]?.value
        settings.allowInsecureHTTP = allowInsecureHTTP
        if let timeout = section.entries["Timeout"] {
            settings.timeoutSeconds = try ConfigParser.timeout(timeout, key: "Timeout")
        }
        return settings
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

    static func execSettings(_ name: String, _ section: ProviderSection) throws(VaultError) -> ExecSettings {
        guard let command = section.entries["Command"], !command.value.isEmpty else {
            throw VaultError(
                .invalidConfig, "\(section.file):\(section.line): [Provider \(name)] with Type=exec needs Command=")
        }
        let argv = command.value.split(separator: " ", omittingEmptySubsequences: true).map(String.init)
        guard let program = argv.first, program.hasPrefix("/") else {
            throw command.error("key 'Command': expected the program as an absolute path, then its arguments")
        }
        var settings = ExecSettings(command: argv)
        settings.commandLocation = "\(command.file):\(command.line)"
        if let timeout = section.entries["Timeout"] {
            settings.timeoutSeconds = try ConfigParser.timeout(timeout, key: "Timeout")
        }
        if let entry = section.entries["MaxConcurrentHelpers"] {
            let most = ExecSettings.maximumConcurrentHelpers
            guard let value = Int(entry.value), value >= 1, value <= most else {
                throw entry.error(
                    "key 'MaxConcurrentHelpers': expected a whole number from 1 to \(most)")
            }
            settings.maxConcurrentHelpers = value
        }
        if let entry = section.entries["DefaultLifetime"] {
            guard let seconds = DurationParser.seconds(entry.value), seconds > 0 else {
                throw entry.error("key 'DefaultLifetime': expected a duration of at least 1s, e.g. 7200 or 2h")
            }
            settings.defaultLifetime = seconds
        }
        return settings
    }

    /// One `Key=value`, with where it was written.
    struct Entry {
        var value: String
        var file: String
        var line: Int

        func error(_ message: String) -> VaultError { VaultError(.invalidConfig, "\(file):\(line): \(message)") }
    }

    /// A provider section as merged so far, with where it was first defined.
    struct ProviderSection {
        var file: String
        var line: Int
        var entries: [String: Entry] = [:]
    }

    /// A boolean as systemd writes one.
    static func boolean(_ text: String) -> Bool? {
        switch text.lowercased() {
        case "yes", "true", "on", "1": return true
        case "no", "false", "off", "0": return false
        default: return nil
        }
    }

    /// The sections of every file read so far.
    struct MergedSections {
        var accounts: [Account: [String: Entry]] = [:]
        var vault: [String: Entry] = [:]
        var providers: [String: ProviderSection] = [:]
        var providerOrder: [String] = []
        var etcd: [String: Entry] = [:]
    }

    /// Reads the sections of one file into `merged`, checking section names and
    /// keys; values are checked once every file is merged.
    static func scan(_ text: String, file: String, into merged: inout MergedSections) throws(VaultError) {
        enum Section {
            case none
            case vault
            case provider(String)
            case account(Account)
            case etcd
        }
        var section = Section.none
        var seenProviders: Set<String> = []
        var seenKeys: Set<String> = []

        func fail(_ line: Int, _ message: String) -> VaultError {
            VaultError(.invalidConfig, "\(file):\(line): \(message)")
        }

        var lineNumber = 0
        // Split on LF bytes: Swift reads CR LF as one Character, which is not "\n".
        for rawLine in text.utf8.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            // A NUL would cut a value short where it becomes a C string (an
            // exec argv, a URL for libcurl); no control character but a tab
            // (and the CR of a CR LF) has a use in this file, comments included.
            let content = rawLine.last == 0x0D ? rawLine.dropLast() : rawLine[...]
            if content.contains(where: { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }) {
                throw fail(lineNumber, "control character in the line; only tabs and spaces may separate words")
            }
            let line = LoginCredential.trimmed(String(decoding: rawLine, as: UTF8.self))
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { throw fail(lineNumber, "section header without closing ']'") }
                seenKeys = []
                let header = String(line.dropFirst().dropLast())
                if header == "Vault" {
                    section = .vault
                } else if header == "Etcd" {
                    section = .etcd
                } else if header.hasPrefix("Provider ") {
                    let name = LoginCredential.trimmed(String(header.dropFirst("Provider ".count)))
                    guard (try? Account.validate(provider: name, user: "-")) != nil, !name.contains(" ") else {
                        throw fail(
                            lineNumber,
                            "bad provider name in [Provider NAME]: expected 1 to 256 bytes, no spaces or control characters"
                        )
                    }
                    guard seenProviders.insert(name).inserted else {
                        throw fail(lineNumber, "provider '\(name)' is defined twice")
                    }
                    if merged.providers[name] == nil {
                        merged.providers[name] = ProviderSection(file: file, line: lineNumber)
                        merged.providerOrder.append(name)
                    }
                    section = .provider(name)
                } else if header.hasPrefix("Account ") {
                    let words = header.split(separator: " ").map(String.init)
                    guard words.count == 3, let account = try? Account.validate(provider: words[1], user: words[2])
                    else {
                        throw fail(
                            lineNumber,
                            "bad [Account PROVIDER USER] header: expected a provider and a user, without control characters"
                        )
                    }
                    guard seenProviders.insert("account \(words[1]) \(words[2])").inserted else {
                        throw fail(lineNumber, "account '\(words[2]) @ \(words[1])' is defined twice")
                    }
                    if merged.accounts[account] == nil { merged.accounts[account] = [:] }
                    section = .account(account)
                } else {
                    throw fail(
                        lineNumber,
                        "unknown section (expected [Vault], [Etcd], [Provider NAME] or [Account PROVIDER USER])")
                }
                continue
            }
            guard let equals = line.firstIndex(of: "=") else {
                throw fail(lineNumber, "expected a Key=value line, a [Section] header or a # comment")
            }
            let rawKey = LoginCredential.trimmed(String(line[..<equals]))
            // Known keys are named; an unknown one only when it looks like a key,
            // since this text may be anything (a secret, another file).
            let key = looksLikeKey(rawKey) ? rawKey : "(not a key name)"
            let entry = Entry(
                value: LoginCredential.trimmed(String(line[line.index(after: equals)...])), file: file, line: lineNumber
            )
            switch section {
            case .none:
                throw fail(lineNumber, "key '\(key)' outside of any section")
            case .vault:
                guard vaultKeys.contains(key) else {
                    throw fail(
                        lineNumber, "unknown key '\(key)' in [Vault] (known: \(vaultKeys.joined(separator: ", ")))")
                }
                guard seenKeys.insert(key).inserted else { throw fail(lineNumber, "key '\(key)' set twice in [Vault]") }
                merged.vault[key] = entry
            case .provider(let name):
                guard providerKeys.contains(key) else {
                    throw fail(
                        lineNumber,
                        "unknown key '\(key)' in [Provider \(name)] (known: \(providerKeys.joined(separator: ", ")))")
                }
                guard seenKeys.insert(key).inserted else {
                    throw fail(lineNumber, "key '\(key)' set twice in [Provider \(name)]")
                }
                merged.providers[name]!.entries[key] = entry
            case .account(let account):
                guard accountKeys.contains(key) else {
                    throw fail(
                        lineNumber,
                        "unknown key '\(key)' in [Account \(account.provider) \(account.user)] (known: \(accountKeys.joined(separator: ", ")))"
                    )
                }
                guard seenKeys.insert(key).inserted else {
                    throw fail(lineNumber, "key '\(key)' set twice in [Account \(account.provider) \(account.user)]")
                }
                merged.accounts[account]![key] = entry
            case .etcd:
                guard etcdKeys.contains(key) else {
                    throw fail(
                        lineNumber, "unknown key '\(key)' in [Etcd] (known: \(etcdKeys.joined(separator: ", ")))")
                }
                guard seenKeys.insert(key).inserted else { throw fail(lineNumber, "key '\(key)' set twice in [Etcd]") }
                merged.etcd[key] = entry
            }
        }
    }

    /// A key name worth quoting in an error: ASCII letters, digits and '_', at most 64.
    static func looksLikeKey(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= 64
            && text.utf8.allSatisfy {
                $0 == UInt8(ascii: "_") || (($0 | 0x20) >= 97 && ($0 | 0x20) <= 122) || ($0 >= 48 && $0 <= 57)
            }
    }

    static var typeNames: String { ProviderType.allCases.map(\.rawValue).joined(separator: ", ") }
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

/// What vaultd checks of a provider's endpoint URLs.
public enum ProviderURL {
    /// True when `url` is `http://` to a loopback host: `localhost`, an IPv4
    /// address in 127.0.0.0/8 written as four decimal numbers, or `[::1]`.
    /// Anything else (another host, a user part hiding the host, a number
    /// written in another form) is not loopback.
    public static func isLoopbackHTTP(_ url: String) -> Bool {
        guard url.hasPrefix("http://") else { return false }
        let rest = url.dropFirst("http://".count)
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }
        // A user part ("user@host") names no host of its own; whatever follows the last @ is the host.
        let hostAndPort = authority.split(separator: "@", omittingEmptySubsequences: false).last ?? ""
        let host: Substring
        if hostAndPort.hasPrefix("[") {
            guard let close = hostAndPort.firstIndex(of: "]") else { return false }
            host = hostAndPort[hostAndPort.index(after: hostAndPort.startIndex)..<close]
            let after = hostAndPort[hostAndPort.index(after: close)...]
            guard after.isEmpty || after.hasPrefix(":") else { return false }
            return host == "::1" || host == "0:0:0:0:0:0:0:1"
        }
        let parts = hostAndPort.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count <= 2, let first = parts.first else { return false }
        host = first
        if host.lowercased() == "localhost" { return true }
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        guard octets.count == 4 else { return false }
        let numbers = octets.compactMap { octet -> Int? in
            guard (1...3).contains(octet.count), octet.allSatisfy({ $0.isASCII && $0.isNumber }) else { return nil }
            return Int(octet)
        }
        return numbers.count == 4 && numbers[0] == 127 && numbers.allSatisfy { $0 <= 255 }
    }
}

extension ProviderConfig {
    /// `DefaultLifetime=` of the provider (oauth2 or exec), when its section
    /// sets it: the lifetime assumed for a token handed out without an
    /// expiry. Nil: such a token is taken as never expiring.
    public var defaultLifetime: Int64? { oauth2?.defaultLifetime ?? exec?.defaultLifetime }
}
