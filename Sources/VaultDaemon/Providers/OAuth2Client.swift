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

    /// RFC 7009 revocation of a refresh token; true when the server accepted it.
    public func revoke(_ token: Secret) async -> Bool {
        guard let url = settings.revocationURL else { return true }
        let form = [("token", token.revealed), ("token_type_hint", "refresh_token")] + clientAuthentication
        guard var response = try? await HTTPClient.postForm(url, form, timeoutSeconds: timeoutSeconds) else {
            return false
        }
        // A server may echo the token it revoked: wipe the body like a token response's.
        defer { response.body.wipe() }
        return response.status == 200
    }

    /// The client's credentials in the request body (RFC 6749 section 2.3.1).
    private var clientAuthentication: [(String, String)] {
        var form = [("client_id", settings.clientID)]
        if let clientSecret { form.append(("client_secret", clientSecret.revealed)) }
        return form
    }

    private func requestTokens(_ parameters: [(String, String)]) async -> RefreshOutcome {
        var response: HTTPResponse
        do {
            response = try await HTTPClient.postForm(
                settings.tokenURL, parameters + clientAuthentication, timeoutSeconds: timeoutSeconds)
        } catch {
            // Each kind is worth retrying: none says the grant is gone, and
            // logging a session out over a network or TLS fault would lose it.
            return .transient(reason: "the token endpoint failed: \(error.reason)", retryAfter: nil)
        }
        // The body holds the new tokens: wipe it once they are taken.
        defer { response.body.wipe() }
        return OAuth2Client.classify(status: response.status, body: response.body, retryAfter: response.retryAfter)
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
