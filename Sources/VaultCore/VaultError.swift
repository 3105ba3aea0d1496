/// An error of vaultd's domain: a stable code, a human message that says what
/// happened and what to do, and never a secret.
public struct VaultError: Error, Sendable, Equatable, CustomStringConvertible {
    /// The stable, machine-readable kinds of failure.
    public enum Code: String, Sendable, CaseIterable {
        case notLoggedIn
        case loginInProgress
        case unknownProvider
        case invalidCredential
        case tokenExpired
        case userDeactivated
        case uidNotFound
        case accessDenied
        case storeUnavailable
        case storeLocked
        case storeFailed
        case invalidParameter
        case networkError
        case invalidConfig
        case subscriberTooSlow
        case tooManySubscriptions
        case tooManySessions
        case sessionTooLarge
        case refreshTooSoon
        case tooManyConnections
        case replyTooLarge
        case internalError
        case tooManyClients
        case helperUnavailable
        case loginBackingOff
        case refreshBackingOff
        case tooManyProviderRequests
        case tooManyRevocations
        case invalidClient
        case grantRevoked
        case cannotRefresh
        case loginDenied
        case loginExpired
        case authorizationFailed

        /// How a kind of failure is named on the wire and by the SDKs, and what
        /// it means: the `io.vaultd.Vault` error's name and doc comment, and
        /// the seed-style code its replies carry.
        public struct Declaration: Sendable, Equatable {
            /// The Varlink error name's suffix in `io.vaultd.Vault` (`NotLoggedIn`).
            public var varlinkName: String
            /// The seeds' error code, as the SDKs report it (`ERR_NOT_LOGGED_IN`).
            public var seedCode: String
            /// The error's doc comment in the interface definition.
            public var doc: String
            /// The error carries `retryAt`, the time the call may be tried again.
            public var retryAt = false

            init(varlinkName: String, seedCode: String, doc: String, retryAt: Bool = false) {
                self.varlinkName = varlinkName
                self.seedCode = seedCode
                self.doc = doc
                self.retryAt = retryAt
            }
        }

