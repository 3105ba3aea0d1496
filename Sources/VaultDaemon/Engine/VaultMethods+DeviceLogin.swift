import Varlink
import VarlinkServer
import VaultCore
import VaultProtocol

extension VaultMethods.Handlers {
    /// `StartDeviceLogin`: asks the provider for a user code and keeps the device code.
    func startDeviceLogin(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
        let (provider, user) = try p.account()
        let request = LoginRequest(
            provider: provider, user: user, ownerUID: try p.optionalUID("ownerUid"),
            replace: try p.optionalBool("replace") ?? false)
        return VaultMethods.answered { () async throws(VaultError) -> VarlinkReply in
            let start = try await manager.startDeviceLogin(request, caller: caller)
            var parameters: [String: JSON] = [
                "login": .string(start.id), "userCode": .string(start.userCode),
                "verificationUri": .string(start.verificationURI), "expiresIn": .int(start.expiresIn),
                "interval": .int(start.interval),
            ]
            parameters["verificationUriComplete"] = start.verificationURIComplete.map(JSON.string)
            return VarlinkReply(parameters: parameters)
        }
    }

    /// `PollDeviceLogin`: one poll when it is due; pending, or the login done.
    func pollDeviceLogin(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
        let id = try p.string("login")
        guard !id.isEmpty, id.utf8.count <= 64 else { throw ParameterReader.Invalid(parameter: "login") }
        return VaultMethods.answered { () async throws(VaultError) -> VarlinkReply in
            switch try await manager.pollDeviceLogin(id, caller: caller) {
            case .pending(let interval):
                return VarlinkReply(parameters: ["pending": true, "interval": .int(interval)])
            case .done(let record, let outcome):
                var parameters: [String: JSON] = [
                    "pending": false, "session": record.wireJSON(state: .logged),
                    "created": .bool(outcome != .existing),
                ]
                parameters["replaced"] = .bool(outcome == .replaced)
                return VarlinkReply(parameters: parameters)
            }
        }
    }
}
