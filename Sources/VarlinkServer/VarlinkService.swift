import Varlink

/// What a method handler produces: a reply now (answered on the serving
/// thread), or work to await off it (the reply is sent when it finishes).
public enum HandlerOutcome: Sendable {
    case reply(VarlinkReply)
    /// A reply that appends its own JSON message (without the NUL) to the
    /// connection's output: for hot paths, where building a `VarlinkReply`
    /// costs more than writing the bytes. (A value, not a closure: a small
    /// one is carried without an allocation.)
    case encoded(any VarlinkReplyWriter)
    case deferred(@Sendable () async -> VarlinkReply)
    /// Start a stream: send its first reply (continues); its owner writes the
    /// rest through `VarlinkServer.Streams` until the client goes away.
    case stream(StreamStart)
}

/// A reply that writes its own JSON message.
public protocol VarlinkReplyWriter: Sendable {
    /// Appends the reply's JSON message, without the NUL, to `out`.
    func write(into out: inout [UInt8])
}

/// A method handler: the call and who made it in, an outcome out.
public typealias MethodHandler = @Sendable (VarlinkCall, Caller) -> HandlerOutcome

/// A Varlink service as data: the interfaces it implements, declared as
/// tables, with a handler bound to each method. Every call is checked against
/// its method's declaration before the handler runs: unknown interface or
/// method, `upgrade` (not supported), a streaming method without `more`, and
/// parameters that are missing, null, mistyped or undeclared are answered
/// with the `org.varlink.service` errors the Varlink specification names. The
/// serving loop knows nothing else.
public struct VarlinkService: Sendable {
    /// A method's checks, precomputed from its declaration, and its handler
    /// (nil for the `org.varlink.service` methods, which the service answers).
    struct Binding: Sendable {
        var signature: VarlinkSignature
        var handler: MethodHandler?
        /// The largest message a call of this method may be.
        var callSizeLimit: Int
    }

    /// A call that passed its method's checks, and where its binding is.
    struct CheckedCall {
        let call: VarlinkCall
        let binding: Int
    }

    /// The largest call of a method that declares no limit of its own: the
    /// parameters of most methods are a few names and numbers, and a call is
    /// refused before its parameters are parsed when it is larger (so a
    /// megabyte of numbers sent to such a method costs a scan, not a parse).
    public static let defaultCallSizeLimit = 64 << 10

    /// Interface name → its declaration. The definition text is rendered
    /// when a client asks for it (`GetInterfaceDescription`), not at start:
    /// wrapping every doc comment costs more than the rest of start-up's own
    /// work, for a call almost no client makes.
    public private(set) var interfaces: [String: VarlinkInterfaceDeclaration] = [:]
    /// The methods' checks and handlers, in the order of `methodNames`.
    private var bindings: [Binding] = []
    /// The full names of the methods, so that reading a call reuses them
    /// and finding a method's binding costs no hashing.
    public private(set) var methodNames = VarlinkMethodNames()
    /// What GetInfo answers.
    public var vendor: String
    public var product: String
    public var version: String
    public var url: String
    /// Called on the loop's thread once for every connection that
    /// closes, whoever closed it and why (the peer left, a timeout, a send
    /// that failed, the server stopping), with the caller of that connection
    /// (`Caller.connection` names it). A peer that leaves while a deferred
    /// call of its connection is in flight is closed once that call's work
    /// has finished; only a send that fails, or the end of the drain at a
    /// stop, closes a connection with work still in flight. Must return at
    /// once; what it returns (nil: nothing) runs off the loop as the server's
    /// work, cancelled if it still runs when the server stops.
    public var connectionClosed: (@Sendable (Caller) -> (@Sendable () async -> Void)?)?

    /// A service with the `org.varlink.service` methods bound.
    public init(vendor: String, product: String, version: String, url: String) {
        self.vendor = vendor
        self.product = product
        self.version = version
        self.url = url
        bind(VarlinkServiceInterface.declaration) { _ in nil }
    }

    /// Adds `interface`, binding each of its methods to the handler `handler`
    /// gives for it; `callSizeLimit` gives the largest message a call of each
    /// method may be (`defaultCallSizeLimit` unless it says otherwise).
    public mutating func add(
        _ interface: VarlinkInterfaceDeclaration,
        callSizeLimit: (VarlinkMethodDeclaration) -> Int = { _ in VarlinkService.defaultCallSizeLimit },
        handler: (VarlinkMethodDeclaration) -> MethodHandler
    ) {
        bind(interface, callSizeLimit: callSizeLimit, handler: handler)
    }

