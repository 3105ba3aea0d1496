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

        /// The seeds' error code for this kind, as the SDKs report it.
        public var seedCode: String {
            switch self {
            case .notLoggedIn: return "ERR_NOT_LOGGED_IN"
            case .loginInProgress: return "ERR_LOGIN_IN_PROGRESS"
            case .unknownProvider: return "ERR_PROVIDER_NOT_FOUND"
            case .invalidCredential: return "AUTH_ERR_AUTH_TOKEN_NOT_FOUND"
            case .tokenExpired: return "ERR_TOKEN_EXPIRED"
            case .userDeactivated: return "ERR_USER_DEACTIVATED"
            case .uidNotFound: return "ERR_UID_NOT_FOUND"
            case .accessDenied: return "ERR_ACCESS_DENIED"
            case .storeUnavailable: return "ERR_SECRET_STORE_UNAVAILABLE"
            case .storeLocked: return "ERR_SECRET_STORE_LOCKED"
            case .storeFailed: return "ERR_SECRET_STORE_FAILED"
            case .invalidParameter: return "ERR_INVALID_PARAMETER"
            case .networkError: return "ERR_NETWORK_ERROR"
            case .invalidConfig: return "ERR_INVALID_CONFIG"
            case .subscriberTooSlow: return "ERR_SUBSCRIBER_TOO_SLOW"
            case .tooManySubscriptions: return "ERR_TOO_MANY_SUBSCRIPTIONS"
            case .tooManySessions: return "ERR_TOO_MANY_SESSIONS"
            case .sessionTooLarge: return "ERR_SESSION_TOO_LARGE"
            case .refreshTooSoon: return "ERR_REFRESH_TOO_SOON"
            case .tooManyConnections: return "ERR_TOO_MANY_CONNECTIONS"
            case .replyTooLarge: return "ERR_REPLY_TOO_LARGE"
            case .internalError: return "ERR_INTERNAL"
            }
        }

        /// The code's Varlink error name suffix in `io.vaultd.Vault`.
        public var varlinkErrorName: String {
            switch self {
            case .notLoggedIn: return "NotLoggedIn"
            case .loginInProgress: return "LoginInProgress"
            case .unknownProvider: return "UnknownProvider"
            case .invalidCredential: return "InvalidCredential"
            case .tokenExpired: return "TokenExpired"
            case .userDeactivated: return "UserDeactivated"
            case .uidNotFound: return "UidNotFound"
            case .accessDenied: return "AccessDenied"
            case .storeUnavailable: return "StoreUnavailable"
            case .storeLocked: return "StoreLocked"
            case .storeFailed: return "StoreFailed"
            case .invalidParameter: return "InvalidParameter"
            case .networkError: return "NetworkError"
            case .invalidConfig: return "InvalidConfig"
            case .subscriberTooSlow: return "SubscriberTooSlow"
            case .tooManySubscriptions: return "TooManySubscriptions"
            case .tooManySessions: return "TooManySessions"
            case .sessionTooLarge: return "SessionTooLarge"
            case .refreshTooSoon: return "RefreshTooSoon"
            case .tooManyConnections: return "TooManyConnections"
            case .replyTooLarge: return "ReplyTooLarge"
            case .internalError: return "InternalError"
            }
        }

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

    /// Makes an error of `code` with a human `message`.
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    /// Errors are equal when their codes are; the message is for humans.
    public static func == (lhs: VaultError, rhs: VaultError) -> Bool { lhs.code == rhs.code }

    public var description: String { "\(code.seedCode): \(message)" }
}

extension VaultError {
    /// The account is not logged in.
    public static func notLoggedIn(_ account: Account) -> VaultError {
        VaultError(
            .notLoggedIn,
            "\(account) is not logged in; log in with 'vaultctl login \(account.provider) \(account.user)'")
    }

    /// The provider is not in the configuration.
    public static func unknownProvider(_ name: String) -> VaultError {
        VaultError(
            .unknownProvider,
            "provider '\(name)' is not configured; add a [Provider \(name)] section to vaultd.conf")
    }
}
