import Varlink
import VaultCore
import VaultSystem

/// Talks to an OAuth 2.0 token endpoint (RFC 6749) and revocation endpoint
/// (RFC 7009) and sorts every answer into refreshed, transient or permanent.
public struct OAuth2Client: Sendable {
    /// The provider's settings.
    public let settings: OAuth2Settings
    /// The client secret, when the provider has one (from ClientSecretFile).
    public let clientSecret: Secret?
    /// How long one request may take.
    public let timeoutSeconds: Double

    /// A client for one provider.
    public init(settings: OAuth2Settings, clientSecret: Secret?, timeoutSeconds: Double = 30) {
        self.settings = settings
        self.clientSecret = clientSecret
        self.timeoutSeconds = timeoutSeconds
    }

    /// `grant_type=refresh_token`.
    public func refresh(using refreshToken: Secret) async -> RefreshOutcome {
        var form = [("grant_type", "refresh_token"), ("refresh_token", refreshToken.revealed)]
        if let scope = settings.scope { form.append(("scope", scope)) }
        return await requestTokens(form)
    }

    /// `grant_type=client_credentials`.
    public func clientCredentials() async -> RefreshOutcome {
        var form = [("grant_type", "client_credentials")]
        if let scope = settings.scope { form.append(("scope", scope)) }
        return await requestTokens(form)
    }

    /// The JWT bearer grant (RFC 7523 section 2.1): an assertion signed with
    /// `JWTKeyFile=`, issued by `JWTIssuer=` (the client id) to `JWTAudience=`
    /// (the token URL's origin), whose subject is `subject`.
    public func jwtBearer(subject: String) async -> RefreshOutcome {
        let claims = JWTClaims(
            issuer: settings.assertionIssuer, subject: subject, audience: settings.assertionAudience,
            now: SystemWallClock().now().seconds)
        let assertion: String
        do { assertion = try JWTSigner.sign(claims, keyFile: settings.jwtKeyFile ?? "") } catch {
            // Transient: putting the key file right lets the next try work.
            return .transient(reason: "no JWT bearer assertion: \(error.reason)", retryAfter: nil)
        }
        var form = [("grant_type", OAuth2Client.jwtBearerGrantType), ("assertion", assertion)]
        if let scope = settings.scope { form.append(("scope", scope)) }
        // invalid_grant here is the assertion refused, not a grant revoked: say which.
        return OAuth2Client.explained(
            await requestTokens(form), code: "invalid_grant",
            "the token endpoint refused the JWT bearer assertion (invalid_grant): signed with another key than the one registered, or an issuer, audience or subject it does not take"
        )
    }

    /// The JWT bearer grant's `grant_type` (RFC 7523 section 2.1).
    static let jwtBearerGrantType = "urn:ietf:params:oauth:grant-type:jwt-bearer"
    /// `client_assertion_type` of `private_key_jwt` (RFC 7523 section 2.2).
    static let clientAssertionType = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"

    /// RFC 7009 revocation of a refresh token; true when the server accepted it.
    public func revoke(_ token: Secret) async -> Bool {
        guard let url = settings.revocationURL else { return true }
        guard case .success(var authentication) = clientAuthentication() else { return false }
        defer { authentication.header?.wipe() }
        let form = [("token", token.revealed), ("token_type_hint", "refresh_token")] + authentication.form
        guard
            var response = try? await HTTPClient.postForm(
                url, form, authorization: authentication.header, timeoutSeconds: timeoutSeconds)
        else { return false }
        // A server may echo the token it revoked: wipe the body like a token response's.
        defer { response.body.wipe() }
        return response.status == 200
    }

    /// How this client authenticates: `TokenEndpointAuthMethod=`, else
    /// `client_secret_basic` when it has a secret and `none` when not.
    public var authMethod: TokenEndpointAuthMethod {
        settings.tokenEndpointAuthMethod ?? .defaultMethod(hasSecret: clientSecret != nil)
    }

    /// The client's credentials (RFC 6749 section 2.3.1): the form fields and
    /// the `Authorization` header line of `authMethod`; a failure when the
    /// method needs a secret and there is none, or a key that cannot sign.
    func clientAuthentication() -> Result<(form: [(String, String)], header: [UInt8]?), JWTSigner.Failure> {
        switch authMethod {
        case .none: return .success(([("client_id", settings.clientID)], nil))
        case .clientSecretPost:
            guard let clientSecret else { return .failure(JWTSigner.Failure(reason: missingSecret)) }
            return .success(([("client_id", settings.clientID), ("client_secret", clientSecret.revealed)], nil))
        case .clientSecretBasic:
            guard let clientSecret else { return .failure(JWTSigner.Failure(reason: missingSecret)) }
            var credentials = OAuth2Client.basicCredentials(clientID: settings.clientID, secret: clientSecret)
            defer { credentials.wipe() }
            return .success(([], Array("Authorization: Basic ".utf8) + credentials))
        case .privateKeyJWT:
            // RFC 7523 section 3: iss and sub are the client id; aud the token
            // endpoint's URL (OpenID Connect Core 9), at the revocation endpoint too.
            let claims = JWTClaims(
                issuer: settings.clientID, subject: settings.clientID, audience: settings.tokenURL,
                now: SystemWallClock().now().seconds)
            do {
                let assertion = try JWTSigner.sign(claims, keyFile: settings.jwtKeyFile ?? "")
                return .success(
                    (
                        [
                            ("client_id", settings.clientID),
                            ("client_assertion_type", OAuth2Client.clientAssertionType),
                            ("client_assertion", assertion),
                        ], nil
                    ))
            } catch {
                return .failure(JWTSigner.Failure(reason: "no client assertion (private_key_jwt): \(error.reason)"))
            }
        }
    }