        /// The one table of names: every code's Varlink name, seed code and doc.
        /// The interface definition's errors derive from it.
        public var declaration: Declaration {
            switch self {
            case .notLoggedIn:
                return Declaration(
                    varlinkName: "NotLoggedIn", seedCode: "ERR_NOT_LOGGED_IN",
                    doc: "The account is not logged in (ERR_NOT_LOGGED_IN).")
            case .loginInProgress:
                return Declaration(
                    varlinkName: "LoginInProgress", seedCode: "ERR_LOGIN_IN_PROGRESS",
                    doc: "A login of the account is already in progress.")
            case .unknownProvider:
                return Declaration(
                    varlinkName: "UnknownProvider", seedCode: "ERR_PROVIDER_NOT_FOUND",
                    doc: "The provider is not defined in vaultd.conf.")
            case .invalidCredential:
                return Declaration(
                    varlinkName: "InvalidCredential", seedCode: "AUTH_ERR_AUTH_TOKEN_NOT_FOUND",
                    doc: "The token is missing, empty or malformed (AUTH_ERR_AUTH_TOKEN_NOT_FOUND).")
            case .tokenExpired:
                return Declaration(
                    varlinkName: "TokenExpired", seedCode: "ERR_TOKEN_EXPIRED",
                    doc: "The token has expired, or would before minValidSeconds.")
            case .userDeactivated:
                return Declaration(
                    varlinkName: "UserDeactivated", seedCode: "ERR_USER_DEACTIVATED",
                    doc: "The user is deactivated at the provider (ERR_USER_DEACTIVATED).")
            case .uidNotFound:
                return Declaration(
                    varlinkName: "UidNotFound", seedCode: "ERR_UID_NOT_FOUND",
                    doc: "The user id is unknown at the provider (ERR_UID_NOT_FOUND).")
            case .accessDenied:
                return Declaration(
                    varlinkName: "AccessDenied", seedCode: "ERR_ACCESS_DENIED",
                    doc: "The caller may not use this account.")
            case .storeUnavailable:
                return Declaration(
                    varlinkName: "StoreUnavailable", seedCode: "ERR_SECRET_STORE_UNAVAILABLE",
                    doc: "The secret store cannot be reached.")
            case .storeLocked:
                return Declaration(
                    varlinkName: "StoreLocked", seedCode: "ERR_SECRET_STORE_LOCKED",
                    doc: "The secret store's collection is locked.")
            case .storeFailed:
                return Declaration(
                    varlinkName: "StoreFailed", seedCode: "ERR_SECRET_STORE_FAILED",
                    doc: "The secret store refused or failed a read or write.")
            case .invalidParameter:
                return Declaration(
                    varlinkName: "InvalidParameter", seedCode: "ERR_INVALID_PARAMETER",
                    doc: "A parameter has a bad value.")
            case .networkError:
                return Declaration(
                    varlinkName: "NetworkError", seedCode: "ERR_NETWORK_ERROR",
                    doc: "The provider could not be reached (ERR_NETWORK_ERROR).")
            case .invalidConfig:
                return Declaration(
                    varlinkName: "InvalidConfig", seedCode: "ERR_INVALID_CONFIG",
                    doc: "The configuration is invalid.")
            case .subscriberTooSlow:
                return Declaration(
                    varlinkName: "SubscriberTooSlow", seedCode: "ERR_SUBSCRIBER_TOO_SLOW",
                    doc: "The subscriber did not read its events fast enough and was dropped.")
            case .tooManySubscriptions:
                return Declaration(
                    varlinkName: "TooManySubscriptions", seedCode: "ERR_TOO_MANY_SUBSCRIPTIONS",
                    doc: """
                        The caller's user has as many Subscribe streams open as vaultd allows one
                        user (root is not limited).
                        """)
            case .tooManySessions:
                return Declaration(
                    varlinkName: "TooManySessions", seedCode: "ERR_TOO_MANY_SESSIONS",
                    doc: """
                        The session's owner holds as many sessions as vaultd allows one user
                        (MaxSessionsPerUser=; root is not limited).
                        """)
            case .sessionTooLarge:
                return Declaration(
                    varlinkName: "SessionTooLarge", seedCode: "ERR_SESSION_TOO_LARGE",
                    doc: "The session record (tokens and profile) is larger than MaxSessionSize=.")
            case .refreshTooSoon:
                return Declaration(
                    varlinkName: "RefreshTooSoon", seedCode: "ERR_REFRESH_TOO_SOON",
                    doc: """
                        The session's tokens were refreshed (or a refresh was tried) less than
                        MinRefreshInterval= ago and are still valid: no refresh was started before
                        retryAt.
                        """,
                    retryAt: true)
            case .tooManyConnections:
                return Declaration(
                    varlinkName: "TooManyConnections", seedCode: "ERR_TOO_MANY_CONNECTIONS",
                    doc: """
                        The caller's user holds as many connections as vaultd allows one user
                        (MaxConnectionsPerUser=), or vaultd serves as many as it may; sent as the only
                        reply before the connection is closed.
                        """)
            case .replyTooLarge:
                return Declaration(
                    varlinkName: "ReplyTooLarge", seedCode: "ERR_REPLY_TOO_LARGE",
                    doc: """
                        The reply would take more than the connection may have queued
                        (MaxOutputPerConnection=): read replies before sending more calls, or ask for
                        less (a smaller limit to ListSessions, a narrower Subscribe).
                        """)
            case .internalError:
                return Declaration(
                    varlinkName: "InternalError", seedCode: "ERR_INTERNAL",
                    doc: "vaultd failed in a way it did not expect.")
            case .tooManyClients:
                return Declaration(
                    varlinkName: "TooManyClients", seedCode: "ERR_TOO_MANY_CLIENTS",
                    doc: """
                        As many clients report their connection for the session as vaultd lists for one
                        (64); a report goes away when its client's connection to vaultd closes.
                        """)
            case .helperUnavailable:
                return Declaration(
                    varlinkName: "HelperUnavailable", seedCode: "ERR_HELPER_UNAVAILABLE",
                    doc: """
                        The exec provider's helper program (Command=) is missing or cannot be run
                        (not executable, a bad interpreter line): install it or fix Command=, then
                        reload vaultd. A refresh is retried with backoff meanwhile.
                        """)
            case .loginBackingOff:
                return Declaration(
                    varlinkName: "LoginBackingOff", seedCode: "ERR_LOGIN_BACKING_OFF",
                    doc: """
                        A login of the account that asks the provider failed lately, and no such login
                        starts before the backoff ends (the message names when; status shows
                        nextRetryAt). Every caller, and vaultd's own AutoLogin=, waits out the same
                        backoff.
                        """)
            case .refreshBackingOff:
                return Declaration(
                    varlinkName: "RefreshBackingOff", seedCode: "ERR_REFRESH_BACKING_OFF",
                    doc: """
                        The session's last refresh failed, and no refresh a client asks for is sent
                        before its backoff (or the server's Retry-After) ends at retryAt; the current
                        token is still served.
                        """,
                    retryAt: true)
            case .tooManyProviderRequests:
                return Declaration(
                    varlinkName: "TooManyProviderRequests", seedCode: "ERR_TOO_MANY_PROVIDER_REQUESTS",
                    doc: """
                        The caller's user made as many provider requests (logins that ask the provider,
                        refreshes, revocations) as vaultd allows one user (ProviderRequestsPerMinute=,
                        ProviderRequestBurst=; root and the admin group are not limited): nothing was
                        sent; try again from retryAt on.
                        """,
                    retryAt: true)
            case .invalidClient:
                return Declaration(
                    varlinkName: "InvalidClient", seedCode: "ERR_INVALID_CLIENT",
                    doc: """
                        The provider refused vaultd's own credentials for it: OAuth 2.0's
                        invalid_client or unauthorized_client, a 401 or 403 of the token endpoint, an
                        exec helper's wrong API key (CometChat's AUTH_ERR_APIKEY_NOT_FOUND). Fix the
                        client secret (vaultctl provider-secret) or the helper's settings.
                        """)
            case .grantRevoked:
                return Declaration(
                    varlinkName: "GrantRevoked", seedCode: "ERR_GRANT_REVOKED",
                    doc: """
                        The provider no longer honours the session's grant (OAuth 2.0's
                        invalid_grant: a refresh token revoked, expired or used twice): log in again.
                        """)
            case .cannotRefresh:
                return Declaration(
                    varlinkName: "CannotRefresh", seedCode: "ERR_CANNOT_REFRESH",
                    doc: """
                        The session cannot be refreshed: its provider has no way to (a static
                        provider) or it holds no refresh token. Log in again for new tokens.
                        """)
            case .loginDenied:
                return Declaration(
                    varlinkName: "LoginDenied", seedCode: "ERR_LOGIN_DENIED",
                    doc: """
                        The user refused the login at the provider (OAuth 2.0's access_denied, as
                        the device flow's token endpoint answers it): nothing was logged in.
                        """)
            case .loginExpired:
                return Declaration(
                    varlinkName: "LoginExpired", seedCode: "ERR_LOGIN_EXPIRED",
                    doc: """
                        The interactive login (device or browser) is over before it was finished:
                        vaultd holds no pending login of that id for the caller (it finished,
                        expired, vaultd restarted, or it is another user's), or the device code
                        expired (OAuth 2.0's expired_token, or its expires_in passed). Start the
                        login again.
                        """)
            case .authorizationFailed:
                return Declaration(
                    varlinkName: "AuthorizationFailed", seedCode: "ERR_AUTHORIZATION_FAILED",
                    doc: """
                        A browser login brought no authorization: the authorization server redirected
                        with an error (access_denied when the user declined; its code is providerCode),
                        or the redirect's state was not the login's (a redirect of another login, or a
                        forged one). Nothing was sent to the token endpoint; log in again.
                        """)
            case .tooManyRevocations:
                return Declaration(
                    varlinkName: "TooManyRevocations", seedCode: "ERR_TOO_MANY_REVOCATIONS",
                    doc: """
                        The owner's sessions and the revocations of its ended sessions that the provider
                        has not accepted yet would be more than MaxSessionsPerUser= (of MaxSessionSize=
                        bytes each): the login is refused until the provider takes some; a logout is
                        never refused.
                        """)
            }
        }

