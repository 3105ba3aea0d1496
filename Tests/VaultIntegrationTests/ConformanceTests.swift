import Foundation
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// The daemon against the Varlink specification: every call is checked
/// against the interface's table before a handler runs.
@Suite("Varlink conformance", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ConformanceTests {
    let fixture: DaemonFixture

    init() throws { fixture = try DaemonFixture() }

    /// Sends one raw call and returns its reply.
    func call(_ c: VarlinkClient, _ text: String) throws -> VarlinkReply {
        try c.send(text)
        return try #require(try c.nextReply())
    }

    @Test("Should answer a method of an unknown interface with InterfaceNotFound naming the interface")
    func interfaceNotFound() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let reply = try call(c, #"{"method":"com.example.Nope.Call","parameters":{}}"#)
        #expect(reply.error == "org.varlink.service.InterfaceNotFound")
        #expect(reply.parameters["interface"]?.stringValue == "com.example.Nope")
        let described = try call(
            c,
            #"{"method":"org.varlink.service.GetInterfaceDescription","parameters":{"interface":"com.example.Nope"}}"#)
        #expect(described.error == "org.varlink.service.InterfaceNotFound")
        #expect(described.parameters["interface"]?.stringValue == "com.example.Nope")
    }

    @Test("Should answer an unknown method of a known interface with MethodNotFound naming the method")
    func methodNotFound() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        for method in ["io.vaultd.Vault.Frobnicate", "org.varlink.service.Frobnicate"] {
            let reply = try call(c, #"{"method":"\#(method)"}"#)
            #expect(reply.error == "org.varlink.service.MethodNotFound")
            #expect(reply.parameters["method"]?.stringValue == method)
        }
    }

    @Test(
        "Should answer InvalidParameter naming the field before the handler runs",
        arguments: [
            // Missing and not nullable.
            (#"{"user":"u"}"#, "provider"),
            // Null where not nullable.
            (#"{"provider":null,"user":"u"}"#, "provider"),
            // The wrong type.
            (#"{"provider":"demo","user":7}"#, "user"),
            (#"{"provider":"demo","user":"u","minValidSeconds":"soon"}"#, "minValidSeconds"),
            // A field the interface does not declare.
            (#"{"provider":"demo","user":"u","colour":"blue"}"#, "colour"),
        ])
    func invalidParameter(parameters: String, name: String) throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let reply = try call(c, #"{"method":"io.vaultd.Vault.GetToken","parameters":\#(parameters)}"#)
        #expect(reply.error == "org.varlink.service.InvalidParameter")
        #expect(reply.parameters["parameter"]?.stringValue == name)
    }

    @Test("Should check the org.varlink.service methods and named types the same way")
    func invalidParameterElsewhere() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let extra = try call(c, #"{"method":"org.varlink.service.GetInfo","parameters":{"verbose":true}}"#)
        #expect(extra.parameters["parameter"]?.stringValue == "verbose")
        let missing = try call(c, #"{"method":"org.varlink.service.GetInterfaceDescription"}"#)
        #expect(missing.parameters["parameter"]?.stringValue == "interface")
        let profile = try call(
            c,
            #"{"method":"io.vaultd.Vault.Login","parameters":{"provider":"demo","user":"u","token":"t","profile":{"name":"no uid"}}}"#
        )
        #expect(profile.error == "org.varlink.service.InvalidParameter")
        #expect(profile.parameters["parameter"]?.stringValue == "profile")
        let kinds = try call(
            c, #"{"method":"io.vaultd.Vault.Subscribe","more":true,"parameters":{"kinds":["loginSuccess",1]}}"#)
        #expect(kinds.parameters["parameter"]?.stringValue == "kinds")
        // The connection still serves well-formed calls.
        #expect(try call(c, #"{"method":"io.vaultd.Vault.ListSessions"}"#).error == nil)
    }

    @Test("Should send nothing for oneway calls, not even errors, and answer the next call")
    func oneway() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let calls = [
            #"{"method":"io.vaultd.Vault.GetToken","oneway":true,"parameters":{"provider":"demo","user":"nobody"}}"#,
            #"{"method":"io.vaultd.Vault.Frobnicate","oneway":true}"#,
            #"{"method":"io.vaultd.Vault.GetToken","oneway":true,"parameters":{"colour":"blue"}}"#,
            #"{"method":"io.vaultd.Vault.Subscribe","oneway":true}"#,
            #"{"method":"io.vaultd.Vault.Logout","oneway":true,"parameters":{"provider":"demo","user":"nobody"}}"#,
            #"{"method":"org.varlink.service.GetInfo"}"#,
        ]
        try c.send(bytes: calls.map { Array($0.utf8) + [0] }.flatMap { $0 })
        let reply = try #require(try c.nextReply())
        #expect(reply.error == nil)
        #expect(reply.parameters["vendor"]?.stringValue == "vaultd")
    }

    @Test("Should answer a non-streaming method called with more once, without continues")
    func moreOnPlainMethod() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let reply = try call(c, #"{"method":"io.vaultd.Vault.ListSessions","more":true}"#)
        #expect(reply.error == nil)
        #expect(!reply.continues)
        let error = try call(
            c, #"{"method":"io.vaultd.Vault.GetSession","more":true,"parameters":{"provider":"demo","user":"nobody"}}"#)
        #expect(error.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(!error.continues)
        // The call is over: the connection takes the next one.
        #expect(try call(c, #"{"method":"org.varlink.service.GetInfo"}"#).error == nil)
    }

    @Test("Should answer Subscribe without more with ExpectedMore, and stream with it")
    func subscribeNeedsMore() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let refused = try call(c, #"{"method":"io.vaultd.Vault.Subscribe","parameters":{}}"#)
        #expect(refused.error == "org.varlink.service.ExpectedMore")
        #expect(!refused.continues)
        let snapshot = try call(c, #"{"method":"io.vaultd.Vault.Subscribe","more":true}"#)
        #expect(snapshot.error == nil)
        #expect(snapshot.continues)
        #expect(snapshot.parameters["sessions"]?.arrayValue != nil)
    }

    @Test("Should refuse upgrade with InvalidParameter naming upgrade and stay on Varlink")
    func upgradeRefused() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let reply = try call(c, #"{"method":"io.vaultd.Vault.ListSessions","upgrade":true}"#)
        #expect(reply.error == "org.varlink.service.InvalidParameter")
        #expect(reply.parameters["parameter"]?.stringValue == "upgrade")
        let info = try call(c, #"{"method":"org.varlink.service.GetInfo","upgrade":true}"#)
        #expect(info.parameters["parameter"]?.stringValue == "upgrade")
        #expect(try call(c, #"{"method":"org.varlink.service.GetInfo"}"#).error == nil)
    }

    @Test("Should serve the interface text the table renders, and org.varlink.service's")
    func descriptions() throws {
        let c = try VarlinkClient.raw(fixture.socketPath)
        let vault = try call(
            c, #"{"method":"org.varlink.service.GetInterfaceDescription","parameters":{"interface":"io.vaultd.Vault"}}"#
        )
        #expect(vault.parameters["description"]?.stringValue == VaultInterface.description)
        let service = try call(
            c,
            #"{"method":"org.varlink.service.GetInterfaceDescription","parameters":{"interface":"org.varlink.service"}}"#
        )
        #expect(service.parameters["description"]?.stringValue == VarlinkServiceInterface.description)
        let info = try call(c, #"{"method":"org.varlink.service.GetInfo"}"#)
        #expect(info.parameters["interfaces"] == ["org.varlink.service", "io.vaultd.Vault"])
    }

    @Test("Should answer the same GetToken bytes, sent again on one connection, from the session as it is now")
    func repeatedCallSeesTheSessionNow() throws {
        let user = uniqueName("repeat")
        let asker = try VarlinkClient.raw(fixture.socketPath)
        let getToken = #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"\#(user)"}}"#
        #expect(try call(asker, getToken).error == "io.vaultd.Vault.NotLoggedIn")
        let other = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 30)
        try other.login(provider: "demo", user: user, token: "tok_repeat_first_abcdefghij")
        #expect(try call(asker, getToken).parameters["token"]?.stringValue == "tok_repeat_first_abcdefghij")
        try other.logout(provider: "demo", user: user)
        #expect(try call(asker, getToken).error == "io.vaultd.Vault.NotLoggedIn")
        try other.login(provider: "demo", user: user, token: "tok_repeat_second_abcdefghij")
        #expect(try call(asker, getToken).parameters["token"]?.stringValue == "tok_repeat_second_abcdefghij")
        // The same bytes with one more (unknown) field: checked, not taken for the repeat.
        let unknown = #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"\#(user)","x":1}}"#
        let refused = try call(asker, unknown)
        #expect(refused.error == "org.varlink.service.InvalidParameter")
        #expect(refused.parameters["parameter"]?.stringValue == "x")
        #expect(try call(asker, getToken).parameters["token"]?.stringValue == "tok_repeat_second_abcdefghij")
    }

    @Test(
        "Should render interface text the Python varlink package parses",
        arguments: ["docs/io.vaultd.Vault.varlink", "served"])
    func pythonParsesIDL(source: String) throws {
        let path: String
        if source == "served" {
            // The text the running daemon serves.
            let reply = try call(
                try VarlinkClient.raw(fixture.socketPath),
                #"{"method":"org.varlink.service.GetInterfaceDescription","parameters":{"interface":"io.vaultd.Vault"}}"#
            )
            path = fixture.directory.path("served.varlink")
            try #require(reply.parameters["description"]?.stringValue)
                .write(toFile: path, atomically: true, encoding: .utf8)
        } else {
            path = Binaries.packageRoot.appendingPathComponent(source).path
        }
        let script = """
            import sys, varlink
            interface = varlink.Interface(open(sys.argv[1]).read())
            print(interface.name, len(interface.members))
            """
        let result = try runCommand(
            URL(fileURLWithPath: "/usr/bin/env"), ["python3", "-c", script, path], seconds: 60)
        #expect(result.status == 0, "\(result.stdout)\n\(result.stderr)")
        // Every type, method and error the declaration holds.
        let declaration = VaultInterface.declaration
        let members = declaration.types.count + declaration.methods.count + declaration.errors.count
        #expect(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines) == "io.vaultd.Vault \(members)")
    }
}
