import Varlink
import VaultCore

/// Reads typed parameters out of a call, answering `InvalidParameter` with the
/// parameter's name when one is missing or of the wrong type.
public struct ParameterReader {
    /// The parameters of the call.
    public let parameters: VarlinkParameters

    /// Reads from a call's parameters.
    public init(_ parameters: VarlinkParameters) { self.parameters = parameters }

    /// Reads from the members of a JSON object.
    public init(_ object: [String: JSON]) { self.parameters = VarlinkParameters(object) }

    /// A parameter is missing or of the wrong type.
    public struct Invalid: Error, Equatable {
        /// The parameter's name.
        public var parameter: String

        /// The parameter `parameter` is missing or of the wrong type.
        public init(parameter: String) { self.parameter = parameter }
    }

    /// A required string.
    @inline(__always)
    public func string(_ name: String) throws(Invalid) -> String {
        guard let value = try optionalString(name) else { throw Invalid(parameter: name) }
        return value
    }

    /// An optional string; null counts as absent.
    @inline(__always)
    public func optionalString(_ name: String) throws(Invalid) -> String? {
        // Read in place: no copy of the member's value.
        guard let i = parameters.index(of: name) else { return nil }
        switch parameters.members[i].value {
        case .null: return nil
        case .string(let s): return s
        default: throw Invalid(parameter: name)
        }
    }

    /// An optional integer; null counts as absent.
    @inline(__always)
    public func optionalInt(_ name: String) throws(Invalid) -> Int64? {
        guard let i = parameters.index(of: name) else { return nil }
        switch parameters.members[i].value {
        case .null: return nil
        case .number(let d):
            guard let i = JSON.integer(d) else { throw Invalid(parameter: name) }
            return i
        default: throw Invalid(parameter: name)
        }
    }

    /// An optional boolean; null counts as absent.
    public func optionalBool(_ name: String) throws(Invalid) -> Bool? {
        switch parameters[name] {
        case nil, .null?: return nil
        case let value?:
            guard let b = value.boolValue else { throw Invalid(parameter: name) }
            return b
        }
    }

    /// An optional object; null counts as absent.
    public func optionalObject(_ name: String) throws(Invalid) -> JSON? {
        guard let value = parameters[name], value != .null else { return nil }
        guard case .object = value else { throw Invalid(parameter: name) }
        return value
    }

    /// An optional uid (`ownerUid`); null counts as absent.
    @inline(__always)
    public func optionalUID(_ name: String) throws(Invalid) -> UInt32? {
        guard let value = try optionalInt(name) else { return nil }
        guard let uid = UInt32(exactly: value) else { throw Invalid(parameter: name) }
        return uid
    }

    /// The account named by `provider` and `user`.
    @inline(__always)
    public func account() throws(Invalid) -> (provider: String, user: String) {
        (try string("provider"), try string("user"))
    }
}

extension LoginRequest {
    /// Reads the parameters of a `Login` call.
    public init(_ p: ParameterReader) throws(ParameterReader.Invalid) {
        let (provider, user) = try p.account()
        self.init(
            provider: provider, user: user, token: try p.optionalString("token"),
            tokenResponse: try p.optionalObject("tokenResponse"), profile: try p.optionalObject("profile"),
            expiresAt: try p.optionalInt("expiresAt"), ownerUID: try p.optionalUID("ownerUid"),
            replace: try p.optionalBool("replace") ?? false)
    }
}

/// Parameters of `GetToken`.
public struct GetTokenRequest: Sendable {
    public var provider: String
    public var user: String
    public var minValidSeconds: Int64
    /// Whose session: nil is the caller's own (or the declared `Owner=`).
    public var ownerUID: UInt32?
    /// How long to wait for the login of an `AutoLogin=yes` account that is
    /// not logged in, in seconds (0 to `longestWaitSeconds`).
    public var waitSeconds: Int64

    /// The wait for an automatic login when the call names none.
    public static let defaultWaitSeconds: Int64 = 30
    /// The longest wait a call may ask for.
    public static let longestWaitSeconds: Int64 = 300

    /// Reads the call's parameters.
    public init(_ p: ParameterReader) throws(ParameterReader.Invalid) {
        (provider, user) = try p.account()
        ownerUID = try p.optionalUID("ownerUid")
        minValidSeconds = try p.optionalInt("minValidSeconds") ?? 0
        if minValidSeconds < 0 { throw ParameterReader.Invalid(parameter: "minValidSeconds") }
        waitSeconds = try p.optionalInt("waitSeconds") ?? Self.defaultWaitSeconds
        guard (0...Self.longestWaitSeconds).contains(waitSeconds) else {
            throw ParameterReader.Invalid(parameter: "waitSeconds")
        }
    }
}

extension SessionRecord {
    /// The session as clients see it: state, metadata, the token masked.
    public func wireJSON(state: LoginState, refresh: RefreshStatus? = nil) -> JSON {
        var o: [String: JSON] = [
            "provider": .string(account.provider),
            "user": .string(account.user),
            "state": .string(state.rawValue),
            "profile": user.json(),
            "createdAt": .int(createdAt.seconds),
            "ownerUid": .int(Int64(ownerUID)),
            "hasRefreshToken": .bool(tokens.refreshToken != nil),
            "token": .string(tokens.accessToken.masked),
        ]
        o["expiresAt"] = expiresAt.map { .int($0.seconds) }
        o["tokenType"] = tokens.tokenType.map(JSON.string)
        o["scope"] = tokens.scope.map(JSON.string)
        o["instanceUrl"] = tokens.instanceURL.map(JSON.string)
        if let refresh { o.merge(refresh.json()) { _, new in new } }
        return .object(o)
    }
}

/// A session view with no stored record (a login or logout in flight, or
/// an account whose logins failed: `refresh` then shows them).
public func pendingSessionJSON(_ key: SessionKey, state: LoginState, refresh: RefreshStatus? = nil) -> JSON {
    var o: [String: JSON] = [
        "provider": .string(key.account.provider), "user": .string(key.account.user),
        "state": .string(state.rawValue), "ownerUid": .int(Int64(key.owner)), "hasRefreshToken": false,
    ]
    if let refresh { o.merge(refresh.json()) { _, new in new } }
    return .object(o)
}
