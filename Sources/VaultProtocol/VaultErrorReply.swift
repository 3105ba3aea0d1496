import Varlink
import VaultCore

extension VaultError {
    /// The full Varlink error name of this error's code.
    public var varlinkName: String { "\(VaultInterface.name).\(code.varlinkErrorName)" }

    /// The error as a Varlink reply: its name, the seed-style code (or the
    /// provider's own, `providerCode`) and the message.
    public var varlinkReply: VarlinkReply {
        var parameters: [String: JSON] = ["code": .string(replyCode), "message": .string(message)]
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
        let wireCode = reply.parameters["code"]?.stringValue
        self.init(
            code, reply.parameters["message"]?.stringValue ?? name,
            providerCode: wireCode == code.seedCode ? nil : wireCode)
        retryAt = reply.parameters["retryAt"]?.integerValue.map(UnixTime.init(seconds:))
    }
}
