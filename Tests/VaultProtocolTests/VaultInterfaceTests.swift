import Foundation
import Testing
import Varlink
import VaultCore
import VaultProtocol

/// The repository's root, found from this file's path: Tests/VaultProtocolTests/<file>.
private let repositoryRoot = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// Where the rendered interface is checked in.
private let docsFile = repositoryRoot.appendingPathComponent("docs/io.vaultd.Vault.varlink")

@Suite("VaultInterface", .timeLimit(.minutes(5)))
struct VaultInterfaceTests {
    /// Run with `VAULTD_REGENERATE_IDL=1` to write the file from the table instead.
    @Test("Should match docs/io.vaultd.Vault.varlink, which is rendered from the table")
    func matchesDocs() throws {
        let rendered = VaultInterface.description + "\n"
        if ProcessInfo.processInfo.environment["VAULTD_REGENERATE_IDL"] == "1" {
            try rendered.write(to: docsFile, atomically: true, encoding: .utf8)
        }
        let file = try String(contentsOf: docsFile, encoding: .utf8)
        #expect(
            rendered == file,
            "docs/io.vaultd.Vault.varlink differs from the table; regenerate it with VAULTD_REGENERATE_IDL=1 swift test --filter VaultInterfaceTests/matchesDocs"
        )
    }

    @Test("Should be the interface io.vaultd.Vault")
    func name() {
        #expect(VaultInterface.name == "io.vaultd.Vault")
        #expect(VaultInterface.description.split(separator: "\n").contains("interface io.vaultd.Vault"))
    }

    @Test(
        "Should declare every error code with vaultd's code and message and the provider's",
        arguments: VaultError.Code.allCases)
    func declaresError(code: VaultError.Code) {
        // A declaration too long for one line has a field per line: read it as one.
        let lines = VaultInterface.description.replacingOccurrences(of: "(\n  ", with: "(")
            .replacingOccurrences(of: ",\n  ", with: ", ").replacingOccurrences(of: "\n)", with: ")")
            .split(separator: "\n").map(String.init)
        let retryAt = code.declaration.retryAt ? ", retryAt: ?int" : ""
        #expect(
            lines.contains(
                "error \(code.varlinkErrorName) (code: string, message: string, providerCode: ?string, providerMessage: ?string\(retryAt))"
            ))
        #expect(
            VaultInterface.description.contains(
                "# " + code.declaration.doc.replacingOccurrences(of: "\n", with: "\n# ")))
    }

    @Test("Should declare no error without a code")
    func noExtraErrors() {
        let declared = VaultInterface.description.split(separator: "\n").filter { $0.hasPrefix("error ") }.count
        #expect(declared == VaultError.Code.allCases.count)
    }

    @Test("Should declare every method under its own name", arguments: VaultMethod.allCases)
    func declaresMethod(method: VaultMethod) throws {
        #expect(method.rawValue == "io.vaultd.Vault.\(method.declaration.name)")
        #expect(VaultInterface.description.contains("\nmethod \(method.declaration.name)("))
    }

    @Test("Should declare no method that is not a VaultMethod")
    func noExtraMethods() {
        let declared = VaultInterface.description.split(separator: "\n").filter { $0.hasPrefix("method ") }.count
        #expect(declared == VaultMethod.allCases.count)
    }

    @Test("Should resolve every named type a method uses", arguments: VaultMethod.allCases)
    func resolvesTypes(method: VaultMethod) throws {
        let signature = try #require(VaultInterface.declaration.signature(of: method.declaration.name))
        #expect(signature.method == method.rawValue)
        #expect(signature.streams == (method == .subscribe))
    }

    @Test("Should render org.varlink.service as the Varlink specification writes it")
    func serviceInterface() {
        let text = VarlinkServiceInterface.description
        #expect(text.hasPrefix("# The Varlink Service Interface is provided by every varlink service. It\n"))
        #expect(
            text.contains(
                "method GetInfo() -> (\n  vendor: string,\n  product: string,\n  version: string,\n  url: string,\n  interfaces: []string\n)"
            ))
        #expect(text.contains("\nmethod GetInterfaceDescription(interface: string) -> (description: string)\n"))
        #expect(
            text.hasSuffix(
                "# Method is expected to be called with 'more' set to true, but wasn't\nerror ExpectedMore ()"))
    }
}

