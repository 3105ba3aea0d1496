import Varlink
import VaultCore
import VaultSystem

/// The OAuth 2.0 pieces of a browser login: the authorization code grant
/// (RFC 6749 section 4.1) with PKCE (RFC 7636, S256) on a loopback redirect
/// (RFC 8252 section 7.3). Pure, but for the random values and the exchange.
enum BrowserFlow {
    /// `bytes` random bytes in base64url, without padding: 32 make a code
    /// verifier of 43 characters (RFC 7636 section 4.1), 16 a state or an id.
    static func randomText(bytes: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        var raw = (0..<bytes).map { _ in UInt8.random(in: 0...255, using: &generator) }
        defer { raw.wipe() }
        return JWS.base64url(raw)
    }

    /// The S256 code challenge of `verifier` (RFC 7636 section 4.2):
    /// BASE64URL(SHA256(ASCII(verifier))).
    static func challenge(of verifier: Secret) -> String {
        var digest = verifier.withUTF8 { SHA256.hash($0) }
        defer { digest.wipe() }
        return JWS.base64url(digest)
    }

    /// The authorization request (RFC 6749 section 4.1.1, RFC 7636 section
    /// 4.3): `AuthorizationURL=` with `response_type=code`, the client id,
    /// the redirect URI, the scope when configured, the state and the S256
    /// challenge, each percent-encoded; after a `?` the URL already has, an `&`.
    static func authorizationURL(
        _ settings: OAuth2Settings, redirectURI: String, state: String, challenge: String
    ) -> String {
        var query: [(String, String)] = [
            ("response_type", "code"), ("client_id", settings.clientID), ("redirect_uri", redirectURI),
        ]
        if let scope = settings.scope { query.append(("scope", scope)) }
        query += [("state", state), ("code_challenge", challenge), ("code_challenge_method", "S256")]
        let base = settings.authorizationURL ?? ""
        let separator = !base.contains("?") ? "?" : base.hasSuffix("?") || base.hasSuffix("&") ? "" : "&"
        return base + separator + String(decoding: HTTPClient.formEncoded(query), as: UTF8.self)
    }

    /// True when `uri` is a loopback redirect URI as vaultctl makes them
    /// (RFC 8252 section 7.3): `http://127.0.0.1:PORT` with a port of 1 to
    /// 65535, then a path of its own ("/" at least), without query, fragment
    /// or anything but printable ASCII.
    static func isLoopbackRedirect(_ uri: String) -> Bool {
        let prefix = "http://127.0.0.1:"
        guard uri.hasPrefix(prefix), uri.utf8.count <= 512 else { return false }
        let rest = uri.dropFirst(prefix.count)
        let digits = rest.prefix { $0.isASCII && $0.isNumber }
        guard (1...5).contains(digits.count), let port = Int(digits), (1...65535).contains(port) else { return false }
        let path = rest.dropFirst(digits.count)
        return path.hasPrefix("/")
            && path.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "?") && $0 != UInt8(ascii: "#") }
    }
}

/// The token endpoint's answer to an authorization code: the token
/// response as it sent it, or the failure as vaultd reports it.
enum CodeExchange {
    case tokens(JSON)
    case failed(VaultError)
}

extension OAuth2Client {
    /// `grant_type=authorization_code` (RFC 6749 section 4.1.3) with the
    /// PKCE `code_verifier` (RFC 7636 section 4.5) and the redirect URI of
    /// the authorization request, authenticated as `authMethod` says.
    func exchangeCode(_ code: Secret, verifier: Secret, redirectURI: String) async -> CodeExchange {
        let form = [
            ("grant_type", "authorization_code"), ("code", code.revealed), ("redirect_uri", redirectURI),
            ("code_verifier", verifier.revealed),
        ]
        var response: HTTPResponse
        switch await postTokenRequest(form) {
        case .success(let answer): response = answer
        case .failure(let failure):
            return .failed(
                ProviderFailure.transient(
                    code: nil, reason: failure.reason,
                    message: "the authorization code could not be exchanged: \(failure.reason)"))
        }
        defer { response.body.wipe() }
        let outcome = OAuth2Client.classify(status: response.status, body: response.body, retryAfter: nil)
        switch outcome {
        case .refreshed:
            // The response as sent, for Login's own reading of it.
            guard let json = try? JSON.parse(response.body), case .object = json else {
                return .failed(VaultError(.networkError, "the token endpoint's answer is no token response"))
            }
            return .tokens(json)
        case .permanent(let code, let reason):
            let message =
                code == "invalid_grant"
                ? "the token endpoint refused the authorization code (invalid_grant): it was used already or expired, the PKCE code verifier does not match its challenge, or the redirect URI differs; log in again"
                : "the token endpoint refused the code exchange (\(code)); check ClientID=, the client secret and TokenEndpointAuthMethod="
            return .failed(ProviderFailure.refusal(code: code, reason: reason, message: message))
        case .transient(let reason, _, _):
            return .failed(
                ProviderFailure.transient(
                    code: nil, reason: reason, message: "the authorization code could not be exchanged: \(reason)"))
        }
    }
}
