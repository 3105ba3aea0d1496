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

/// How the client authenticates at the token and revocation endpoints
/// (`TokenEndpointAuthMethod=`, RFC 7591's names for RFC 6749 section 2.3.1).
public enum TokenEndpointAuthMethod: String, Sendable, CaseIterable {
    /// The client id and secret, each form-urlencoded, in an `Authorization: Basic` header.
    case clientSecretBasic = "client_secret_basic"
    /// `client_id` and `client_secret` in the request body.
    case clientSecretPost = "client_secret_post"
    /// A public client: `client_id` in the body, no secret.
    case none
    /// A JWT the client signs with its private key (`JWTKeyFile=`), as
    /// `client_assertion` in the body (RFC 7523 section 2.2): no secret.
    case privateKeyJWT = "private_key_jwt"

    /// The method used when `TokenEndpointAuthMethod=` is not set:
    /// `client_secret_basic` when the provider has a client secret
    /// (`ClientSecretFile=` or `vaultctl provider-secret`), `none` otherwise.
    public static func defaultMethod(hasSecret: Bool) -> TokenEndpointAuthMethod {
        hasSecret ? .clientSecretBasic : .none
    }

    /// True when the method sends the client secret.
    public var usesSecret: Bool { self == .clientSecretBasic || self == .clientSecretPost }
}

/// How an `oauth2` provider obtains tokens without a user's login
/// (`Grant=`): for `vaultctl login --from-provider` and `AutoLogin=yes`.
public enum OAuth2Grant: String, Sendable, CaseIterable {
    /// `grant_type=client_credentials` (RFC 6749 section 4.4): the client's own token.
    case clientCredentials = "client-credentials"
    /// The JWT bearer grant (RFC 7523 section 2.1): an assertion signed with
    /// `JWTKeyFile=` whose subject is the session's user.
    case jwtBearer = "jwt-bearer"
}

/// The settings of an `oauth2` provider.
public struct OAuth2Settings: Sendable, Equatable {
    /// The token endpoint (`grant_type=refresh_token`, `client_credentials`).
    public var tokenURL: String
    /// The client id sent with every request.
    public var clientID: String
    /// The RFC 7009 revocation endpoint, used at logout.
    public var revocationURL: String?
    /// `DeviceAuthorizationURL=`: the RFC 8628 device authorization endpoint
    /// of `vaultctl login --device`.
    public var deviceAuthorizationURL: String?
    /// `AuthorizationURL=`: the authorization endpoint (RFC 6749 section
    /// 3.1) a browser login opens (`vaultctl login --browser`).
    public var authorizationURL: String?
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
    /// `TokenEndpointAuthMethod=`, when set; nil: the default by whether
    /// there is a secret (`TokenEndpointAuthMethod.defaultMethod(hasSecret:)`).
    public var tokenEndpointAuthMethod: TokenEndpointAuthMethod?
    /// `Grant=`: how tokens are obtained without a user's login.
    public var grant: OAuth2Grant = .clientCredentials
    /// `JWTKeyFile=`: a PEM private key (RSA or EC P-256) that signs the JWT
    /// bearer grant's assertions and `private_key_jwt` client assertions; a
    /// relative path is taken in `$CREDENTIALS_DIRECTORY`. Never the key itself.
    public var jwtKeyFile: String?
    /// `JWTIssuer=`: the JWT bearer assertion's `iss`, when not the client id.
    public var jwtIssuer: String?
    /// `JWTAudience=`: the JWT bearer assertion's `aud`, when not the token URL's origin.
    public var jwtAudience: String?
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

    /// The JWT bearer assertion's issuer: `JWTIssuer=`, else the client id.
    public var assertionIssuer: String { jwtIssuer ?? clientID }

    /// The JWT bearer assertion's audience: `JWTAudience=`, else the token
    /// URL's origin (`https://login.example.com` of `https://login.example.com/oauth/token`).
    public var assertionAudience: String { jwtAudience ?? ProviderURL.origin(tokenURL) }
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

extension ProviderConfig {
    /// `DefaultLifetime=` of the provider (oauth2 or exec), when its section
    /// sets it: the lifetime assumed for a token handed out without an
    /// expiry. Nil: such a token is taken as never expiring.
    public var defaultLifetime: Int64? { oauth2?.defaultLifetime ?? exec?.defaultLifetime }
}

/// What vaultd checks of a provider's endpoint URLs.
public enum ProviderURL {
    /// The scheme, host and port of `url`, without the path, query or
    /// fragment: `https://host:8443` of `https://host:8443/token?x`.
    public static func origin(_ url: String) -> String {
        for scheme in ["https://", "http://"] where url.hasPrefix(scheme) {
            let authority = url.dropFirst(scheme.count).prefix { $0 != "/" && $0 != "?" && $0 != "#" }
            return scheme + authority
        }
        return url
    }

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

extension ConfigParser {
    /// The keys `[Provider NAME]` accepts.
    static let providerKeys = [
        "Type", "Description", "SingleAccount", "TokenURL", "ClientID", "RevocationURL", "AuthorizationURL", "Scope",
        "DefaultLifetime",
        "MaxSessionLifetime", "ClientSecretFile", "TokenEndpointAuthMethod", "AllowInsecureHTTP", "Command", "Timeout",
        "MaxConcurrentHelpers", "Grant", "JWTKeyFile", "JWTIssuer", "JWTAudience",
        "MintUsers", "MintGroups", "DeviceAuthorizationURL",
    ]
    /// The keys only some types of provider take.
    static let typeKeys: [ProviderType: Set<String>] = [
        .exec: ["Command", "Timeout", "MaxConcurrentHelpers", "DefaultLifetime"],
        .oauth2: [
            "TokenURL", "ClientID", "RevocationURL", "Scope", "DefaultLifetime", "MaxSessionLifetime",
            "ClientSecretFile", "TokenEndpointAuthMethod", "AllowInsecureHTTP", "Timeout", "Grant", "JWTKeyFile",
            "JWTIssuer", "JWTAudience", "DeviceAuthorizationURL", "AuthorizationURL",
        ],
    ]

