import Glibc
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// An error reply from vaultd, as the wire carries it: the Varlink error name,
/// the seed-style code and the message (vaultd's own errors carry both; the
/// `org.varlink.service` ones carry their parameter instead).
public struct VarlinkErrorReply: Sendable, Equatable, CustomStringConvertible {
    /// The full Varlink error name: `io.vaultd.Vault.NotLoggedIn`.
    public var name: String
    /// vaultd's code (`ERR_NOT_LOGGED_IN`); nil for `org.varlink.service` errors.
    public var code: String?
    /// What happened, for a human.
    public var message: String
    /// The provider's own code for the failure (`invalid_grant`,
    /// `AUTH_ERR_APIKEY_NOT_FOUND`), when it named one.
    public var providerCode: String?
    /// What the provider said of the failure, masked.
    public var providerMessage: String?
    /// The reply's parameters as they came.
    public var parameters: [String: JSON]

    /// The error of `reply`; nil when it is not an error.
    public init?(_ reply: VarlinkReply) {
        guard let name = reply.error else { return nil }
        self.name = name
        parameters = reply.parameters
        code = reply.parameters["code"]?.stringValue
        providerCode = reply.parameters["providerCode"]?.stringValue
        providerMessage = reply.parameters["providerMessage"]?.stringValue
        if let message = reply.parameters["message"]?.stringValue {
            self.message = message
        } else if let parameter = reply.parameters["parameter"]?.stringValue {
            self.message = "invalid parameter '\(parameter)'"
        } else {
            self.message = name
        }
    }

    /// vaultd's error code, when this is one of `io.vaultd.Vault`'s errors.
    public var vaultCode: VaultError.Code? {
        VaultError(reply: VarlinkReply(error: name, parameters: parameters))?.code
    }

    /// The message and the codes, as vaultctl prints them:
    /// `message (CODE)`, or `message (CODE; provider: PROVIDER_CODE)`.
    public var description: String {
        "\(message) (\(code ?? name)\(providerCode.map { "; provider: \($0)" } ?? ""))"
    }
}

/// Why a typed call of `io.vaultd.Vault` failed.
public enum VaultClientError: Error, Sendable, Equatable, CustomStringConvertible {
    /// vaultd answered with an error.
    case reply(VarlinkErrorReply)
    /// No answer: vaultd is not reachable, not trusted, too slow, or the connection broke.
    case client(ClientError)
    /// vaultd answered with something the interface does not declare.
    case unexpectedReply(method: String, detail: String)

    /// The Varlink error name of an error reply.
    public var varlinkName: String? {
        if case .reply(let reply) = self { return reply.name }
        return nil
    }

    /// The seed-style code of an error reply (`ERR_NOT_LOGGED_IN`).
    public var code: String? {
        if case .reply(let reply) = self { return reply.code }
        return nil
    }

    /// What happened, for a human.
    public var message: String {
        switch self {
        case .reply(let reply): return reply.message
        case .client(let error): return error.description
        case .unexpectedReply(let method, let detail): return "vaultd answered \(method) with \(detail)"
        }
    }

    /// vaultd's error code, when vaultd answered with one of its errors.
    public var vaultCode: VaultError.Code? {
        if case .reply(let reply) = self { return reply.vaultCode }
        return nil
    }

    public var description: String {
        if case .reply(let reply) = self { return reply.description }
        return message
    }
}

/// A session as vaultd shows it (`io.vaultd.Vault` type `Session`). Never
/// holds a secret: `maskedToken` is masked by vaultd.
public struct Session: Sendable, Equatable {
    public var account: Account
    public var state: LoginState
    public var profile: UserProfile?
    public var createdAt: UnixTime?
    public var expiresAt: UnixTime?
    /// Whose session it is.
    public var ownerUID: UInt32?
    public var tokenType: String?
    public var scope: String?
    /// Salesforce's instance URL: where API calls for this session go.
    public var instanceURL: String?
    public var hasRefreshToken: Bool
    /// The access token as vaultd shows it: masked.
    public var maskedToken: String?
    /// When the next refresh is due (refreshing providers).
    public var refreshAt: UnixTime?
    public var lastRefreshAt: UnixTime?
    /// Refresh failures since the last success.
    public var consecutiveFailures: Int64?
    public var lastError: String?
    public var nextRetryAt: UnixTime?
    /// connecting, connected or connectFailed (providers with a connection).
    public var connection: String?
    /// The code of the last failure, where known (failed logins: the session
    /// is then in state `logout`, and `nextRetryAt` says when a login that
    /// asks the provider is allowed again).
    public var lastErrorCode: String?
    /// The clients that report their own connection to the chat server.
    public var clients: [ClientReport] = []
    /// The session object as vaultd sent it, fields this client does not know included.
    public var json: JSON