/// The table rendered as interface definition text.
@Suite("Varlink IDL rendering", .timeLimit(.minutes(5)))
struct VarlinkRenderingTests {
    static let sample = VarlinkInterfaceDeclaration(
        "com.example.Fidget",
        doc: "A fidget.\n\nTwo paragraphs.",
        types: [
            VarlinkTypeDeclaration("Color", doc: "A color.", .enumeration(["red", "green"])),
            VarlinkTypeDeclaration(
                "Spin", doc: "A spin.",
                .structure([VarlinkField("speed", .int), VarlinkField("color", .nullable(.named("Color")))])),
        ],
        methods: [
            VarlinkMethodDeclaration(
                "Spin", doc: "Spins.", parameters: [VarlinkField("times", .nullable(.int))],
                output: [VarlinkField("spins", .array(.named("Spin")))]),
            VarlinkMethodDeclaration(
                "Watch", doc: "Watches.",
                parameters: [
                    VarlinkField("tags", .nullable(.array(.string)), doc: "Only these."),
                    VarlinkField("ratio", .float),
                ],
                output: [VarlinkField("spin", .named("Spin"))], streams: true),
        ],
        errors: [
            VarlinkErrorDeclaration("Stuck", doc: "It is stuck.", parameters: [VarlinkField("why", .string)]),
            VarlinkErrorDeclaration("Gone", doc: "Gone.", parameters: []),
        ])

    @Test("Should render docs, types, methods and errors in order, long or documented lists a member a line")
    func renders() {
        let expected = """
            # A fidget.
            #
            # Two paragraphs.
            interface com.example.Fidget

            # A color.
            type Color (red, green)

            # A spin.
            type Spin (
              speed: int,
              color: ?Color
            )

            # Spins.
            method Spin(times: ?int) -> (spins: []Spin)

            # Watches.
            method Watch(
              # Only these.
              tags: ?[]string,
              ratio: float
            ) -> (spin: Spin)

            # It is stuck.
            error Stuck (why: string)

            # Gone.
            error Gone ()
            """
        #expect(VarlinkRenderingTests.sample.idl == expected)
    }

    @Test("Should write each type as the IDL does")
    func typeNames() {
        #expect(VarlinkType.nullable(.array(.nullable(.string))).idl == "?[]?string")
        #expect(VarlinkType.array(.named("Session")).idl == "[]Session")
        #expect(VarlinkType.object.idl == "object")
        #expect(VarlinkType.float.idl == "float")
        #expect(VarlinkType.bool.idl == "bool")
    }

    @Test("Should keep the vault interface's long signatures a parameter a line")
    func longSignatures() {
        let text = VaultInterface.description
        #expect(text.contains("method Login(\n  provider: string,\n  user: string,\n  token: ?string,\n"))
        #expect(
            text.contains(
                "  ownerUid: ?int,\n  waitSeconds: ?int\n) -> (\n  token: string,\n  tokenType: ?string,\n  expiresAt: ?int,\n"
                    + "  instanceUrl: ?string,\n  ownerUid: int,\n  scope: ?string\n)\n"
            ))
        #expect(text.contains("\nmethod Logout(provider: string, user: string, ownerUid: ?int) -> ()\n"))
    }
}

/// A call's parameters checked against the table before any handler runs.
@Suite("Varlink parameter validation", .timeLimit(.minutes(5)))
struct VarlinkValidationTests {
    /// The offending parameter, found alike in a call's members (the serving
    /// path, with its scalar checks read flat) and in a dictionary.
    func invalid(_ method: VaultMethod, _ parameters: [String: JSON]) -> String? {
        let signature = VaultInterface.declaration.signature(of: method.declaration.name)!
        let fromMembers = signature.invalidParameter(in: VarlinkParameters(parameters))
        #expect(fromMembers == signature.invalidParameter(in: parameters), "\(method) \(parameters)")
        return fromMembers
    }

