import Testing
import Varlink
import VaultCore
import VaultProtocol

/// The call as the generic path reads it: `JSON.parse`, then the members.
private func reference(_ text: String) -> Result<VarlinkCall, VarlinkCall.DecodingFailure> {
    let json: JSON
    do { json = try JSON.parse(text) } catch { return .failure(.invalidJSON(error.description)) }
    guard case .object(let o) = json else { return .failure(.invalidField("message")) }
    guard let method = o["method"]?.stringValue else { return .failure(.invalidField("method")) }
    let parameters: [String: JSON]
    switch o["parameters"] {
    case nil, .null?: parameters = [:]
    case .object(let p)?: parameters = p
    default: return .failure(.invalidField("parameters"))
    }
    return .success(
        VarlinkCall(
            method: method, parameters: parameters, more: o["more"]?.boolValue ?? false,
            oneway: o["oneway"]?.boolValue ?? false, upgrade: o["upgrade"]?.boolValue ?? false))
}

private func decoded(_ text: String) -> Result<VarlinkCall, VarlinkCall.DecodingFailure> {
    do throws(VarlinkCall.DecodingFailure) {
        return .success(try VarlinkCall(message: ArraySlice(text.utf8)))
    } catch {
        return .failure(error)
    }
}

/// Calls read in one pass (VarlinkCallScanner) must read exactly as the
/// generic parser reads them, and everything else must go to it.
@Suite("Call scanner", .timeLimit(.minutes(5)))
struct CallScannerTests {
    static let messages = [
        // The common shape, which the scanner reads itself.
        #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"u1"}}"#,
        #" { "parameters" : { "user" : "u1" , "provider" : "demo" } , "method" : "a.B" } "#,
        #"{"method":"a.B","parameters":{"minValidSeconds":300,"ownerUid":0,"n":-7,"z":-0,"t":true,"f":false,"x":null}}"#,
        #"{"method":"a.B","parameters":null,"more":true,"oneway":false,"upgrade":true}"#,
        #"{"method":"a.B","parameters":{}}"#,
        #"{"method":"a.B"}"#,
        "{\"method\":\"a.B\",\n\t\"parameters\":{\"big\":999999999999999}}\r\n",
        // Shapes it leaves to the generic parser.
        #"{"method":"a.B","parameters":{"big":1234567890123456789}}"#,
        #"{"method":"a.B","parameters":{"f":1.5,"e":1e3,"E":2E-2}}"#,
        #"{"method":"a.B","parameters":{"s":"with \"escape\" and \u00e9"}}"#,
        #"{"method":"a.B","parameters":{"s":"héllo"}}"#,
        #"{"method":"a.B","parameters":{"o":{"k":[1,2,{"x":null}]}}}"#,
        #"{"method":"a.B","parameters":{"a":"1","a":"2"}}"#,
        #"{"method":"a.B","method":"c.D"}"#,
        #"{"method":"a.B","extra":{"ignored":true}}"#,
        #"{"method":"a.B","more":null,"oneway":1}"#,
        #"{"method":5}"#,
        #"{"parameters":{}}"#,
        #"{"method":"a.B","parameters":[]}"#,
        #"{"method":"a.B","parameters":"x"}"#,
        #"["a.B"]"#,
        #"{}"#,
        // Not JSON: the generic parser names the fault.
        #"{"method":"a.B","parameters":{"n":007}}"#,
        #"{"method":"a.B","parameters":{"n":-}}"#,
        #"{"method":"a.B"} x"#,
        #"{"method":"a.B","#,
        #"{"method":"a.B""#,
        "{\"method\":\"a.B\",\"parameters\":{\"s\":\"tab\tinside\"}}",
        #"{"method":"a.B",}"#,
        #"{"method":"a.B","parameters":{"t":tru}}"#,
        "",
    ]

    @Test("Should read every message as the generic parser does", arguments: messages)
    func sameAsGeneric(text: String) {
        let got = decoded(text)
        let expected = reference(text)
        #expect(got == expected, "\(text)")
        if case .success(let call) = got, case .success(let want) = expected {
            // Equal members, and the same values bit for bit (-0 stays -0).
            for member in want.parameters.members {
                guard case .number(let wanted) = member.value else { continue }
                guard case .number(let got)? = call.parameters[member.name] else {
                    Issue.record("\(member.name) is no number in \(text)")
                    continue
                }
                #expect(got.bitPattern == wanted.bitPattern, "\(member.name) in \(text)")
            }
        }
    }

    @Test("Should reuse a known method name and find it when it is the first member")
    func methodNames() throws {
        var names = VarlinkMethodNames()
        names.add("io.vaultd.Vault.GetToken")
        let call = try VarlinkCall(
            message: ArraySlice(#"{"method":"io.vaultd.Vault.GetToken","parameters":{}}"#.utf8), methods: names)
        #expect(call.method == "io.vaultd.Vault.GetToken")
        let first = ArraySlice(#"{ "method" : "io.vaultd.Vault.Login", "parameters": {"token": "x"}}"#.utf8)
        #expect(VarlinkCall.leadingMethod(of: first, methods: names) == "io.vaultd.Vault.Login")
        let later = ArraySlice(#"{"parameters":{"n":[1,2,3]},"method":"io.vaultd.Vault.GetToken"}"#.utf8)
        #expect(VarlinkCall.leadingMethod(of: later, methods: names) == nil)
        #expect(VarlinkCall.leadingMethod(of: ArraySlice(#"{"method":5}"#.utf8)) == nil)
    }

    @Test("Should compare parameters by name and value, in whatever order")
    func parametersEquality() {
        let a: VarlinkParameters = ["x": 1, "y": "z"]
        let b = VarlinkParameters(["y": "z", "x": 1])
        #expect(a == b)
        #expect(a != ["x": 1])
        #expect(a["y"] == "z")
        #expect(a["missing"] == nil)
        #expect(a.dictionary == ["x": 1, "y": "z"])
    }
}