    /// Why a request was not sent: the method needs a secret vaultd has not.
    private var missingSecret: String {
        "TokenEndpointAuthMethod=\(authMethod.rawValue) needs a client secret, and there is none: set ClientSecretFile= or store one with vaultctl provider-secret"
    }

    /// The credentials of HTTP Basic client authentication (RFC 6749 section
    /// 2.3.1): the client id and the secret each form-urlencoded (every byte
    /// but the unreserved ones as %XX, so a space is %20, which servers that
    /// decode with or without '+' both read back), joined by ':', in base64.
    static func basicCredentials(clientID: String, secret: Secret) -> [UInt8] {
        var pair: [UInt8] = []
        defer { pair.wipe() }
        HTTPClient.percentEncode(clientID, into: &pair)
        pair.append(UInt8(ascii: ":"))
        HTTPClient.percentEncode(secret.revealed, into: &pair)
        return Base64.encodedBytes(pair)
    }

    /// Posts `parameters` and the client's authentication (`authMethod`) to
    /// the token endpoint: its answer, whose body (tokens) the caller wipes,
    /// or why no request went out or no answer came.
    func postTokenRequest(_ parameters: [(String, String)]) async -> Result<HTTPResponse, JWTSigner.Failure> {
        var authentication: (form: [(String, String)], header: [UInt8]?)
        switch clientAuthentication() {
        case .success(let made): authentication = made
        case .failure(let failure): return .failure(failure)
        }
        defer { authentication.header?.wipe() }
        do {
            return .success(
                try await HTTPClient.postForm(
                    settings.tokenURL, parameters + authentication.form, authorization: authentication.header,
                    timeoutSeconds: timeoutSeconds))
        } catch {
            return .failure(JWTSigner.Failure(reason: "the token endpoint failed: \(error.reason)"))
        }
    }

    private func requestTokens(_ parameters: [(String, String)]) async -> RefreshOutcome {
        var response: HTTPResponse
        switch await postTokenRequest(parameters) {
        case .success(let answer): response = answer
        case .failure(let failure):
            // Each kind is worth retrying: storing the secret or putting the
            // key file right puts it right, and none says the grant is gone
            // (logging a session out over a network or TLS fault would lose it).
            return .transient(reason: failure.reason, retryAfter: nil)
        }
        // The body holds the new tokens: wipe it once they are taken.
        defer { response.body.wipe() }
        let outcome = OAuth2Client.classify(
            status: response.status, body: response.body, retryAfter: response.retryAfter)
        guard authMethod == .privateKeyJWT else { return outcome }
        return OAuth2Client.explained(
            outcome, code: "invalid_client",
            "the token endpoint refused the client assertion (private_key_jwt, invalid_client): signed with another key than the one registered, or a client it does not know"
        )
    }

    /// `outcome` with `reason` in place of its own when it is a refusal with `code`.
    static func explained(_ outcome: RefreshOutcome, code: String, _ reason: String) -> RefreshOutcome {
        guard case .permanent(code, _) = outcome else { return outcome }
        return .permanent(code: code, reason: reason)
    }

    /// Sorts a token endpoint's answer (RFC 6749 sections 5.1 and 5.2).
    public static func classify(status: Int, body: [UInt8], retryAfter: String?) -> RefreshOutcome {
        let json = try? JSON.parse(body)
        if status == 200 {
            guard let json else {
                return .transient(
                    reason: "the token endpoint answered 200 with \(body.count) bytes that are no JSON", retryAfter: nil
                )
            }
            guard let credential = try? LoginCredential(tokenResponse: json) else {
                return .transient(reason: "the token endpoint answered 200 with no token response", retryAfter: nil)
            }
            return .refreshed(credential.tokens, expiresIn: credential.expiresIn, profile: credential.profile)
        }
        let error = json?["error"]?.stringValue
        if status == 429 || status >= 500 {
            // Delay-seconds only (RFC 9110 10.2.3), kept in 0...1 h.
            let wait = retryAfter.flatMap { Int64(LoginCredential.trimmed($0)) }.map {
                min(max($0, 0), RefreshPolicy.longestRetryAfter)
            }
            return .transient(reason: "the token endpoint answered \(status)", retryAfter: wait)
        }
        if let error, ["invalid_grant", "invalid_client", "unauthorized_client"].contains(error) {
            return .permanent(code: error, reason: "the token endpoint refused the grant (\(error))")
        }
        if status == 401 || status == 403 {
            // No OAuth 2.0 code to pass on: vaultd's own says what it means.
            return .permanent(
                code: VaultError.Code.invalidClient.seedCode, reason: "the token endpoint answered \(status)")
        }
        return .transient(reason: "the token endpoint answered \(status) \(error ?? "")", retryAfter: nil)
    }
}