        /// The seeds' error code for this kind, as the SDKs report it.
        public var seedCode: String { declaration.seedCode }

        /// The code's Varlink error name suffix in `io.vaultd.Vault`.
        public var varlinkErrorName: String { declaration.varlinkName }

        /// Finds the code for a seed-style code string.
        public init?(seedCode: String) {
            guard let code = Code.allCases.first(where: { $0.seedCode == seedCode }) else { return nil }
            self = code
        }
    }

    /// What kind of failure this is.
    public var code: Code
    /// What happened and what to do, for a human. Never holds a secret.
    public var message: String
    /// The code the provider answered, as it wrote it (OAuth 2.0's
    /// `invalid_grant`, an exec helper's `AUTH_ERR_APIKEY_NOT_FOUND`), beside
    /// vaultd's own `code`: every surface (replies, events, `GetSession`,
    /// vaultctl, the clients) carries the same pair. Nil for vaultd's own
    /// errors, and when the provider's code is vaultd's.
    public var providerCode: String?
    /// What the provider said of the failure, masked (`Redactor`); nil for
    /// vaultd's own errors.
    public var providerMessage: String?
    /// When the call may be tried again, for the codes that say
    /// (`Declaration.retryAt`): the reply's `retryAt`, in Unix seconds.
    public var retryAt: UnixTime?