    private mutating func bind(
        _ interface: VarlinkInterfaceDeclaration,
        callSizeLimit: (VarlinkMethodDeclaration) -> Int = { _ in VarlinkService.defaultCallSizeLimit },
        handler: (VarlinkMethodDeclaration) -> MethodHandler?
    ) {
        interfaces[interface.name] = interface
        for method in interface.methods {
            guard let signature = interface.signature(of: method.name) else { continue }
            let binding = Binding(
                signature: signature, handler: handler(method), callSizeLimit: callSizeLimit(method))
            if let index = methodNames.index(of: signature.method) {
                bindings[index] = binding
            } else {
                methodNames.add(signature.method)
                bindings.append(binding)
            }
        }
    }

    /// The largest message a call of `method` may be: its own limit, or the
    /// default for a method the service does not have (which is answered
    /// `MethodNotFound` whatever its parameters).
    public func callSizeLimit(of method: String) -> Int {
        binding(of: method)?.callSizeLimit ?? VarlinkService.defaultCallSizeLimit
    }

    /// Answers one call: the `org.varlink.service` error for a call the
    /// interface does not allow, else the handler's outcome.
    public func handle(_ call: VarlinkCall, caller: Caller) -> HandlerOutcome {
        switch check(call) {
        case .refused(let outcome): return outcome
        case .passed(let checked): return run(checked, caller: caller)
        }
    }

    /// What `check` found of a call.
    enum CheckResult {
        case passed(CheckedCall)
        /// The `org.varlink.service` error the call is answered with.
        case refused(HandlerOutcome)
    }

    /// Checks `call` against its method's declaration.
    func check(_ call: VarlinkCall) -> CheckResult {
        guard let index = methodNames.index(of: call.method) else {
            let interface = call.interface
            if interfaces[interface] != nil { return .refused(.reply(VarlinkServiceError.methodNotFound(call.method))) }
            return .refused(.reply(VarlinkServiceError.interfaceNotFound(interface)))
        }
        let binding = bindings[index]
        // No method here takes over the connection: the specification names no
        // error for that, so the flag is refused as an invalid parameter of the call.
        if call.upgrade { return .refused(.reply(VarlinkServiceError.invalidParameter("upgrade"))) }
        // A stream needs more; without it (or with oneway, which wants no reply
        // at all) nothing is started. A method that does not stream answers a
        // call with more once, without continues, as the specification allows.
        if binding.signature.streams && (!call.more || call.oneway) {
            return .refused(.reply(VarlinkServiceError.expectedMore()))
        }
        if let parameter = binding.signature.invalidParameter(in: call.parameters) {
            return .refused(.reply(VarlinkServiceError.invalidParameter(parameter)))
        }
        return .passed(CheckedCall(call: call, binding: index))
    }

    /// Answers a call that passed `check`: its handler's outcome.
    func run(_ checked: CheckedCall, caller: Caller) -> HandlerOutcome {
        guard let handler = bindings[checked.binding].handler else { return answerService(checked.call) }
        return handler(checked.call, caller)
    }

    private func binding(of method: String) -> Binding? {
        methodNames.index(of: method).map { bindings[$0] }
    }

    /// Answers the `org.varlink.service` methods.
    private func answerService(_ call: VarlinkCall) -> HandlerOutcome {
        switch call.method {
        case ServiceMethod.getInfo.rawValue:
            // org.varlink.service first, then the others by name.
            let names =
                [VarlinkServiceInterface.name]
                + interfaces.keys.filter { $0 != VarlinkServiceInterface.name }.sorted()
            return .reply(
                VarlinkReply(parameters: [
                    "vendor": .string(vendor), "product": .string(product), "version": .string(version),
                    "url": .string(url), "interfaces": .array(names.map(JSON.string)),
                ]))
        case ServiceMethod.getInterfaceDescription.rawValue:
            let name = call.parameters["interface"]?.stringValue ?? ""
            guard let interface = interfaces[name] else {
                return .reply(VarlinkServiceError.interfaceNotFound(name))
            }
            return .reply(VarlinkReply(parameters: ["description": .string(interface.idl)]))
        default:
            return .reply(VarlinkServiceError.methodNotImplemented(call.method))
        }
    }
}
