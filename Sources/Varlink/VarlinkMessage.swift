import Glibc

/// A method call as a Varlink client sends it.
public struct VarlinkCall: Sendable, Equatable {
    /// Fully qualified method name, `interface.Method`.
    public var method: String
    /// The input parameters: always an object, empty when none were sent.
    public var parameters: VarlinkParameters
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
        self.init(method: method, members: VarlinkParameters(parameters), more: more, oneway: oneway, upgrade: upgrade)
    }

    /// Makes a call whose parameters are already members.
    public init(method: String, members: VarlinkParameters, more: Bool, oneway: Bool, upgrade: Bool) {
        self.method = method
        self.parameters = members
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
        if !parameters.isEmpty { o["parameters"] = .object(parameters.dictionary) }
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

    /// The method a message names when `method` is its first member, read
    /// without parsing the rest (which may be large); nil when the message
    /// does not begin so. The call itself may still turn out invalid.
    public static func leadingMethod(of message: ArraySlice<UInt8>, methods: VarlinkMethodNames? = nil) -> String? {
        VarlinkCallScanner.leadingMethod(message, methods: methods)
    }

    /// Reads a call from one message. `methods`, when given, are the method
    /// names the reader knows: a call naming one gets that very string (no
    /// copy is made of it).
    public init(message: ArraySlice<UInt8>, methods: VarlinkMethodNames? = nil) throws(DecodingFailure) {
        // The common shape (plain names and scalar parameters) is read in one
        // pass without building dictionaries; anything else goes through the
        // generic parser, which decides what is valid JSON.
        if let call = VarlinkCallScanner.scan(message, methods: methods) {
            self = call
        } else {
            try self.init(parsing: message, methods: methods)
        }
    }

    /// Reads a call with the generic JSON parser.
    private init(parsing message: ArraySlice<UInt8>, methods: VarlinkMethodNames?) throws(DecodingFailure) {
        let json: JSON
        do { json = try JSON.parse(message, maximumValues: VarlinkCall.maximumValues) } catch {
            throw .invalidJSON(error.description)
        }
        guard case .object(let o) = json else { throw .invalidField("message") }
        guard let method = o["method"]?.stringValue else { throw .invalidField("method") }
        self.method = methods?.known(method) ?? method
        switch o["parameters"] {
        case nil, .null?: parameters = [:]
        case .object(let p)?: parameters = VarlinkParameters(p)
        default: throw .invalidField("parameters")
        }
        more = o["more"]?.boolValue ?? false
        oneway = o["oneway"]?.boolValue ?? false
        upgrade = o["upgrade"]?.boolValue ?? false
    }
}

/// The parameters of a call: its members as they came, each name once. Calls
/// carry a handful, so a member is found by comparing names in turn, which
/// costs less than hashing them into a dictionary.
public struct VarlinkParameters: Sendable, Equatable, ExpressibleByDictionaryLiteral {
    /// One member.
    public struct Member: Sendable, Equatable {
        /// The member's name.
        public var name: String
        /// The member's value.
        public var value: JSON

        /// A member `name` with `value`.
        public init(name: String, value: JSON) {
            self.name = name
            self.value = value
        }
    }

    /// The members, each name once.
    public private(set) var members: [Member]

    /// No parameters.
    public init() { members = [] }

    /// The members of a JSON object.
    public init(_ object: [String: JSON]) {
        members = []
        members.reserveCapacity(object.count)
        for (name, value) in object { members.append(Member(name: name, value: value)) }
    }

    /// Members whose names the caller knows to be distinct.
    init(distinct members: [Member]) { self.members = members }

    public init(dictionaryLiteral elements: (String, JSON)...) {
        self.init(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }

    /// The value of member `name`, nil when there is none.
    public subscript(name: String) -> JSON? {
        index(of: name).map { members[$0].value }
    }

    /// The position of member `name` in `members`, nil when there is none.
    @inlinable @inline(__always)
    public func index(of name: String) -> Int? {
        // Lengths first: comparing two strings of different lengths is
        // otherwise the slow path of String's ==.
        let length = name.utf8.count
        for i in members.indices where members[i].name.utf8.count == length && members[i].name == name { return i }
        return nil
    }

    /// The number of members.
    public var count: Int { members.count }
    /// True when there are no members.
    public var isEmpty: Bool { members.isEmpty }
    /// The member names.
    public var names: [String] { members.map(\.name) }

    /// The members as a dictionary.
    public var dictionary: [String: JSON] {
        var out: [String: JSON] = [:]
        out.reserveCapacity(members.count)
        for member in members { out[member.name] = member.value }
        return out
    }

    /// Equal when the same names hold the same values, in whatever order.
    public static func == (lhs: VarlinkParameters, rhs: VarlinkParameters) -> Bool {
        guard lhs.count == rhs.count else { return false }
        return lhs.members.allSatisfy { rhs[$0.name] == $0.value }
    }
}

/// Method names a call reader recognises, so that a call naming one of them
/// reuses the name instead of allocating a copy of it.
public struct VarlinkMethodNames: Sendable {
    private var names: [String] = []
    private var bytes: [[UInt8]] = []

    /// No names.
    public init() {}

    /// Adds `name` (once) at the next index.
    public mutating func add(_ name: String) {
        guard index(of: name) == nil else { return }
        names.append(name)
        bytes.append(Array(name.utf8))
    }

    /// The index `name` was added at, nil if it was not. Lengths are
    /// compared first; a name read by this reader is the very string kept
    /// here, which compares equal at once.
    public func index(of name: String) -> Int? {
        let length = name.utf8.count
        for (i, candidate) in bytes.enumerated() where candidate.count == length && names[i] == name { return i }
        return nil
    }

    /// The known name equal to `name`, nil if none is.
    public func known(_ name: String) -> String? {
        index(of: name).map { names[$0] }
    }

    /// The known name spelled by `text`, nil if none is.
    func known(_ text: UnsafeBufferPointer<UInt8>) -> String? {
        for (i, candidate) in bytes.enumerated() where candidate.count == text.count {
            let same = candidate.withUnsafeBufferPointer { memcmp($0.baseAddress!, text.baseAddress!, text.count) == 0 }
            if same { return names[i] }
        }
        return nil
    }
}

extension VarlinkSignature {
    /// The parameter a call's `parameters` get wrong (see
    /// `invalidParameter(in:)` for a dictionary), by comparing names in turn.
    public func invalidParameter(in parameters: VarlinkParameters) -> String? {
        var known = 0
        for i in names.indices {
            if let j = parameters.index(of: names[i]) {
                known += 1
                let accepted =
                    flatChecks[i].accepts(parameters.members[j].value)
                    ?? self.parameters[i].check.accepts(parameters.members[j].value)
                if !accepted { return names[i] }
            } else if !flatChecks[i].nullable {
                return names[i]
            }
        }
        guard known < parameters.count else { return nil }
        return parameters.names.filter { name in !self.parameters.contains { $0.name == name } }.min()
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
