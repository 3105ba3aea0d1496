import Varlink
import VaultCore
import VaultProtocol

/// What `StartDeviceLogin` answers: what to show the user, and the pending
/// login's id for `pollDeviceLogin`.
public struct DeviceLoginStart: Sendable, Equatable {
    /// The pending login's id: only the caller's uid (or root) may poll it.
    public var login: String
    /// What the user enters at `verificationURI`.
    public var userCode: String
    /// Where the user enters the code.
    public var verificationURI: String
    /// The address with the code in it, when the provider gives one.
    public var verificationURIComplete: String?
    /// Seconds until the code expires.
    public var expiresIn: Int64
    /// Seconds between polls, as the provider asked at the start.
    public var interval: Int64
}

/// What one `PollDeviceLogin` answers.
public enum DeviceLoginPoll: Sendable, Equatable {
    /// The user has not finished: poll again (vaultd keeps the pace).
    case pending(interval: Int64?)
    /// The login is done.
    case done(LoginResult)
}

extension VaultConnection {
    /// Starts a device login (RFC 8628) at an oauth2 provider with
    /// `DeviceAuthorizationURL=`: show the user `userCode` and `verificationURI`,
    /// then call `pollDeviceLogin` until it is done.
    public func startDeviceLogin(provider: String, user: String, ownerUID: UInt32? = nil, replace: Bool = false)
        throws(VaultClientError) -> DeviceLoginStart
    {
        var parameters = Self.account(provider, user, ownerUID)
        if replace { parameters["replace"] = true }
        let reply = try call(.startDeviceLogin, parameters)
        let p = reply.parameters
        guard let login = p["login"]?.stringValue, let userCode = p["userCode"]?.stringValue,
            let uri = p["verificationUri"]?.stringValue, let expiresIn = p["expiresIn"]?.integerValue,
            let interval = p["interval"]?.integerValue
        else {
            throw .unexpectedReply(method: VaultMethod.startDeviceLogin.rawValue, detail: "a reply without its fields")
        }
        return DeviceLoginStart(
            login: login, userCode: userCode, verificationURI: uri,
            verificationURIComplete: p["verificationUriComplete"]?.stringValue, expiresIn: expiresIn,
            interval: interval)
    }

    /// One poll of the device login `login`: vaultd answers when the poll
    /// it waited for came back (within 25 seconds plus one request to the
    /// provider), pending or done; the user's refusal and an expired code
    /// are thrown (`LoginDenied`, `LoginExpired`).
    public func pollDeviceLogin(_ login: String) throws(VaultClientError) -> DeviceLoginPoll {
        let reply = try call(.pollDeviceLogin, ["login": .string(login)])
        if reply.parameters["pending"]?.boolValue == true {
            return .pending(interval: reply.parameters["interval"]?.integerValue)
        }
        return .done(
            LoginResult(
                session: try Self.session(reply.parameters["session"], of: .pollDeviceLogin),
                created: reply.parameters["created"]?.boolValue ?? false,
                replaced: reply.parameters["replaced"]?.boolValue ?? false))
    }
}
