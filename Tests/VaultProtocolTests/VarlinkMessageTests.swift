import Testing
import Varlink
import VaultCore
import VaultProtocol

private func message(_ text: String) -> ArraySlice<UInt8> { ArraySlice(text.utf8) }

private func decodeCall(_ text: String) throws(VarlinkCall.DecodingFailure) -> VarlinkCall {
    try VarlinkCall(message: message(text))
}

@Suite("VarlinkCall", .timeLimit(.minutes(5)))
struct VarlinkCallTests {
    @Test("Should decode a call with parameters")
    func withParameters() throws {
        let call = try decodeCall(
            #"{"method":"io.vaultd.Vault.Login","parameters":{"provider":"demo","user":"alice"}}"#)
        #expect(call.method == "io.vaultd.Vault.Login")
        #expect(call.interface == "io.vaultd.Vault")
        #expect(call.parameters == ["provider": "demo", "user": "alice"])
        #expect(!call.more)
        #expect(!call.oneway)
    }

    @Test("Should decode a call without parameters, or with null parameters, as empty parameters")
    func withoutParameters() throws {
        #expect(try decodeCall(#"{"method":"io.vaultd.Vault.ListSessions"}"#).parameters == [:])
        #expect(try decodeCall(#"{"method":"a.B","parameters":null}"#).parameters == [:])
    }

    @Test("Should decode more and oneway")
    func flags() throws {
        let call = try decodeCall(#"{"method":"a.B","more":true,"oneway":true}"#)
        #expect(call.more)
        #expect(call.oneway)
        #expect(try decodeCall(#"{"method":"a.B","more":false}"#).more == false)
    }

    @Test("Should refuse a message that is not an object")
    func notAnObject() {
        #expect(throws: VarlinkCall.DecodingFailure.invalidField("message")) { try decodeCall(#"["a.B"]"#) }
    }

    @Test("Should refuse a call without a string method", arguments: [#"{}"#, #"{"method":5}"#, #"{"parameters":{}}"#])
    func missingMethod(text: String) {
        #expect(throws: VarlinkCall.DecodingFailure.invalidField("method")) { try decodeCall(text) }
    }

    @Test("Should refuse parameters that are not an object", arguments: [#"[]"#, #""x""#, "1", "true"])
    func parametersNotObject(parameters: String) {
        #expect(throws: VarlinkCall.DecodingFailure.invalidField("parameters")) {
            try decodeCall(#"{"method":"a.B","parameters":"# + parameters + "}")
        }
    }

    @Test("Should refuse text that is not JSON as invalidJSON, with the parser's reason")
    func invalidJSON() throws {
        let failure = try #require(throws: VarlinkCall.DecodingFailure.self) { try decodeCall(#"{"method":"#) }
        guard case .invalidJSON(let reason) = failure else {
            Issue.record("expected invalidJSON, got \(failure)")
            return
        }
        #expect(reason == "invalid JSON at byte 10: unexpected end of input")
    }

    @Test("Should read back the call it encodes")
    func roundTrip() throws {
        let calls = [
            VarlinkCall(method: "io.vaultd.Vault.ListSessions"),
            VarlinkCall(
                method: "io.vaultd.Vault.Login",
                parameters: ["provider": "demo", "user": "alice", "tokenResponse": ["access_token": "at"]], more: true),
            VarlinkCall(method: "org.varlink.service.GetInfo", oneway: true),
        ]
        for call in calls {
            #expect(try VarlinkCall(message: ArraySlice(call.encoded())) == call)
        }
    }

    @Test("Should encode only the members that are set")
    func encoding() {
        #expect(String(decoding: VarlinkCall(method: "a.B").encoded(), as: UTF8.self) == #"{"method":"a.B"}"#)
        let full = VarlinkCall(method: "a.B", parameters: ["x": 1], more: true, oneway: true)
        #expect(
            String(decoding: full.encoded(), as: UTF8.self)
                == #"{"method":"a.B","more":true,"oneway":true,"parameters":{"x":1}}"#)
    }

    @Test("Should have an empty interface for a method name without a dot")
    func interfaceWithoutDot() {
        #expect(VarlinkCall(method: "Login").interface == "")
    }
}

@Suite("VarlinkReply", .timeLimit(.minutes(5)))
struct VarlinkReplyTests {
    @Test("Should read back a successful reply")
    func successRoundTrip() throws {
        let reply = VarlinkReply(parameters: ["sessions": []], continues: true)
        let decoded = try VarlinkReply(message: ArraySlice(reply.encoded()))
        #expect(decoded == reply)
        #expect(decoded.error == nil)
        #expect(decoded.continues)
    }

    @Test("Should read back an error reply")
    func errorRoundTrip() throws {
        let reply = VarlinkReply(error: "org.varlink.service.MethodNotFound", parameters: ["method": "a.B"])
        let decoded = try VarlinkReply(message: ArraySlice(reply.encoded()))
        #expect(decoded == reply)
        #expect(decoded.error == "org.varlink.service.MethodNotFound")
        #expect(!decoded.continues)
    }

    @Test("Should always encode parameters, even empty")
    func encoding() {
        #expect(String(decoding: VarlinkReply().encoded(), as: UTF8.self) == #"{"parameters":{}}"#)
    }

    @Test(
        "Should write the same bytes as the generic JSON encoder, members sorted",
        arguments: [
            VarlinkReply(parameters: ["token": "t\"x", "expiresAt": 17]),
            VarlinkReply(parameters: ["event": ["kind": "kickedOffline"]], continues: true),
            VarlinkReply(error: "io.vaultd.Vault.NotLoggedIn", parameters: ["code": "ERR_NOT_LOGGED_IN"]),
        ])
    func directEncodingMatchesJSON(reply: VarlinkReply) {
        var generic: [String: JSON] = ["parameters": .object(reply.parameters)]
        if let error = reply.error { generic["error"] = .string(error) }
        if reply.continues { generic["continues"] = true }
        var appended: [UInt8] = [0x41]
        reply.encode(into: &appended)
        #expect(reply.encoded() == JSON.object(generic).serialized())
        #expect(appended == [0x41] + JSON.object(generic).serialized())
    }

    @Test("Should refuse a reply that is not an object or has bad parameters")
    func malformed() {
        #expect(throws: VarlinkCall.DecodingFailure.invalidField("message")) { try VarlinkReply(message: message("1")) }
        #expect(throws: VarlinkCall.DecodingFailure.invalidField("parameters")) {
            try VarlinkReply(message: message(#"{"parameters":[]}"#))
        }
    }

    @Test("Should build the org.varlink.service errors")
    func serviceErrors() {
        #expect(
            VarlinkServiceError.methodNotFound("io.vaultd.Vault.Nope")
                == VarlinkReply(
                    error: "org.varlink.service.MethodNotFound", parameters: ["method": "io.vaultd.Vault.Nope"]))
        #expect(
            VarlinkServiceError.interfaceNotFound("x.y")
                == VarlinkReply(error: "org.varlink.service.InterfaceNotFound", parameters: ["interface": "x.y"]))
        #expect(
            VarlinkServiceError.invalidParameter("user")
                == VarlinkReply(error: "org.varlink.service.InvalidParameter", parameters: ["parameter": "user"]))
    }
}

@Suite("VaultError as a Varlink reply", .timeLimit(.minutes(5)))
struct VaultErrorReplyTests {
    @Test("Should name the error in io.vaultd.Vault and carry code and message")
    func reply() {
        let reply = VaultError(.notLoggedIn, "alice @ demo is not logged in").varlinkReply
        #expect(reply.error == "io.vaultd.Vault.NotLoggedIn")
        #expect(reply.parameters == ["code": "ERR_NOT_LOGGED_IN", "message": "alice @ demo is not logged in"])
        #expect(!reply.continues)
    }

    @Test("Should map every error back from its reply, message included", arguments: VaultError.Code.allCases)
    func roundTrip(code: VaultError.Code) throws {
        let original = VaultError(code, "message for \(code)")
        let encoded = original.varlinkReply.encoded()
        let back = try #require(VaultError(reply: VarlinkReply(message: ArraySlice(encoded))))
        #expect(back.code == code)
        #expect(back.message == "message for \(code)")
        #expect(original.varlinkName == "io.vaultd.Vault.\(code.varlinkErrorName)")
    }

    @Test("Should not map a reply that is no vaultd error")
    func foreign() {
        #expect(VaultError(reply: VarlinkReply(parameters: [:])) == nil)
        #expect(VaultError(reply: VarlinkServiceError.methodNotFound("a.B")) == nil)
        #expect(VaultError(reply: VarlinkReply(error: "io.vaultd.Vault.Nope")) == nil)
        #expect(VaultError(reply: VarlinkReply(error: "io.vaultd.VaultX.NotLoggedIn")) == nil)
    }

    @Test("Should fall back to the error name when the reply has no message")
    func noMessage() throws {
        let error = try #require(VaultError(reply: VarlinkReply(error: "io.vaultd.Vault.StoreLocked")))
        #expect(error.code == .storeLocked)
        #expect(error.message == "io.vaultd.Vault.StoreLocked")
    }
}
