import Varlink
import VaultCore
import VaultSystem

/// What a device authorization endpoint answered (RFC 8628 section 3.2):
/// what the user is shown, how long and how often to poll, and the device
/// code, which never leaves vaultd.
struct DeviceAuthorization: Sendable {
    /// `device_code`: what the token endpoint is polled with. Secret.
    var deviceCode: Secret
    /// `user_code`: what the user types at the verification URI.
    var userCode: String
    /// `verification_uri` (also read from Google's `verification_url`).
    var verificationURI: String
    /// `verification_uri_complete`: the URI with the user code in it, when given.
    var verificationURIComplete: String?
    /// `expires_in`, in seconds, in 1...`longestLifetime` (absent: `defaultLifetime`).
    var expiresIn: Int64
    /// `interval`, in seconds, in 1...`longestInterval` (absent: 5, RFC 8628 section 3.2).
    var interval: Int64

    /// The lifetime assumed when the server sends no `expires_in` (it must).
    static let defaultLifetime: Int64 = 600
    /// The longest a pending device login is held, whatever the server says.
    static let longestLifetime: Int64 = 3600
    /// The interval when the server names none (RFC 8628 section 3.2).
    static let defaultInterval: Int64 = 5
    /// The longest interval taken from the server.
    static let longestInterval: Int64 = 300
    /// The longest user code or URI vaultd passes on to a terminal.
    static let longestText = 2048

    /// Reads the endpoint's answer: a `DeviceAuthorization`, or the error to
    /// report (`ProviderFailure`'s kinds: an OAuth 2.0 error's, a 5xx or a
    /// garbled answer as a network error).
    static func parse(status: Int, body: [UInt8]) -> Result<DeviceAuthorization, VaultError> {
        let json = try? JSON.parse(body)
        guard status == 200 else {
            let code = json?["error"]?.stringValue
            let reason = "the device authorization endpoint answered \(status) \(code ?? "")"
            if status >= 500 || status == 429 || code == nil {
                return .failure(ProviderFailure.transient(code: nil, reason: reason, message: reason))
            }
            return .failure(ProviderFailure.refusal(code: code ?? "", reason: reason, message: reason))
        }
        func text(_ name: String) -> String? {
            guard let value = json?[name]?.stringValue, !value.isEmpty, value.utf8.count <= longestText,
                value.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F && !(0x80..<0xA0 ~= $0.value) })
            else { return nil }
            return value
        }
        func uri(_ name: String) -> String? {
            guard let value = text(name), value.hasPrefix("https://") || value.hasPrefix("http://"),
                !value.contains(" ")
            else { return nil }
            return value
        }
        func seconds(_ name: String) -> Int64? { json?[name]?.integerValue }
        guard let deviceCode = json?["device_code"]?.stringValue, !deviceCode.isEmpty, let userCode = text("user_code"),
            let verificationURI = uri("verification_uri") ?? uri("verification_url")
        else {
            let reason =
                "the device authorization endpoint answered 200 without a device_code, a user_code and a verification_uri (an http(s) URL) vaultd can show"
            return .failure(VaultError(.networkError, reason))
        }
        return .success(
            DeviceAuthorization(
                deviceCode: Secret(deviceCode), userCode: userCode, verificationURI: verificationURI,
                verificationURIComplete: uri("verification_uri_complete"),
                expiresIn: min(max(seconds("expires_in") ?? defaultLifetime, 1), longestLifetime),
                interval: min(max(seconds("interval") ?? defaultInterval, 1), longestInterval)))
    }
}

/// What one poll of the token endpoint with a device code answered (RFC 8628 section 3.5).
enum DevicePollAnswer: Sendable {
    /// The user approved: the token response, as the endpoint sent it.
    case tokens(JSON)
    /// `authorization_pending`: poll again after the interval.
    case pending
    /// `slow_down`: poll again after the interval, made 5 seconds longer for good.
    case slowDown
    /// A failure worth another poll (a 5xx, a network fault): poll again after the interval.
    case transient(VaultError)
    /// The login is over: `access_denied`, `expired_token`, or another refusal.
    case failed(VaultError)

