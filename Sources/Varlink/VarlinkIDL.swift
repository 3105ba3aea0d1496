/// A type of Varlink's interface definition language, as a parameter, an
/// output member or a field of a named type declares it.
public indirect enum VarlinkType: Sendable, Equatable {
    case bool
    case int
    case float
    case string
    /// Any JSON object (`object`).
    case object
    /// An array of the element type (`[]T`).
    case array(VarlinkType)
    /// The type, or null, or absent (`?T`).
    case nullable(VarlinkType)
    /// A type the interface declares (`type Name ...`).
    case named(String)

    /// The type as the interface definition writes it.
    public var idl: String {
        switch self {
        case .bool: return "bool"
        case .int: return "int"
        case .float: return "float"
        case .string: return "string"
        case .object: return "object"
        case .array(let element): return "[]" + element.idl
        case .nullable(let wrapped): return "?" + wrapped.idl
        case .named(let name): return name
        }
    }
}

/// A named, typed member: a method's parameter or output, a struct type's
/// field, an error's parameter.
public struct VarlinkField: Sendable, Equatable {
    public var name: String
    public var type: VarlinkType
    /// What the member means; rendered as a comment above it.
    public var doc: String?

    /// A member `name` of `type`.
    public init(_ name: String, _ type: VarlinkType, doc: String? = nil) {
        self.name = name
        self.type = type
        self.doc = doc
    }

    /// Null or absent is allowed.
    public var isNullable: Bool {
        if case .nullable = type { return true }
        return false
    }
}

/// A `type` declaration: a struct of fields or an enum of names.
public struct VarlinkTypeDeclaration: Sendable, Equatable {
    /// What the type is made of.
    public enum Shape: Sendable, Equatable {
        case structure([VarlinkField])
        case enumeration([String])
    }

    public var name: String
    public var doc: String
    public var shape: Shape

    /// A type `name` of `shape`, described by `doc`.
    public init(_ name: String, doc: String, _ shape: Shape) {
        self.name = name
        self.doc = doc
        self.shape = shape
    }
}

/// A `method` declaration: its input, its output, whether it streams.
public struct VarlinkMethodDeclaration: Sendable, Equatable {
    /// The method's name within its interface (`GetToken`).
    public var name: String
    public var doc: String
    public var parameters: [VarlinkField]
    public var output: [VarlinkField]
    /// Answers with several replies and must be called with `more`
    /// (`org.varlink.service.ExpectedMore` otherwise).
    public var streams: Bool

    /// A method `name` taking `parameters` and answering `output`.
    public init(
        _ name: String, doc: String, parameters: [VarlinkField], output: [VarlinkField], streams: Bool = false
    ) {
        self.name = name
        self.doc = doc
        self.parameters = parameters
        self.output = output
        self.streams = streams
    }
}

/// An `error` declaration.
public struct VarlinkErrorDeclaration: Sendable, Equatable {
    /// The error's name within its interface (`NotLoggedIn`).
    public var name: String
    public var doc: String
    public var parameters: [VarlinkField]

    /// An error `name` with `parameters`.
    public init(_ name: String, doc: String, parameters: [VarlinkField]) {
        self.name = name
        self.doc = doc
        self.parameters = parameters
    }
}

/// A Varlink interface as data: the interface definition text, the
/// validation of calls and the binding of handlers all derive from it.
public struct VarlinkInterfaceDeclaration: Sendable, Equatable {
    /// The interface's reverse-domain name (`io.vaultd.Vault`).
    public var name: String
    public var doc: String
    public var types: [VarlinkTypeDeclaration]
    public var methods: [VarlinkMethodDeclaration]
    public var errors: [VarlinkErrorDeclaration]

    /// An interface `name` made of `types`, `methods` and `errors`.
    public init(
        _ name: String, doc: String, types: [VarlinkTypeDeclaration], methods: [VarlinkMethodDeclaration],
        errors: [VarlinkErrorDeclaration]
    ) {
        self.name = name
        self.doc = doc
        self.types = types
        self.methods = methods
        self.errors = errors
    }

    /// The method `name` (short, `GetToken`), if declared.
    public func method(_ name: String) -> VarlinkMethodDeclaration? { methods.first { $0.name == name } }
}

// MARK: Rendering

extension VarlinkInterfaceDeclaration {
    /// Lines up to this width are kept whole; longer member lists get a line each.
    static let lineWidth = 100

