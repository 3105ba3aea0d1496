import Foundation
import VaultCore

#if canImport(FoundationNetworking)
    import FoundationNetworking
#endif

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
        var form = ["grant_type": "refresh_token", "refresh_token": refreshToken.revealed]
        if let scope = settings.scope { form["scope"] = scope }
        return await requestTokens(form)
    }

    /// `grant_type=client_credentials`.
    public func clientCredentials() async -> RefreshOutcome {
        var form = ["grant_type": "client_credentials"]
        if let scope = settings.scope { form["scope"] = scope }
        return await requestTokens(form)
    }

    /// RFC 7009 revocation of a refresh token; true when the server accepted it.
    public func revoke(_ token: Secret) async -> Bool {
        guard let url = settings.revocationURL.flatMap(URL.init(string:)) else { return true }
        var form = ["token": token.revealed, "token_type_hint": "refresh_token", "client_id": settings.clientID]
        if let clientSecret { form["client_secret"] = clientSecret.revealed }
        guard let (_, response) = try? await post(url, form) else { return false }
        return response.statusCode == 200
    }

    private func requestTokens(_ parameters: [String: String]) async -> RefreshOutcome {
        guard let url = URL(string: settings.tokenURL) else {
            return .permanent(code: VaultError.Code.invalidConfig.seedCode, reason: "TokenURL is not a URL")
        }
        var form = parameters
        form["client_id"] = settings.clientID
        if let clientSecret { form["client_secret"] = clientSecret.revealed }
        let data: Data
        let response: HTTPURLResponse
        do {
            (data, response) = try await post(url, form)
        } catch {
            return .transient(reason: "token endpoint unreachable: \(error.localizedDescription)", retryAfter: nil)
        }
        return OAuth2Client.classify(
            status: response.statusCode, body: Array(data),
            retryAfter: response.value(forHTTPHeaderField: "Retry-After"))
    }

    /// Sorts a token endpoint's answer (RFC 6749 sections 5.1 and 5.2).
    public static func classify(status: Int, body: [UInt8], retryAfter: String?) -> RefreshOutcome {
        let json = try? JSON.parse(body)
        if status == 200 {
            guard let json, let credential = try? LoginCredential(tokenResponse: json) else {
                return .transient(reason: "the token endpoint answered 200 with no token response", retryAfter: nil)
            }
            return .refreshed(credential.tokens, expiresIn: credential.expiresIn)
        }
        let error = json?["error"]?.stringValue
        if status == 429 || status >= 500 {
            let wait = retryAfter.flatMap { Int64($0.trimmingCharacters(in: .whitespaces)) }
            return .transient(reason: "the token endpoint answered \(status)", retryAfter: wait)
        }
        if let error, ["invalid_grant", "invalid_client", "unauthorized_client"].contains(error) {
            return .permanent(code: error, reason: "the token endpoint refused the grant (\(error))")
        }
        if status == 401 || status == 403 {
            return .permanent(code: "http_\(status)", reason: "the token endpoint answered \(status)")
        }
        return .transient(reason: "the token endpoint answered \(status) \(error ?? "")", retryAfter: nil)
    }

    private func post(_ url: URL, _ form: [String: String]) async throws -> (Data, HTTPURLResponse) {
        var request = URLRequest(url: url, timeoutInterval: timeoutSeconds)
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        request.httpBody = Data(OAuth2Client.formEncoded(form).utf8)
        let prepared = request
        let (data, response) = try await OAuth2Client.withDeadline(seconds: timeoutSeconds + 5) {
            try await URLSession.shared.data(for: prepared)
        }
        guard let http = response as? HTTPURLResponse else { throw URLError(.badServerResponse) }
        return (data, http)
    }

    /// Runs `body` but gives up after `seconds` even if it never returns:
    /// FoundationNetworking on Linux has been seen to stall past the request
    /// timeout on a 401 with a WWW-Authenticate header. A refresh must end,
    /// or every caller waiting on it would wait for ever.
    static func withDeadline<T: Sendable>(
        seconds: Double, _ body: @escaping @Sendable () async throws -> T
    ) async throws -> T {
        let gate = ResumeOnce<T>()
        return try await withCheckedThrowingContinuation { continuation in
            gate.set(continuation)
            let work = Task {
                do { gate.resume(.success(try await body())) } catch { gate.resume(.failure(error)) }
            }
            Task {
                try? await Task.sleep(for: .milliseconds(Int64(seconds * 1000)))
                gate.resume(.failure(URLError(.timedOut)))
                work.cancel()
            }
        }
    }

    /// `application/x-www-form-urlencoded`, keys sorted.
    static func formEncoded(_ form: [String: String]) -> String {
        var allowed = CharacterSet.alphanumerics
        allowed.insert(charactersIn: "-._~")
        return form.keys.sorted().map { key in
            let value = form[key]!.addingPercentEncoding(withAllowedCharacters: allowed) ?? ""
            return "\(key)=\(value)"
        }.joined(separator: "&")
    }
}

/// Resumes a continuation once, whichever of several racers comes first.
final class ResumeOnce<T: Sendable>: @unchecked Sendable {
    private let lock = NSLock()
    private var continuation: CheckedContinuation<T, Error>?

    func set(_ continuation: CheckedContinuation<T, Error>) {
        lock.lock()
        self.continuation = continuation
        lock.unlock()
    }

    func resume(_ result: Result<T, Error>) {
        lock.lock()
        let taken = continuation
        continuation = nil
        lock.unlock()
        taken?.resume(with: result)
    }
}