    /// Sorts the token endpoint's answer to a device code poll.
    static func classify(status: Int, body: [UInt8], retryAfter: String?) -> DevicePollAnswer {
        let json = try? JSON.parse(body)
        if status == 200, let json, case .object = json, json["access_token"]?.stringValue != nil {
            return .tokens(json)
        }
        switch json?["error"]?.stringValue {
        case "authorization_pending": return .pending
        case "slow_down": return .slowDown
        case "access_denied":
            return .failed(
                VaultError(
                    .loginDenied, "the user refused the login at the provider (access_denied)",
                    providerCode: "access_denied"))
        case "expired_token":
            return .failed(
                VaultError(
                    .loginExpired,
                    "the device code expired before the user approved the login (expired_token); start the login again",
                    providerCode: "expired_token"))
        default: break
        }
        switch OAuth2Client.classify(status: status, body: body, retryAfter: retryAfter) {
        case .refreshed:
            // classify takes a 200 with a token response; the check above found none.
            return .transient(VaultError(.networkError, "the token endpoint answered 200 with no token response"))
        case .transient(let reason, _, _):
            return .transient(ProviderFailure.transient(code: nil, reason: reason, message: reason))
        case .permanent(let code, let reason):
            return .failed(ProviderFailure.refusal(code: code, reason: reason, message: reason))
        }
    }
}

extension OAuth2Client {
    /// The device authorization grant's `grant_type` (RFC 8628 section 3.4).
    static let deviceCodeGrantType = "urn:ietf:params:oauth:grant-type:device_code"

    /// Asks the device authorization endpoint (RFC 8628 section 3.1) for a
    /// device code and a user code, authenticated as at the token endpoint.
    func authorizeDevice() async -> Result<DeviceAuthorization, VaultError> {
        guard let url = settings.deviceAuthorizationURL else {
            return .failure(VaultError(.invalidParameter, "the provider has no DeviceAuthorizationURL="))
        }
        var form: [(String, String)] = []
        if let scope = settings.scope { form.append(("scope", scope)) }
        switch await post(url, form) {
        case .failure(let error): return .failure(error)
        case .success(var response):
            defer { response.body.wipe() }
            return DeviceAuthorization.parse(status: response.status, body: response.body)
        }
    }

    /// One poll of the token endpoint with `deviceCode` (RFC 8628 section 3.4).
    func pollDevice(_ deviceCode: Secret) async -> DevicePollAnswer {
        let form = [("grant_type", OAuth2Client.deviceCodeGrantType), ("device_code", deviceCode.revealed)]
        switch await post(settings.tokenURL, form) {
        case .failure(let error): return .transient(error)
        case .success(var response):
            defer { response.body.wipe() }
            return DevicePollAnswer.classify(
                status: response.status, body: response.body, retryAfter: response.retryAfter)
        }
    }

    /// Posts `form` and the client's authentication to `url`; a failure to
    /// send it is a network error (or the missing secret or key, as such).
    private func post(_ url: String, _ form: [(String, String)]) async -> Result<HTTPResponse, VaultError> {
        var authentication: (form: [(String, String)], header: [UInt8]?)
        switch clientAuthentication() {
        case .success(let made): authentication = made
        case .failure(let failure): return .failure(VaultError(.invalidClient, failure.reason))
        }
        defer { authentication.header?.wipe() }
        do {
            return .success(
                try await HTTPClient.postForm(
                    url, form + authentication.form, authorization: authentication.header,
                    timeoutSeconds: timeoutSeconds))
        } catch {
            return .failure(VaultError(.networkError, "the provider could not be reached: \(error.reason)"))
        }
    }
}
