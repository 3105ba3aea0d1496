import Varlink

/// What a client hands over to log in: a ready token, or an OAuth 2.0 token
/// response as a token endpoint (or Salesforce) returns it.
public struct LoginCredential: Sendable, Equatable {
    /// The tokens, as given.
    public var tokens: TokenSet
    /// `expires_in` of an OAuth 2.0 response, in seconds from issue.
    public var expiresIn: Int64?
    /// What the response says about the user: an OpenID Connect `id_token`'s
    /// claims, or an exec helper's `profile`. Informational only, never used
    /// to decide anything. Its `uid` is empty: the session's user is the uid,
    /// set when the record is made (`UserProfile.owned(by:)`).
    public var profile: UserProfile?

    /// The longest `expires_in` accepted: 100 years.
    public static let longestLifetime: Int64 = 100 * 366 * 86400

    /// The longest token accepted, in bytes.
    public static let maximumTokenLength = 16 * 1024

    /// A credential a provider obtained (client credentials, an exec helper).
    public init(tokens: TokenSet, expiresIn: Int64?, profile: UserProfile? = nil) {
        self.tokens = tokens
        self.expiresIn = expiresIn
        self.profile = profile
    }

    /// A credential that is a bare access token.
    public init(token: String) throws(VaultError) {
        try LoginCredential.checkToken(token, name: "token")
        tokens = TokenSet(accessToken: Secret(token))
    }

    /// A credential read from an OAuth 2.0 token response (RFC 6749 section 5.1),
    /// with Salesforce's `instance_url` and `issued_at` (milliseconds) understood.
    /// Members it does not know are ignored, as RFC 6749 asks.
    public init(tokenResponse json: JSON) throws(VaultError) {
        guard case .object(let o) = json else {
            throw VaultError(.invalidParameter, "the token response must be a JSON object, not \(json.typeName)")
        }
        if let error = o["error"]?.stringValue {
            throw VaultError(
                .invalidCredential,
                "the token response is an error ('\(error)'), not a token; obtain a new token and log in again")
        }
        guard let accessValue = o["access_token"] else {
            throw VaultError(.invalidCredential, "the token response has no access_token")
        }
        guard let access = accessValue.stringValue else {
            throw VaultError(.invalidParameter, "access_token must be a string, not \(accessValue.typeName)")
        }
        try LoginCredential.checkToken(access, name: "access_token")
        tokens = TokenSet(accessToken: Secret(access))
        func optionalString(_ key: String) throws(VaultError) -> String? {
            guard let v = o[key], v != .null else { return nil }
            guard let s = v.stringValue else {
                throw VaultError(.invalidParameter, "\(key) must be a string, not \(v.typeName)")
            }
            return s
        }
        if let refresh = try optionalString("refresh_token") {
            try LoginCredential.checkToken(refresh, name: "refresh_token")
            tokens.refreshToken = Secret(refresh)
        }
        tokens.tokenType = try optionalString("token_type")
        tokens.scope = try optionalString("scope")
        tokens.instanceURL = try optionalString("instance_url")
        tokens.clientID = try optionalString("client_id")
        if let v = o["expires_in"], v != .null {
            guard let seconds = v.integerValue ?? v.stringValue.flatMap({ Int64($0) }), seconds >= 0,
                seconds <= LoginCredential.longestLifetime
            else {
                throw VaultError(
                    .invalidParameter,
                    "expires_in must be a number of seconds from 0 to \(LoginCredential.longestLifetime) (100 years)")
            }
            expiresIn = seconds
        }
        if let v = o["issued_at"], v != .null {
            guard let raw = v.integerValue ?? v.stringValue.flatMap({ Int64($0) }), raw >= 0,
                raw <= UnixTime.latestExpiry.seconds * 1000
            else {
                throw VaultError(.invalidParameter, "issued_at must be a time in seconds or milliseconds")
            }
            // Salesforce sends milliseconds; a value past year 5138 in seconds is surely milliseconds.
            tokens.issuedAt = UnixTime(seconds: raw > 100_000_000_000 ? raw / 1000 : raw)
        }
        // Read, never verified, and never kept: only the profile it describes is.
        if let idToken = o["id_token"]?.stringValue, let claims = JWT.claims(of: idToken) {
            profile = UserProfile(idTokenClaims: claims)
        }
    }

