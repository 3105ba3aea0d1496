import VaultCore
import VaultProtocol

/// What a method handler produces: a reply now (answered on the serving
/// thread), or work to await off it (the reply is sent when it finishes).
public enum HandlerOutcome: Sendable {
    case reply(VarlinkReply)
    /// A reply that appends its own JSON message (without the NUL) to the
    /// connection's output: for the hot GetToken path, where building a
    /// `VarlinkReply` costs more than writing the bytes.
    case encoded(@Sendable (inout [UInt8]) -> Void)
    case deferred(@Sendable () async -> VarlinkReply)
    /// Start a stream: send `snapshot` (continues), then every published event
    /// that `filter` passes, until the client goes away.
    case subscribe(snapshot: VarlinkReply, filter: @Sendable (VaultEvent) -> Bool)
}

/// A method handler: the call and who made it in, an outcome out.
public typealias MethodHandler = @Sendable (VarlinkCall, Caller) -> HandlerOutcome

/// A Varlink service as data: interfaces with their descriptions and a table
/// from full method name to handler. The serving loop knows nothing else.
public struct VarlinkService: Sendable {
    /// Interface name → interface definition text.
    public var interfaces: [String: String]
    /// Full method name → handler.
    public var methods: [String: MethodHandler]
    /// What GetInfo answers.
    public var vendor: String
    public var product: String
    public var version: String
    public var url: String

    /// A service with the `org.varlink.service` methods bound.
    public init(vendor: String, product: String, version: String, url: String) {
        self.vendor = vendor
        self.product = product
        self.version = version
        self.url = url
        self.interfaces = [:]
        self.methods = [:]
    }

    /// Answers one call.
    public func handle(_ call: VarlinkCall, caller: Caller) -> HandlerOutcome {
        switch call.method {
        case ServiceMethod.getInfo.rawValue:
            let names = ([VarlinkServiceError.interface] + interfaces.keys.sorted()).map(JSON.string)
            return .reply(
                VarlinkReply(parameters: [
                    "vendor": .string(vendor), "product": .string(product), "version": .string(version),
                    "url": .string(url), "interfaces": .array(names),
                ]))
        case ServiceMethod.getInterfaceDescription.rawValue:
            guard let name = call.parameters["interface"]?.stringValue else {
                return .reply(VarlinkServiceError.invalidParameter("interface"))
            }
            if name == VarlinkServiceError.interface {
                return .reply(VarlinkReply(parameters: ["description": .string(VarlinkService.serviceInterface)]))
            }
            guard let description = interfaces[name] else {
                return .reply(VarlinkServiceError.interfaceNotFound(name))
            }
            return .reply(VarlinkReply(parameters: ["description": .string(description)]))
        default:
            if let handler = methods[call.method] { return handler(call, caller) }
            let interface = call.interface
            if interface == VarlinkServiceError.interface || interfaces[interface] != nil {
                return .reply(VarlinkServiceError.methodNotFound(call.method))
            }
            return .reply(VarlinkServiceError.interfaceNotFound(interface))
        }
    }

    /// The standard `org.varlink.service` interface, as the Varlink spec defines it.
    static let serviceInterface = """
        # The Varlink Service Interface is provided by every varlink service. It
        # describes the service and the interfaces it implements.
        interface org.varlink.service

        # Get a list of all the interfaces a service provides and information
        # about the implementation.
        method GetInfo() -> (
          vendor: string,
          product: string,
          version: string,
          url: string,
          interfaces: []string
        )

        # Get the description of an interface that is implemented by this service.
        method GetInterfaceDescription(interface: string) -> (description: string)

        # The requested interface was not found.
        error InterfaceNotFound (interface: string)

        # The requested method was not found
        error MethodNotFound (method: string)

        # The interface defines the requested method, but the service does not
        # implement it.
        error MethodNotImplemented (method: string)

        # One of the passed parameters is invalid.
        error InvalidParameter (parameter: string)

        # Client is denied access
        error PermissionDenied ()

        # Method is expected to be called with 'more' set to true, but wasn't
        error ExpectedMore ()
        """
}
