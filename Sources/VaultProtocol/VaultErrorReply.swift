import Varlink
import VaultCore

extension VaultError {
    /// The full Varlink error name of this error's code.
    public var varlinkName: String { "\(VaultInterface.name).\(code.varlinkErrorName)" }

    /// The error as a Varlink reply: its name, vaultd's code and message, and
    /// the provider's own code and message when it named them.
    public var varlinkReply: VarlinkReply {
        var parameters: [String: JSON] = ["code": .string(code.seedCode), "message": .string(message)]
        parameters["providerCode"] = providerCode.map(JSON.string)
        parameters["providerMessage"] = providerMessage.map(JSON.string)
        if code.declaration.retryAt, let retryAt { parameters["retryAt"] = .int(retryAt.seconds) }
        return VarlinkReply(error: varlinkName, parameters: parameters)
    }

    /// Reads a vaultd error back from a Varlink error reply, when it is one.
    public init?(reply: VarlinkReply) {
        guard let name = reply.error, name.hasPrefix(VaultInterface.name + "."),
            let code = VaultError.Code.allCases.first(where: {
                "\(VaultInterface.name).\($0.varlinkErrorName)" == name
            })
        else { return nil }
        self.init(
            code, reply.parameters["message"]?.stringValue ?? name,
            providerCode: reply.parameters["providerCode"]?.stringValue,
            providerMessage: reply.parameters["providerMessage"]?.stringValue)
        retryAt = reply.parameters["retryAt"]?.integerValue.map(UnixTime.init(seconds:))
    }
}
