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

extension ConfigParser {
    /// The keys `[Account PROVIDER USER]` accepts.
    static let accountKeys =
        ["Owner", "TokenReadUsers", "TokenReadGroups", "AutoLogin", "ReloginAfterKick"] + tokenFileKeys

    /// The settings a merged `[Account PROVIDER USER]` section declares.
    static func accountSettings(_ account: Account, _ entries: [String: Entry]) throws(VaultError) -> AccountSettings {
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
        return settings
    }

    /// `AutoLogin=yes` only for providers that log in without a user: oauth2
    /// (client credentials, or `Grant=jwt-bearer`) and exec (the helper's own
    /// credential).
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
                    "key 'AutoLogin': [Provider \(account.provider)] is Type=\(provider.type.rawValue), which cannot log in without a user; AutoLogin=yes needs Type=oauth2 (client credentials, or Grant=jwt-bearer) or Type=exec (the helper's own credential)"
                )
            }
        }
    }

}
