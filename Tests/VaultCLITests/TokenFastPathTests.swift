import Testing
import Varlink
import VaultCore
import VaultProtocol

@testable import VaultCLI

/// `vaultctl token`'s short path: which invocations it takes, the call it
/// writes, and the replies it reads itself (the rest go to the general code).
@Suite("vaultctl token's short path", .timeLimit(.minutes(5)))
struct TokenFastPathTests {
    @Test("Should take only the plain form: token PROVIDER USER after --socket and --timeout")
    func takesThePlainFormOnly() {
        let plain = TokenFastPath.request(["token", "demo", "alice"])
        #expect(
            plain == .init(socket: nil, timeoutSeconds: VaultCtl.defaultTimeoutSeconds, provider: "demo", user: "alice")
        )
        #expect(
            TokenFastPath.request(["--timeout", "5", "--socket", "/tmp/s", "token", "p", "u"])
                == .init(socket: "/tmp/s", timeoutSeconds: 5, provider: "p", user: "u"))
        for arguments in [
            ["token", "demo"], ["token", "demo", "alice", "extra"], ["--json", "token", "demo", "alice"],
            ["--owner", "0", "token", "demo", "alice"], ["token", "demo", "alice", "--min-valid", "60"],
            ["token", "--help", "demo"], ["token", "demo", "--", "alice"], ["--timeout", "0", "token", "p", "u"],
            ["--timeout", "x", "token", "p", "u"], ["--socket"], ["status", "demo", "alice"], [],
            ["--version"], ["token", "-p", "u"],
        ] {
            #expect(TokenFastPath.request(arguments) == nil, "\(arguments)")
        }
    }

    @Test("Should write the GetToken call with each name as a JSON string the parser reads back unchanged")
    func writesTheCall() throws {
        for name in ["alice", #"a"b\c"#, "tab\there", "\u{1}\u{1f}", "ünïcødé ✓", "", "/slash"] {
            let request = TokenFastPath.Request(socket: nil, timeoutSeconds: 1, provider: "p-" + name, user: name)
            let message = TokenFastPath.callMessage(request)
            #expect(message.last == 0)
            let call = try JSON.parse(Array(message.dropLast()))
            #expect(
                call
                    == .object([
                        "method": "io.vaultd.Vault.GetToken",
                        "parameters": .object(["provider": .string("p-" + name), "user": .string(name)]),
                    ]), "\(name)")
        }
    }

    @Test("Should read the token of a plain success reply, whatever the order and types of its members")
    func readsPlainReplies() {
        let replies: [(String, String)] = [
            (#"{"parameters":{"ownerUid":0,"token":"tok-1"}}"#, "tok-1"),
            (#"{"parameters":{"token":"tok-2","ownerUid":1000}}"#, "tok-2"),
            (
                #"{"parameters":{"expiresAt":1700000000,"instanceUrl":"https://x.example/a,b}","ownerUid":0,"token":"ü-3","tokenType":"Bearer"}}"#,
                "ü-3"
            ),
            (#"{"parameters":{"ownerUid":0,"token":"t","tokenType":null,"flag":true}}"#, "t"),
        ]
        for (reply, token) in replies {
            #expect(TokenFastPath.plainToken(in: ArraySlice(reply.utf8)) == token, "\(reply)")
        }
    }

    @Test("Should leave every other reply to the general code: errors, escapes, nesting, anything malformed")
    func leavesTheRest() {
        let replies = [
            #"{"error":"io.vaultd.Vault.NotLoggedIn","parameters":{"code":"ERR_NOT_LOGGED_IN","message":"m"}}"#,
            #"{"parameters":{"token":"a\"b","ownerUid":0}}"#,
            #"{"parameters":{"token":"a\u0041","ownerUid":0}}"#,
            #"{"parameters":{"ownerUid":0}}"#,
            #"{"parameters":{}}"#,
            #"{"parameters":{"token":"t","nested":{"a":1}}}"#,
            #"{"parameters":{"token":"t","list":[1]}}"#,
            #"{"parameters":{"token":"t","token":"u"}}"#,
            #"{"parameters":{"token":"t"},"error":"x"}"#,
            #"{"parameters":{"token":"t"}}x"#,
            #"{"parameters":{"token":"t"}"#,
            #"{"parameters":{"token":"t""#,
            #"{"parameters":{"token":7}}"#,
            #"{"parameters":{"token" :"t"}}"#,
            #"{"continues":true,"parameters":{"token":"t"}}"#,
        ]
        for reply in replies {
            #expect(TokenFastPath.plainToken(in: ArraySlice(reply.utf8)) == nil, "\(reply)")
        }
        #expect(
            TokenFastPath.plainToken(
                in: ArraySlice([UInt8](#"{"parameters":{"token":""#.utf8) + [0xFF, 0x22, 0x7D, 0x7D])) == nil)
    }

    @Test("Should agree with the general decoder on every reply it reads")
    func agreesWithTheDecoder() throws {
        let replies = [
            #"{"parameters":{"ownerUid":0,"token":"tok-1"}}"#,
            #"{"parameters":{"expiresAt":5,"ownerUid":7,"token":"x y z","tokenType":"Bearer"}}"#,
        ]
        for reply in replies {
            let fast = try #require(TokenFastPath.plainToken(in: ArraySlice(reply.utf8)))
            let parsed = try VarlinkReply(message: ArraySlice(reply.utf8))
            #expect(parsed.parameters["token"]?.stringValue == fast)
        }
    }
}
