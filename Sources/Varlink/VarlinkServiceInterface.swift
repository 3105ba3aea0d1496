/// The interface `org.varlink.service` that every Varlink service provides,
/// as the Varlink specification defines it, declared as data like
/// `io.vaultd.Vault`, so that its calls are checked the same way.
public enum VarlinkServiceInterface {
    /// The interface name.
    public static let name = "org.varlink.service"

    /// The interface, as data.
    public static let declaration = VarlinkInterfaceDeclaration(
        name,
        doc: """
            The Varlink Service Interface is provided by every varlink service. It
            describes the service and the interfaces it implements.
            """,
        types: [],
        methods: [
            VarlinkMethodDeclaration(
                "GetInfo",
                doc: """
                    Get a list of all the interfaces a service provides and information
                    about the implementation.
                    """,
                parameters: [],
                output: [
                    VarlinkField("vendor", .string), VarlinkField("product", .string),
                    VarlinkField("version", .string), VarlinkField("url", .string),
                    VarlinkField("interfaces", .array(.string)),
                ]),
            VarlinkMethodDeclaration(
                "GetInterfaceDescription",
                doc: "Get the description of an interface that is implemented by this service.",
                parameters: [VarlinkField("interface", .string)],
                output: [VarlinkField("description", .string)]),
        ],
        errors: [
            VarlinkErrorDeclaration(
                "InterfaceNotFound", doc: "The requested interface was not found.",
                parameters: [VarlinkField("interface", .string)]),
            VarlinkErrorDeclaration(
                "MethodNotFound", doc: "The requested method was not found",
                parameters: [VarlinkField("method", .string)]),
            VarlinkErrorDeclaration(
                "MethodNotImplemented",
                doc: """
                    The interface defines the requested method, but the service does not
                    implement it.
                    """,
                parameters: [VarlinkField("method", .string)]),
            VarlinkErrorDeclaration(
                "InvalidParameter", doc: "One of the passed parameters is invalid.",
                parameters: [VarlinkField("parameter", .string)]),
            VarlinkErrorDeclaration("PermissionDenied", doc: "Client is denied access", parameters: []),
            VarlinkErrorDeclaration(
                "ExpectedMore", doc: "Method is expected to be called with 'more' set to true, but wasn't",
                parameters: []),
        ])

    /// The interface definition text.
    public static let description = declaration.idl
}

/// The methods of `org.varlink.service`.
public enum ServiceMethod: String, Sendable, CaseIterable {
    case getInfo = "org.varlink.service.GetInfo"
    case getInterfaceDescription = "org.varlink.service.GetInterfaceDescription"
}
