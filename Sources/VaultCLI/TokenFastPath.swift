import Glibc
import Varlink
import VaultClient
import VaultProtocol
import VaultSystem

/// `vaultctl token PROVIDER USER`, the command scripts run once per token
/// read, answered without the general machinery: no command table, no JSON
/// values, no dictionaries. In a static vaultctl most of a run's work was the
/// Swift runtime instantiating the generic types those use (see
/// docs/BENCHMARKS.md, "vaultctl token against git-credential-cache get").
/// Issue 15's target, `vaultctl token` at most 1.0x `git-credential-cache
/// get`, needs it: without it vaultctl took 1.13x git's time.
///
/// Only the plain form is taken: `token` with two arguments, after at most
/// `--socket PATH` and `--timeout SECONDS`. The call is the one the general
/// path makes; a reply that is the usual success (a flat `parameters` object
/// with a plain `token` string) is read here. Anything else (an error, an
/// escape in the token, a shape this reader does not know) is decoded and
/// reported by the general code, so messages and exit codes are the same.
enum TokenFastPath {
    /// What the plain form names.
    struct Request: Equatable {
        var socket: String?
        var timeoutSeconds: Int
        var provider: String
        var user: String
    }

    /// The request `arguments` make when they are the plain form; nil for
    /// anything else, which the general parser handles (and explains).
    static func request(_ arguments: [String]) -> Request? {
        var request = Request(socket: nil, timeoutSeconds: VaultCtl.defaultTimeoutSeconds, provider: "", user: "")
        return parse(arguments, into: &request) ? request : nil
    }

    /// Fills `request` from `arguments` when they are the plain form. (Not an
    /// optional result: an optional of this struct has its metadata built at
    /// run time, which costs a start of vaultctl tens of thousands of
    /// instructions.)
    static func parse(_ arguments: [String], into request: inout Request) -> Bool {
        var index = 0
        while index < arguments.count, arguments[index].hasPrefix("-") {
            guard index + 1 < arguments.count else { return false }
            switch arguments[index] {
            case "--socket":
                request.socket = arguments[index + 1]
            case "--timeout":
                guard let seconds = Int(arguments[index + 1]), seconds > 0, seconds <= 86400 else { return false }
                request.timeoutSeconds = seconds
            default:
                return false
            }
            index += 2
        }
        guard arguments.count == index + 3, arguments[index] == "token" else { return false }
        request.provider = arguments[index + 1]
        request.user = arguments[index + 2]
        return !request.provider.hasPrefix("-") && !request.user.hasPrefix("-")
    }

    /// Runs the plain form and returns vaultctl's exit status; nil when
    /// `arguments` are not the plain form.
    static func run(_ arguments: [String], output: Output) -> Int32? {
        var request = Request(socket: nil, timeoutSeconds: VaultCtl.defaultTimeoutSeconds, provider: "", user: "")
        guard parse(arguments, into: &request) else { return nil }
        let path = request.socket ?? SocketPath.default(lookup: Environment.get, uid: getuid())
        let ctl = VaultCtl(output: output)
        let client: VarlinkClient
        do {
            client = try VarlinkClient(path: path, timeoutSeconds: request.timeoutSeconds)
        } catch {
            return ctl.reportUnreachable(error).rawValue
        }
        let message = callMessage(request)
        let reply: ArraySlice<UInt8>
        do {
            try client.send(bytes: message)
        } catch {
            // vaultd may have refused the connection (TooManyConnections) with a
            // reply before the call went out: that reply says why.
            guard let refusal = try? client.nextMessage() else { return ctl.reportUnreachable(error).rawValue }
            return answerInFull(refusal, ctl: ctl).rawValue
        }
        do throws(ClientError) {
            guard let received = try client.nextMessage() else {
                throw .connection("vaultd at \(path) closed the connection before replying")
            }
            reply = received
        } catch {
            return ctl.reportUnreachable(error).rawValue
        }
        if let token = plainToken(in: reply) {
            output.out(token)
            return VaultCtl.ExitCode.ok.rawValue
        }
        return answerInFull(reply, ctl: ctl).rawValue
    }

    /// The general reading of a reply: an error reported as vaultctl reports
    /// it, a token printed.
    private static func answerInFull(_ message: ArraySlice<UInt8>, ctl: VaultCtl) -> VaultCtl.ExitCode {
        do throws(VaultClientError) {
            let reply: VarlinkReply
            do { reply = try VarlinkReply(message: message) } catch {
                throw .client(.connection("vaultd sent a message that is not a Varlink reply"))
            }
            if let error = VarlinkErrorReply(reply) { throw .reply(error) }
            ctl.output.out(try VaultConnection.token(from: reply).value.revealed)
            return .ok
        } catch {
            return ctl.report(error)
        }
    }

    /// The `GetToken` call of `request`, NUL-terminated: the parameters the
    /// general path sends for the plain form.
    static func callMessage(_ request: Request) -> [UInt8] {
        var message: [UInt8] = []
        JSONText.appendLiteral(#"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"#, to: &message)
        JSONText.appendString(request.provider, to: &message)
        JSONText.appendLiteral(#","user":"#, to: &message)
        JSONText.appendString(request.user, to: &message)
        JSONText.appendLiteral("}}", to: &message)
        message.append(0)
        return message
    }

    /// The token of a reply shaped as vaultd answers a `GetToken` that
    /// succeeded: `{"parameters":{...}}` whose members are strings, numbers,
    /// booleans or null, one of them `"token"`, a string without escapes.
    /// Nil for any other shape, an error reply among them (its `error` member
    /// is not allowed here), which the caller then reads in full.
    static func plainToken(in message: ArraySlice<UInt8>) -> String? {
        let prefix = #"{"parameters":{"#.utf8
        guard message.starts(with: prefix) else { return nil }
        var index = message.startIndex + prefix.count
        var token: ArraySlice<UInt8>?
        let quote = UInt8(ascii: "\"")
        /// The bytes of the string starting at `index` (at its opening quote),
        /// when it has no escapes; `index` moves past its closing quote.
        func plainString() -> ArraySlice<UInt8>? {
            guard index < message.endIndex, message[index] == quote else { return nil }
            let start = index + 1
            var end = start
            while end < message.endIndex, message[end] != quote {
                if message[end] == UInt8(ascii: "\\") || message[end] < 0x20 { return nil }
                end += 1
            }
            guard end < message.endIndex else { return nil }
            index = end + 1
            return message[start..<end]
        }
        if index < message.endIndex, message[index] == UInt8(ascii: "}") { return nil }
        while true {
            guard let key = plainString(), index < message.endIndex, message[index] == UInt8(ascii: ":") else {
                return nil
            }
            index += 1
            guard index < message.endIndex else { return nil }
            if key.elementsEqual("token".utf8) {
                guard token == nil, let value = plainString() else { return nil }
                token = value
            } else if message[index] == quote {
                guard plainString() != nil else { return nil }
            } else {
                // A number, true, false or null: up to the next separator.
                while index < message.endIndex, message[index] != UInt8(ascii: ","),
                    message[index] != UInt8(ascii: "}")
                {
                    let byte = message[index]
                    guard byte != quote, byte != UInt8(ascii: "{"), byte != UInt8(ascii: "[") else { return nil }
                    index += 1
                }
            }
            guard index < message.endIndex else { return nil }
            if message[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            guard message[index] == UInt8(ascii: "}") else { return nil }
            index += 1
            break
        }
        guard index + 1 == message.endIndex, message[index] == UInt8(ascii: "}"), let token else { return nil }
        return String(validating: token, as: UTF8.self)
    }
}