    /// The interface in Varlink's interface definition language, as
    /// `GetInterfaceDescription` answers it: the doc, the interface line, then
    /// types, methods and errors, each after its doc comment and a blank line.
    /// No newline at the end.
    public var idl: String {
        var blocks: [String] = [Self.comment(doc) + "interface \(name)"]
        for type in types {
            switch type.shape {
            case .structure(let fields):
                blocks.append(Self.comment(type.doc) + "type \(type.name) " + Self.fieldList(fields, forceLines: true))
            case .enumeration(let names):
                blocks.append(Self.comment(type.doc) + "type \(type.name) (" + names.joined(separator: ", ") + ")")
            }
        }
        for method in methods { blocks.append(Self.comment(method.doc) + Self.signature(method)) }
        for error in errors {
            let head = "error \(error.name) "
            blocks.append(Self.comment(error.doc) + head + Self.fieldList(error.parameters, prefix: head))
        }
        return blocks.joined(separator: "\n\n")
    }

    /// `# ` before each line of `doc`, and a newline after each.
    static func comment(_ doc: String?, indent: String = "") -> String {
        guard let doc, !doc.isEmpty else { return "" }
        return doc.split(separator: "\n", omittingEmptySubsequences: false)
            .map { $0.isEmpty ? "\(indent)#\n" : "\(indent)# \($0)\n" }.joined()
    }

    /// `(a: T, b: U)` on one line when it fits and no member has a doc, else
    /// one member a line.
    static func fieldList(_ fields: [VarlinkField], prefix: String = "", forceLines: Bool = false) -> String {
        let inline = "(" + fields.map { "\($0.name): \($0.type.idl)" }.joined(separator: ", ") + ")"
        let documented = fields.contains { $0.doc != nil }
        if fields.isEmpty || (!forceLines && !documented && prefix.count + inline.count <= lineWidth) { return inline }
        let lines = fields.map { comment($0.doc, indent: "  ") + "  \($0.name): \($0.type.idl)" }
        return "(\n" + lines.joined(separator: ",\n") + "\n)"
    }

    /// `method Name(...) -> (...)`: on one line when it fits, else the
    /// parameters a line each, then the output on the closing line when that fits.
    static func signature(_ method: VarlinkMethodDeclaration) -> String {
        let head = "method \(method.name)"
        let oneLine = head + fieldList(method.parameters) + " -> " + fieldList(method.output)
        let documented = (method.parameters + method.output).contains { $0.doc != nil }
        if !documented && !oneLine.contains("\n") && oneLine.count <= lineWidth { return oneLine }
        let input = fieldList(method.parameters, forceLines: !method.parameters.isEmpty)
        // The line the output starts on: the closing parenthesis, or the whole head without parameters.
        let lastLine = method.parameters.isEmpty ? head + input : ")"
        return head + input + " -> " + fieldList(method.output, prefix: lastLine + " -> ")
    }
}

// MARK: Validation

/// A method's parameters resolved against its interface's types, so that a
/// call is checked by walking its declared parameters once: no allocation
/// for a valid call.
public struct VarlinkSignature: Sendable {
    /// What a value must be; named types resolved.
    indirect enum Check: Sendable {
        case bool, int, float, string, object
        case array(Check)
        case nullable(Check)
        case structure([Member])
        case enumeration([String])

        func accepts(_ value: JSON) -> Bool {
            switch (self, value) {
            case (.nullable, .null): return true
            case (.nullable(let wrapped), _): return wrapped.accepts(value)
            case (.bool, .bool), (.float, .number), (.string, .string), (.object, .object): return true
            case (.int, _): return value.integerValue != nil
            case (.array(let element), .array(let values)):
                for value in values where !element.accepts(value) { return false }
                return true
            case (.structure(let members), .object(let object)): return Check.offending(members, in: object) == nil
            case (.enumeration(let names), .string(let name)): return names.contains(name)
            default: return false
            }
        }

        /// The first member of `members` that `object` lacks or holds with the
        /// wrong type, in declaration order; else an unknown member of
        /// `object` (the least, so the answer does not depend on hashing);
        /// else nil.
        static func offending(_ members: [Member], in object: [String: JSON]) -> String? {
            var known = 0
            for member in members {
                if let value = object[member.name] {
                    known += 1
                    if !member.accepts(value) { return member.name }
                } else if !member.nullable {
                    return member.name
                }
            }
            guard known < object.count else { return nil }
            return object.keys.filter { key in !members.contains { $0.name == key } }.min()
        }
    }

