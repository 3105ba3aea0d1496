import VaultCore

/// A method call as a Varlink client sends it.
public struct VarlinkCall: Sendable, Equatable {
    /// Fully qualified method name, `interface.Method`.
    public var method: String
    /// The input parameters: always an object, empty when none were sent.
    public var parameters: [String: JSON]
    /// The client accepts several replies (`continues: true` until the last).
    public var more: Bool
    /// The client wants no reply at all.
    public var oneway: Bool
    /// The client asks for the connection to be handed to another protocol.
    public var upgrade: Bool

    /// Makes a call.
    public init(
        method: String, parameters: [String: JSON] = [:], more: Bool = false, oneway: Bool = false,
        upgrade: Bool = false
    ) {
        self.method = method
        self.parameters = parameters
        self.more = more
        self.oneway = oneway
        self.upgrade = upgrade
    }

    /// The interface part of the method name.
    public var interface: String {
        guard let dot = method.lastIndex(of: ".") else { return "" }
        return String(method[..<dot])
    }

    /// The call as a JSON message (without the NUL terminator).
    public func encoded() -> [UInt8] {
        var o: [String: JSON] = ["method": .string(method)]
        if !parameters.isEmpty { o["parameters"] = .object(parameters) }
        if more { o["more"] = true }
        if oneway { o["oneway"] = true }
        if upgrade { o["upgrade"] = true }
        return JSON.object(o).serialized()
    }

    /// Why a message is not a call.
    public enum DecodingFailure: Error, Equatable, Sendable {
        /// Not JSON at all: the stream cannot be trusted any more.
        case invalidJSON(String)
        /// JSON, but not a call; the named field is wrong.
        case invalidField(String)
    }

    /// The most JSON values one call may hold. Parsing costs per value, and
    /// calls are parsed on the serving loop: a megabyte of `1,` (half a
    /// million values) held every other client for a parse; no real call
    /// comes near this many.
    public static let maximumValues = 16384

    /// Reads a call from one message.
    public init(message: ArraySlice<UInt8>) throws(DecodingFailure) {
        let json: JSON
        do { json = try JSON.parse(message, maximumValues: VarlinkCall.maximumValues) } catch {
            throw .invalidJSON(error.description)
        }
        guard case .object(let o) = json else { throw .invalidField("message") }
        guard let method = o["method"]?.stringValue else { throw .invalidField("method") }
        self.method = method
        switch o["parameters"] {
        case nil, .null?: parameters = [:]
        case .object(let p)?: parameters = p
        default: throw .invalidField("parameters")
        }
        more = o["more"]?.boolValue ?? false
        oneway = o["oneway"]?.boolValue ?? false
        upgrade = o["upgrade"]?.boolValue ?? false
    }
}

/// A reply as a Varlink service sends it: parameters or an error, and whether
/// more replies follow.
public struct VarlinkReply: Sendable, Equatable {
    /// The output parameters, or the error's parameters.
    public var parameters: [String: JSON]
    /// The error name, nil for a successful reply.
    public var error: String?
    /// More replies follow (only for calls with `more`).
    public var continues: Bool

    /// A successful reply.
    public init(parameters: [String: JSON] = [:], continues: Bool = false) {
        self.parameters = parameters
        self.error = nil
        self.continues = continues
    }

    /// An error reply.
    public init(error: String, parameters: [String: JSON] = [:]) {
        self.parameters = parameters
        self.error = error
        self.continues = false
    }

    /// The reply as a JSON message (without the NUL terminator).
    public func encoded() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        encode(into: &out)
        return out
    }

    /// Appends the reply as a JSON message (without the NUL terminator) to
    /// `out`: the members in sorted order, as `JSON.serialized()` writes them.
    public func encode(into out: inout [UInt8]) {
        out.append(UInt8(ascii: "{"))
        if continues { out.append(contentsOf: #""continues":true,"#.utf8) }
        if let error {
            out.append(contentsOf: #""error":"#.utf8)
            JSON.writeString(error, into: &out)
            out.append(UInt8(ascii: ","))
        }
        out.append(contentsOf: #""parameters":"#.utf8)
        JSON.object(parameters).write(into: &out)
        out.append(UInt8(ascii: "}"))
    }

    /// Reads a reply from one message.
    public init(message: ArraySlice<UInt8>) throws(VarlinkCall.DecodingFailure) {
        let json: JSON
        do { json = try JSON.parse(message) } catch { throw .invalidJSON(error.description) }
        guard case .object(let o) = json else { throw .invalidField("message") }
        switch o["parameters"] {
        case nil, .null?: parameters = [:]
        case .object(let p)?: parameters = p
        default: throw .invalidField("parameters")
        }
        error = o["error"]?.stringValue
        continues = o["continues"]?.boolValue ?? false
    }
}

/// The errors of `org.varlink.service` that every service may answer.
public enum VarlinkServiceError {
    /// The interface name of the service errors.
    public static let interface = "org.varlink.service"

    /// The method does not exist.
    public static func methodNotFound(_ method: String) -> VarlinkReply {
        VarlinkReply(error: "org.varlink.service.MethodNotFound", parameters: ["method": .string(method)])
    }

    /// The interface declares the method, but the service does not implement it.
    public static func methodNotImplemented(_ method: String) -> VarlinkReply {
        VarlinkReply(error: "org.varlink.service.MethodNotImplemented", parameters: ["method": .string(method)])
    }

    /// The interface does not exist.
    public static func interfaceNotFound(_ interface: String) -> VarlinkReply {
        VarlinkReply(error: "org.varlink.service.InterfaceNotFound", parameters: ["interface": .string(interface)])
    }

    /// A parameter is missing, null where that is not allowed, of the wrong
    /// type or not declared at all; or a call flag (`upgrade`) is not supported.
    public static func invalidParameter(_ parameter: String) -> VarlinkReply {
        VarlinkReply(error: "org.varlink.service.InvalidParameter", parameters: ["parameter": .string(parameter)])
    }

    /// A streaming method was called without `more`.
    public static func expectedMore() -> VarlinkReply {
        VarlinkReply(error: "org.varlink.service.ExpectedMore")
    }
}

extension VaultError {
    /// The full Varlink error name of this error's code.
    public var varlinkName: String { "\(VaultInterface.name).\(code.varlinkErrorName)" }

    /// The error as a Varlink reply: its name, the seed-style code and the message.
    public var varlinkReply: VarlinkReply {
        VarlinkReply(
            error: varlinkName, parameters: ["code": .string(code.seedCode), "message": .string(message)])
    }

    /// Reads a vaultd error back from a Varlink error reply, when it is one.
    public init?(reply: VarlinkReply) {
        guard let name = reply.error, name.hasPrefix(VaultInterface.name + "."),
            let code = VaultError.Code.allCases.first(where: {
                "\(VaultInterface.name).\($0.varlinkErrorName)" == name
            })
        else { return nil }
        self.init(code, reply.parameters["message"]?.stringValue ?? name)
    }
}