    /// The provider a merged `[Provider NAME]` section describes.
    static func providerConfig(_ name: String, _ section: ProviderSection) throws(VaultError) -> ProviderConfig {
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
        return provider
    }

    /// The settings of a `Type=oauth2` section: its endpoints, client and lifetimes.
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
        if let entry = section.entries["DeviceAuthorizationURL"] {
            settings.deviceAuthorizationURL = try url(entry, "DeviceAuthorizationURL")
        }
        if let entry = section.entries["AuthorizationURL"] {
            settings.authorizationURL = try url(entry, "AuthorizationURL")
        }
        settings.scope = section.entries["Scope"]?.value
        if let lifetime = try duration("DefaultLifetime") { settings.defaultLifetime = lifetime }
        settings.maxSessionLifetime = try duration("MaxSessionLifetime")
        settings.clientSecretFile = section.entries["ClientSecretFile"]?.value
        if let entry = section.entries["TokenEndpointAuthMethod"] {
            settings.tokenEndpointAuthMethod = try authMethod(entry)
        }
        try jwtSettings(name, section, into: &settings)
        settings.allowInsecureHTTP = allowInsecureHTTP
        if let timeout = section.entries["Timeout"] {
            settings.timeoutSeconds = try ConfigParser.timeout(timeout, key: "Timeout")
        }
        return settings
    }

    /// `TokenEndpointAuthMethod=`: one of RFC 7591's names vaultd speaks.
    static func authMethod(_ entry: Entry) throws(VaultError) -> TokenEndpointAuthMethod {
        let names = TokenEndpointAuthMethod.allCases.map(\.rawValue).joined(separator: ", ")
        guard let method = TokenEndpointAuthMethod(rawValue: entry.value) else {
            throw entry.error("key 'TokenEndpointAuthMethod': expected one of: \(names)")
        }
        return method
    }

    /// `Grant=`, `JWTKeyFile=`, `JWTIssuer=` and `JWTAudience=`: the key is
    /// required by the JWT bearer grant and by `private_key_jwt`, and taken
    /// by nothing else; the issuer and audience are the JWT bearer grant's.
    static func jwtSettings(
        _ name: String, _ section: ProviderSection, into settings: inout OAuth2Settings
    ) throws(VaultError) {
        if let entry = section.entries["Grant"] {
            guard let grant = OAuth2Grant(rawValue: entry.value) else {
                let names = OAuth2Grant.allCases.map(\.rawValue).joined(separator: ", ")
                throw entry.error("key 'Grant': expected one of: \(names)")
            }
            settings.grant = grant
        }
        let signsClient = settings.tokenEndpointAuthMethod == .privateKeyJWT
        let bearer = settings.grant == .jwtBearer
        if let entry = section.entries["JWTKeyFile"] {
            guard !entry.value.isEmpty else { throw entry.error("key 'JWTKeyFile': expected a file name") }
            guard signsClient || bearer else {
                throw entry.error(
                    "key 'JWTKeyFile': [Provider \(name)] signs nothing with it; it is for Grant=jwt-bearer or TokenEndpointAuthMethod=private_key_jwt"
                )
            }
            settings.jwtKeyFile = entry.value
        } else if signsClient || bearer {
            let user = bearer ? "Grant=jwt-bearer" : "TokenEndpointAuthMethod=private_key_jwt"
            throw VaultError(
                .invalidConfig,
                "\(section.file):\(section.line): [Provider \(name)] with \(user) needs JWTKeyFile= (a PEM private key, RSA or EC P-256)"
            )
        }
        for key in ["JWTIssuer", "JWTAudience"] {
            guard let entry = section.entries[key] else { continue }
            guard bearer else { throw entry.error("key '\(key)' is for Grant=jwt-bearer") }
            guard !entry.value.isEmpty, !entry.value.contains(" ") else {
                throw entry.error("key '\(key)': expected a value without spaces")
            }
            if key == "JWTIssuer" { settings.jwtIssuer = entry.value } else { settings.jwtAudience = entry.value }
        }
    }

    /// The settings of a `Type=exec` section: its helper program and how it runs.
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

    /// The provider types, for messages.
    static var typeNames: String { ProviderType.allCases.map(\.rawValue).joined(separator: ", ") }
}