    /// Reads a session object; nil names the field that is missing or malformed.
    init(json: JSON) throws(FieldError) {
        guard let o = json.objectValue else { throw FieldError("session") }
        let p = ParameterReader(o)
        do {
            account = Account(provider: try p.string("provider"), user: try p.string("user"))
            guard let state = LoginState(rawValue: try p.string("state")) else { throw FieldError("state") }
            self.state = state
            if let profile = try p.optionalObject("profile") {
                do { self.profile = try UserProfile(json: profile) } catch { throw FieldError("profile") }
            }
            createdAt = try p.optionalInt("createdAt").map(UnixTime.init(seconds:))
            expiresAt = try p.optionalInt("expiresAt").map(UnixTime.init(seconds:))
            ownerUID = try p.optionalUID("ownerUid")
            tokenType = try p.optionalString("tokenType")
            scope = try p.optionalString("scope")
            instanceURL = try p.optionalString("instanceUrl")
            hasRefreshToken = o["hasRefreshToken"]?.boolValue ?? false
            maskedToken = try p.optionalString("token")
            refreshAt = try p.optionalInt("refreshAt").map(UnixTime.init(seconds:))
            lastRefreshAt = try p.optionalInt("lastRefreshAt").map(UnixTime.init(seconds:))
            consecutiveFailures = try p.optionalInt("consecutiveFailures")
            lastError = try p.optionalString("lastError")
            nextRetryAt = try p.optionalInt("nextRetryAt").map(UnixTime.init(seconds:))
            connection = try p.optionalString("connection")
            lastErrorCode = try p.optionalString("lastErrorCode")
            for item in o["clients"]?.arrayValue ?? [] {
                guard let c = item.objectValue else { throw FieldError("clients") }
                let r = ParameterReader(c)
                guard let state = ClientConnectionState(rawValue: try r.string("state")),
                    let pid = try r.optionalInt("pid").flatMap({ Int32(exactly: $0) }),
                    let since = try r.optionalInt("since")
                else { throw FieldError("clients") }
                // vaultd's connection id is its own business: 0 here.
                clients.append(
                    ClientReport(
                        connection: 0, name: try r.string("name"), pid: pid, state: state,
                        since: UnixTime(seconds: since)))
            }
        } catch let invalid as ParameterReader.Invalid {
            throw FieldError(invalid.parameter)
        } catch let error as FieldError {
            throw error
        } catch {
            throw FieldError("session")
        }
        self.json = json
    }
}

/// A field of a reply that is missing or of the wrong type.
struct FieldError: Error {
    var field: String
    init(_ field: String) { self.field = field }
}

/// The answer to `Login`.
public struct LoginResult: Sendable, Equatable {
    /// The session, new or the one already there.
    public var session: Session
    /// False when the account was already logged in and kept its session.
    public var created: Bool
    /// True when a login with `replace` replaced the tokens of a logged-in session.
    public var replaced: Bool = false

    /// What a `Login` reply says: `session`, and whether it was `created` or `replaced`.
    public init(session: Session, created: Bool, replaced: Bool = false) {
        (self.session, self.created, self.replaced) = (session, created, replaced)
    }
}

/// An access token from `GetToken`. The token is a `Secret`: printing it shows it masked.
public struct Token: Sendable, Equatable {
    public var value: Secret
    public var tokenType: String?
    public var expiresAt: UnixTime?
    /// Salesforce's instance URL: where API calls with this token go.
    public var instanceURL: String?
    /// Whose session the token came from.
    public var ownerUID: UInt32
    /// The OAuth 2.0 scope granted, when the provider said (nil from a vaultd that does not tell).
    public var scope: String? = nil
}

/// One page of `ListSessions`.
public struct SessionListPage: Sendable, Equatable {
    public var sessions: [Session]
    /// The cursor of the next page (pass it back as `after`); nil on the last.
    public var next: String?
    /// The store's state as vaultd sees it (`available`, `unavailable`,
    /// `locked`); nil from a vaultd that does not say.
    public var store: String?
}