    /// A declared member and what its value must be.
    struct Member: Sendable {
        var name: String
        var check: Check
        /// `check` read without touching the indirect enum (a retain and a
        /// release per look) when it is a scalar type, maybe nullable.
        let flat: Flat
        /// Null is allowed.
        var nullable: Bool { flat.nullable }

        /// A check that holds no reference: a scalar type (nil: another
        /// type, see `check`) and whether null is allowed.
        struct Flat: Sendable {
            var scalar: Scalar?
            var nullable: Bool

            /// Whether `value` passes, for a scalar type; nil: ask `check`.
            @inline(__always)
            func accepts(_ value: JSON) -> Bool? {
                guard let scalar else { return nil }
                switch (scalar, value) {
                case (_, .null): return nullable
                case (.bool, .bool), (.float, .number), (.string, .string), (.object, .object): return true
                case (.int, .number(let d)): return JSON.integer(d) != nil
                default: return false
                }
            }
        }

        init(name: String, check: Check) {
            self.name = name
            self.check = check
            var inner = check
            var nullable = false
            if case .nullable(let wrapped) = check {
                inner = wrapped
                nullable = true
            }
            let scalar: Scalar?
            switch inner {
            case .bool: scalar = .bool
            case .int: scalar = .int
            case .float: scalar = .float
            case .string: scalar = .string
            case .object: scalar = .object
            default: scalar = nil
            }
            flat = Flat(scalar: scalar, nullable: nullable)
        }

        /// `check.accepts(value)`, with scalar types decided without `check`.
        func accepts(_ value: JSON) -> Bool {
            flat.accepts(value) ?? check.accepts(value)
        }
    }

    /// The scalar types of `Check`.
    enum Scalar: UInt8, Sendable { case bool, int, float, string, object }

    /// The method's full name, `interface.Method`.
    public let method: String
    /// The method must be called with `more`.
    public let streams: Bool
    let parameters: [Member]
    /// The parameters' names and scalar checks side by side, so that checking
    /// a call copies no `Member` (and retains no `Check`).
    let names: [String]
    let flatChecks: [Member.Flat]

    init(method: String, streams: Bool, parameters: [Member]) {
        self.method = method
        self.streams = streams
        self.parameters = parameters
        names = parameters.map(\.name)
        flatChecks = parameters.map(\.flat)
    }

    /// The parameter a call's `parameters` get wrong, for
    /// `org.varlink.service.InvalidParameter`: a missing one that is not
    /// nullable, null where that is not allowed, a value of the wrong type
    /// (inside named types too), or a member the interface does not declare.
    /// Nil when they are what the interface declares.
    public func invalidParameter(in parameters: [String: JSON]) -> String? {
        Check.offending(self.parameters, in: parameters)
    }
}

extension VarlinkInterfaceDeclaration {
    /// The signature of the method `name`, its named types resolved; nil
    /// when the interface declares no such method.
    public func signature(of name: String) -> VarlinkSignature? {
        guard let method = method(name) else { return nil }
        return VarlinkSignature(
            method: "\(self.name).\(method.name)", streams: method.streams,
            parameters: method.parameters.map { VarlinkSignature.Member(name: $0.name, check: check($0.type)) })
    }

    /// Every method's signature, by full name.
    public var signatures: [String: VarlinkSignature] {
        var out: [String: VarlinkSignature] = [:]
        for method in methods { out["\(name).\(method.name)"] = signature(of: method.name) }
        return out
    }

    private func check(_ type: VarlinkType, depth: Int = 0) -> VarlinkSignature.Check {
        switch type {
        case .bool: return .bool
        case .int: return .int
        case .float: return .float
        case .string: return .string
        case .object: return .object
        case .array(let element): return .array(check(element, depth: depth))
        case .nullable(let wrapped): return .nullable(check(wrapped, depth: depth))
        case .named(let typeName):
            guard let declared = types.first(where: { $0.name == typeName }) else {
                preconditionFailure("interface \(name) uses the undeclared type \(typeName)")
            }
            // A type that contains itself would resolve forever; no interface here has one.
            precondition(depth < 16, "type \(typeName) of \(name) nests too deep")
            switch declared.shape {
            case .enumeration(let names): return .enumeration(names)
            case .structure(let fields):
                return .structure(fields.map { .init(name: $0.name, check: check($0.type, depth: depth + 1)) })
            }
        }
    }
}