    @Test("Should accept well-formed calls, with nullable parameters absent or null")
    func accepts() {
        #expect(invalid(.getToken, ["provider": "demo", "user": "alice"]) == nil)
        #expect(
            invalid(.getToken, ["provider": "demo", "user": "alice", "minValidSeconds": 60, "ownerUid": nil]) == nil)
        #expect(invalid(.listSessions, [:]) == nil)
        #expect(invalid(.subscribe, ["kinds": ["loginSuccess"], "provider": nil]) == nil)
        #expect(
            invalid(
                .login,
                [
                    "provider": "demo", "user": "u", "token": "t",
                    "profile": ["uid": "u", "name": "U", "metadata": ["a": 1], "lastActiveAt": 5],
                    "tokenResponse": ["access_token": "x", "anything": [1, 2]],
                ]) == nil)
    }

    @Test("Should name a missing parameter that is not nullable")
    func missing() {
        #expect(invalid(.getToken, ["user": "alice"]) == "provider")
        #expect(invalid(.login, ["provider": "demo"]) == "user")
        #expect(invalid(.setProviderSecret, ["provider": "p"]) == "secret")
    }

    @Test("Should name a parameter that is null where it may not be")
    func nullNotAllowed() {
        #expect(invalid(.getToken, ["provider": nil, "user": "alice"]) == "provider")
        #expect(invalid(.getSession, ["provider": "p", "user": .null]) == "user")
    }

    @Test(
        "Should name a parameter of the wrong type",
        arguments: [
            ("provider", JSON.int(42)), ("user", JSON.bool(true)), ("minValidSeconds", JSON.string("60")),
            ("minValidSeconds", JSON.number(1.5)), ("ownerUid", JSON.array([])),
        ])
    func wrongType(name: String, value: JSON) {
        var parameters: [String: JSON] = ["provider": "demo", "user": "alice"]
        parameters[name] = value
        #expect(invalid(.getToken, parameters) == name)
    }

    @Test("Should check inside arrays and named types, naming the top-level parameter")
    func nested() {
        #expect(invalid(.subscribe, ["kinds": ["loginSuccess", 3]]) == "kinds")
        #expect(invalid(.subscribe, ["kinds": "loginSuccess"]) == "kinds")
        #expect(invalid(.login, ["provider": "p", "user": "u", "profile": ["name": "no uid"]]) == "profile")
        #expect(invalid(.login, ["provider": "p", "user": "u", "profile": ["uid": "u", "extra": 1]]) == "profile")
        #expect(
            invalid(.login, ["provider": "p", "user": "u", "profile": ["uid": "u", "lastActiveAt": "x"]]) == "profile")
        #expect(invalid(.login, ["provider": "p", "user": "u", "tokenResponse": "text"]) == "tokenResponse")
    }

    @Test("Should name a parameter the interface does not declare")
    func unknown() {
        #expect(invalid(.getToken, ["provider": "demo", "user": "alice", "colour": "blue"]) == "colour")
        #expect(invalid(.listSessions, ["b": 1, "a": 2]) == "a")
    }

    @Test("Should report declared parameters before unknown ones, in declaration order")
    func order() {
        #expect(invalid(.getToken, ["zzz": 1, "user": 5]) == "provider")
        #expect(invalid(.getToken, ["zzz": 1, "provider": "p", "user": 5]) == "user")
    }

    @Test("Should check enum types by their names")
    func enums() throws {
        let signature = try #require(VarlinkRenderingTests.sample.signature(of: "Spin"))
        #expect(signature.invalidParameter(in: ["times": 3]) == nil)
        let watch = try #require(VarlinkRenderingTests.sample.signature(of: "Watch"))
        #expect(watch.invalidParameter(in: ["ratio": .number(1.5)]) == nil)
        #expect(watch.invalidParameter(in: ["ratio": "fast"]) == "ratio")
        #expect(watch.streams)
        let withEnum = VarlinkInterfaceDeclaration(
            "com.example.E", doc: "", types: VarlinkRenderingTests.sample.types,
            methods: [
                VarlinkMethodDeclaration(
                    "Paint", doc: "", parameters: [VarlinkField("color", .named("Color"))], output: [])
            ], errors: [])
        let paint = try #require(withEnum.signature(of: "Paint"))
        #expect(paint.invalidParameter(in: ["color": "red"]) == nil)
        #expect(paint.invalidParameter(in: ["color": "blue"]) == "color")
        #expect(withEnum.signature(of: "Nope") == nil)
    }
}