    /// Reads a credential as `vaultctl login` gets it: a JSON object is a token
    /// response, anything else is a bare token (surrounding whitespace removed).
    public init(text: String) throws(VaultError) {
        let trimmed = LoginCredential.trimmed(text)
        if trimmed.hasPrefix("{") {
            let json: JSON
            do { json = try JSON.parse(trimmed) } catch {
                throw VaultError(
                    .invalidParameter, "the credential looks like JSON but is not valid (\(error.description))")
            }
            try self.init(tokenResponse: json)
        } else {
            try self.init(token: trimmed)
        }
    }

    /// When the access token expires: an explicit time wins, then `expires_in`
    /// counted from `issued_at` (or `now`), then a JWT's `exp` claim.
    public func expiry(explicit: UnixTime?, now: UnixTime) -> UnixTime? {
        if let explicit { return explicit }
        if let expiresIn { return (tokens.issuedAt ?? now).adding(seconds: expiresIn) }
        return JWT.expiry(of: tokens.accessToken.revealed)
    }

    /// `text` without surrounding whitespace (credentials, secrets, config lines).
    public static func trimmed(_ text: String) -> String {
        var scalars = Substring(text).unicodeScalars[...]
        while let first = scalars.first, first.properties.isWhitespace { scalars.removeFirst() }
        while let last = scalars.last, last.properties.isWhitespace { scalars.removeLast() }
        return String(String.UnicodeScalarView(scalars))
    }

    static func checkToken(_ token: String, name: String) throws(VaultError) {
        if token.isEmpty {
            throw VaultError(.invalidCredential, "\(name) is empty; pass the token on stdin or with --token-file")
        }
        if token.utf8.count > maximumTokenLength {
            throw VaultError(.invalidParameter, "\(name) is longer than \(maximumTokenLength) bytes")
        }
        if token.unicodeScalars.contains(where: { $0.properties.isWhitespace || $0.value < 0x20 || $0.value == 0x7F }) {
            throw VaultError(
                .invalidCredential, "\(name) contains whitespace or control characters (\(Secret.mask(token)))")
        }
    }
}

/// Reads claims from a JSON Web Token without verifying it: vaultd only needs
/// to know when the token stops working, the server checks the signature.
/// An id_token's claims are shown as the session's profile, for people to
/// read; nothing is decided on them.
public enum JWT {
    /// The claims (the payload object) of a JWT, unverified; nil when the
    /// token is not a JWT whose payload is a JSON object.
    public static func claims(of token: String) -> [String: JSON]? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64.decode(String(parts[1])),
            case .object(let claims)? = try? JSON.parse(payload)
        else { return nil }
        return claims
    }

    /// The `exp` claim of a JWT, or nil when the token is not a JWT or has none.
    public static func expiry(of token: String) -> UnixTime? {
        guard let exp = claims(of: token)?["exp"] else { return nil }
        var seconds: Int64?
        if let integer = exp.integerValue {
            seconds = integer
        } else if case .number(let d) = exp, d.isFinite, abs(d) < 9.0e15 {
            seconds = Int64(d)
        }
        // An exp past year 9999 is not a real expiry: treat the token as having none.
        guard let seconds, seconds <= UnixTime.latestExpiry.seconds else { return nil }
        return UnixTime(seconds: seconds)
    }
}

/// A login as a client asks for it: the account, the credential in one of its
/// two shapes, and optional metadata.
public struct LoginRequest: Sendable {
    public var provider: String
    public var user: String
    /// A ready token (CometChat authToken, OpenIM token).
    public var token: String?
    /// An OAuth 2.0 token response, as the token endpoint sent it.
    public var tokenResponse: JSON?
    /// The user's profile (CometChat User fields).
    public var profile: JSON?
    /// When the token expires, overriding `expires_in` and a JWT's `exp`.
    public var expiresAt: Int64?
    /// Whose session to log in, when an administrator logs one in for another
    /// user; nil is the caller's own (or the declared `Owner=`).
    public var ownerUID: UInt32?
    /// Replace the tokens of a session that is already logged in, instead of
    /// answering with it (`vaultctl login --replace`).
    public var replace: Bool

    /// Makes a request.
    public init(
        provider: String, user: String, token: String? = nil, tokenResponse: JSON? = nil, profile: JSON? = nil,
        expiresAt: Int64? = nil, ownerUID: UInt32? = nil, replace: Bool = false
    ) {
        self.ownerUID = ownerUID
        self.replace = replace
        self.provider = provider
        self.user = user
        self.token = token
        self.tokenResponse = tokenResponse
        self.profile = profile
        self.expiresAt = expiresAt
    }
}
