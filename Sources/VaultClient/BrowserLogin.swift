import Varlink
import VaultCore
import VaultProtocol

/// A browser login vaultd began (`BeginBrowserLogin`): what the client opens
/// and checks. The PKCE verifier stays in vaultd.
public struct BrowserLoginStart: Sendable, Equatable {
    /// The login's id, to finish it with.
    public var login: String
    /// The authorization URL to open in a browser.
    public var authorizationURL: String
    /// The state the redirect must bring back.
    public var state: String
    /// When vaultd drops the login unfinished.
    public var expiresAt: UnixTime
}

extension VaultConnection {
    /// Begins a browser login (authorization code with PKCE) of an oauth2
    /// provider with `AuthorizationURL=`; `redirectURI` is the caller's
    /// loopback listener, `http://127.0.0.1:PORT/`.
    public func beginBrowserLogin(
        provider: String, user: String, redirectURI: String, ownerUID: UInt32? = nil, replace: Bool = false
    ) throws(VaultClientError) -> BrowserLoginStart {
        var parameters = Self.account(provider, user, ownerUID)
        parameters["redirectUri"] = .string(redirectURI)
        if replace { parameters["replace"] = true }
        let reply = try call(.beginBrowserLogin, parameters)
        let p = ParameterReader(reply.parameters)
        do throws(ParameterReader.Invalid) {
            return BrowserLoginStart(
                login: try p.string("login"), authorizationURL: try p.string("authorizationUrl"),
                state: try p.string("state"),
                expiresAt: UnixTime(seconds: try p.optionalInt("expiresAt") ?? 0))
        } catch {
            throw .unexpectedReply(
                method: VaultMethod.beginBrowserLogin.rawValue, detail: "a bad '\(error.parameter)'")
        }
    }

    /// Finishes the browser login `login` with the authorization code and the
    /// state its redirect brought: vaultd exchanges the code and logs the
    /// account in, as `login(provider:user:tokenResponse:)` does.
    @discardableResult
    public func finishBrowserLogin(login: String, code: Secret, state: String) throws(VaultClientError)
        -> LoginResult
    {
        let reply = try call(
            .finishBrowserLogin,
            ["login": .string(login), "code": .string(code.revealed), "state": .string(state)])
        return LoginResult(
            session: try Self.session(reply.parameters["session"], of: .finishBrowserLogin),
            created: reply.parameters["created"]?.boolValue ?? false,
            replaced: reply.parameters["replaced"]?.boolValue ?? false)
    }
}