    /// Makes an error of `code` with a human `message`.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// Makes an error of `code` that carries the provider's own code and message.
    public init(_ code: Code, _ message: String, providerCode: String?, providerMessage: String? = nil) {
        self.init(code, message)
        self.providerCode = providerCode
        self.providerMessage = providerMessage
    }

    /// Errors are equal when their codes are; the message is for humans.
    public static func == (lhs: VaultError, rhs: VaultError) -> Bool { lhs.code == rhs.code }

    public var description: String {
        "\(code.seedCode): \(message)" + (providerCode.map { " (provider: \($0))" } ?? "")
    }
}

extension VaultError {
    /// The account is not logged in.
    public static func notLoggedIn(_ account: Account) -> VaultError {
        VaultError(
            .notLoggedIn,
            "\(account) is not logged in; log in with 'vaultctl login \(account.provider) \(account.user)'")
    }

    /// The provider is not in the configuration; the message names the
    /// files `config` was read from (its `sources`), or the files looked for
    /// when none was found, so the user knows where to add the section.
    public static func unknownProvider(_ name: String, in config: VaultConfig? = nil) -> VaultError {
        let section = "[Provider \(name)]"
        var message = "provider '\(name)' is not configured"
        if let config, !config.sources.isEmpty {
            message += "; add a \(section) section to one of: \(config.sources.joined(separator: ", "))"
            // The last file looked for is the user's own: name it when it is not there yet.
            if let own = config.searchedFiles.last, !config.sources.contains(own) {
                message += " (or create \(own))"
            }
        } else if let config, !config.searchedFiles.isEmpty {
            message +=
                "; no configuration file was found, so only the built-in provider 'demo' exists; create \(config.searchedFiles.joined(separator: " or ")) with a \(section) section"
        } else {
            message += "; add a \(section) section to vaultd.conf"
        }
        return VaultError(.unknownProvider, message)
    }
}
