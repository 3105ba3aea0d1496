import Glibc
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// vaultctl: the command-line client of vaultd. Exit codes: 0 ok, 1 an error
/// from vaultd, 2 bad usage, 3 vaultd not reachable.
public struct VaultCtl {
    /// Process exit codes.
    public enum ExitCode: Int32 {
        case ok = 0
        case daemonError = 1
        case usage = 2
        case unreachable = 3
    }

    /// The version printed by `--version`.
    public static let version = "0.1.0"

    var json = false
    var socketPath: String?
    /// Whose session to address (`--owner`): root and admins acting on another user's.
    var owner: UInt32?
    var output: Output

    /// A client that writes through `output`.
    public init(output: Output = .standard) { self.output = output }

    /// Runs `arguments` (without the program name) and returns the exit code.
    public static func main(_ arguments: [String]) -> Int32 {
        // A parent may have left SIGINT/SIGTERM blocked; `watch` must stop on them.
        var signals = sigset_t()
        sigemptyset(&signals)
        sigaddset(&signals, SIGINT)
        sigaddset(&signals, SIGTERM)
        sigprocmask(SIG_UNBLOCK, &signals, nil)
        var ctl = VaultCtl()
        return ctl.run(arguments).rawValue
    }

    /// Parses `arguments` against `CommandTable` and runs the command they name.
    public mutating func run(_ arguments: [String]) -> ExitCode {
        let invocation: Invocation
        switch CommandLineParser.parse(arguments) {
        case .success(let parsed): invocation = parsed
        case .failure(let error): return usage(error.message, command: error.command)
        }
        if invocation.wantsVersion {
            output.out("vaultctl \(VaultCtl.version)")
            return .ok
        }
        guard let command = invocation.command else {
            output.out(Help.tool)
            return .ok
        }
        if invocation.wantsHelp {
            output.out(Help.command(command.spec))
            return .ok
        }
        json = invocation.globalFlags.contains("--json")
        socketPath = invocation.globalValues["--socket"]
        if let name = invocation.globalValues["--owner"] {
            if let uid = UInt32(name) {
                owner = uid
            } else if let entry = getpwnam(name) {
                owner = entry.pointee.pw_uid
            } else {
                return usage("--owner: no user '\(name)' on this host")
            }
        }
        return command.spec.handler(&self, command)
    }

    // MARK: Commands

    mutating func login(_ command: ParsedCommand) -> ExitCode {
        let positional = command.arguments
        let tokenFile = command.value("--token-file")
        var expiresAt: Int64?
        if let text = command.value("--expires-at") {
            guard let value = Int64(text) else {
                return usage("login: --expires-at needs Unix seconds, not '\(text)'", command: "login")
            }
            expiresAt = value
        }
        if command.has("--from-provider") {
            // The provider obtains the tokens itself (client credentials, an exec helper).
            return call(VaultMethod.login.rawValue, account(positional)) { reply in
                output.out("logged in: \(describe(reply.parameters["session"] ?? .null))")
            }
        }
        let text: String
        switch readCredential(tokenFile) {
        case .success(let read): text = read
        case .failure(let message):
            output.err("vaultctl: \(message)")
            return .usage
        }
        let credential: LoginCredential
        do { credential = try LoginCredential(text: text) } catch {
            output.err("vaultctl: \(error.message) (\(error.code.seedCode))")
            return .usage
        }
        // Send what was read, as read: the daemon applies the same rules.
        var parameters = account(positional)
        let trimmed = LoginCredential.trimmed(text)
        if trimmed.hasPrefix("{"), let response = try? JSON.parse(trimmed) {
            parameters["tokenResponse"] = response
        } else {
            parameters["token"] = .string(credential.tokens.accessToken.revealed)
        }
        if let expiresAt { parameters["expiresAt"] = .int(expiresAt) }
        return call(VaultMethod.login.rawValue, parameters) { reply in
            let session = reply.parameters["session"] ?? .null
            let created = reply.parameters["created"]?.boolValue ?? false
            let what = created ? "logged in" : "already logged in"
            output.out("\(what): \(describe(session))")
        }
    }

    mutating func logout(_ command: ParsedCommand) -> ExitCode {
        let operands = command.arguments
        return call(VaultMethod.logout.rawValue, account(operands)) { _ in
            output.out("logged out: \(operands[1]) @ \(operands[0])")
        }
    }

    mutating func providerSecret(_ command: ParsedCommand) -> ExitCode {
        let provider = command.arguments[0]
        let text: String
        switch readCredential(nil) {
        case .success(let read): text = read
        case .failure(let message):
            output.err("vaultctl: \(message)")
            return .usage
        }
        let secret = LoginCredential.trimmed(text)
        return call(VaultMethod.setProviderSecret.rawValue, ["provider": .string(provider), "secret": .string(secret)])
        { _ in
            output.out("client secret of \(provider) stored in the secret store")
        }
    }

    mutating func refresh(_ command: ParsedCommand) -> ExitCode {
        call(VaultMethod.refresh.rawValue, account(command.arguments)) { reply in
            output.out("refreshed: \(describe(reply.parameters["session"] ?? .null))")
        }
    }

    mutating func status(_ command: ParsedCommand) -> ExitCode {
        let operands = command.arguments
        if operands.isEmpty { return list() }
        return call(VaultMethod.getSession.rawValue, account(operands)) { reply in
            let session = reply.parameters["session"] ?? .null
            var lines: [(String, String)] = [
                ("Provider", session["provider"]?.stringValue ?? "-"),
                ("User", session["user"]?.stringValue ?? "-"),
                ("State", session["state"]?.stringValue ?? "-"),
                ("Expires", Format.time(session["expiresAt"]?.integerValue)),
                ("Created", Format.time(session["createdAt"]?.integerValue)),
                ("Owner uid", session["ownerUid"]?.integerValue.map { String($0) } ?? "-"),
                ("Token", session["token"]?.stringValue ?? "-"),
                ("Refresh token", (session["hasRefreshToken"]?.boolValue ?? false) ? "yes" : "no"),
            ]
            if let url = session["instanceUrl"]?.stringValue { lines.append(("Instance URL", url)) }
            if let connection = session["connection"]?.stringValue { lines.append(("Connection", connection)) }
            if let at = session["refreshAt"]?.integerValue { lines.append(("Refresh at", Format.time(at))) }
            if let at = session["lastRefreshAt"]?.integerValue { lines.append(("Last refresh", Format.time(at))) }
            if let failures = session["consecutiveFailures"]?.integerValue, failures > 0 {
                lines.append(("Failures", String(failures)))
            }
            if let error = session["lastError"]?.stringValue { lines.append(("Last error", error)) }
            if let at = session["nextRetryAt"]?.integerValue { lines.append(("Next retry", Format.time(at))) }
            if session["unsaved"]?.boolValue == true { lines.append(("Unsaved", "yes (the store write is retried)")) }
            if let name = session["profile"]?["name"]?.stringValue { lines.append(("Name", name)) }
            for (key, value) in lines { output.out(Format.pad(key + ":", 15) + value) }
        }
    }

    mutating func list() -> ExitCode {
        let sessions: [Session]
        do {
            // Every page, to the last; a page too large for vaultd's output limit is asked for in halves.
            sessions = try VaultConnection(path: socketPath).sessions()
        } catch {
            return report(error)
        }
        if json {
            output.out(JSON.object(["sessions": .array(sessions.map(\.json))]).text)
            return .ok
        }
        if sessions.isEmpty {
            output.out("no sessions")
            return .ok
        }
        var rows = [["PROVIDER", "USER", "STATE", "EXPIRES", "OWNER"]]
        for s in sessions {
            rows.append([
                s.account.provider, s.account.user, s.state.rawValue, Format.time(s.expiresAt?.seconds),
                s.ownerUID.map { String($0) } ?? "-",
            ])
        }
        for line in Format.table(rows) { output.out(line) }
        return .ok
    }

    mutating func token(_ command: ParsedCommand) -> ExitCode {
        var parameters = account(command.arguments)
        if let text = command.value("--min-valid") {
            guard let value = Int64(text), value >= 0 else {
                return usage("token: --min-valid needs a number of seconds, not '\(text)'", command: "token")
            }
            parameters["minValidSeconds"] = .int(value)
        }
        return call(VaultMethod.getToken.rawValue, parameters) { reply in
            output.out(reply.parameters["token"]?.stringValue ?? "")
        }
    }

    mutating func kick(_ command: ParsedCommand) -> ExitCode {
        let positional = command.arguments
        var parameters = account(positional)
        if let reason = command.value("--reason") { parameters["reason"] = .string(reason) }
        return call(VaultMethod.forceLogout.rawValue, parameters) { _ in
            output.out("kicked offline: \(positional[1]) @ \(positional[0])")
        }
    }

    /// Prints vaultctl's help, or one command's.
    mutating func help(_ command: ParsedCommand) -> ExitCode {
        guard let name = command.arguments.first else {
            output.out(Help.tool)
            return .ok
        }
        guard let spec = CommandTable.command(name) else { return usage("unknown command '\(name)'") }
        output.out(Help.command(spec))
        return .ok
    }

    /// Prints the completion script for the shell named.
    mutating func completion(_ command: ParsedCommand) -> ExitCode {
        output.out(Completion.script(for: command.arguments[0]))
        return .ok
    }

    /// Prints events as they come, one line each, until vaultd closes the stream.
    mutating func watch(_ command: ParsedCommand) -> ExitCode {
        let positional = command.arguments
        let kinds = (command.values["--kind"] ?? []).map(JSON.string)
        var parameters: [String: JSON] = positional.isEmpty ? [:] : account(positional)
        if !kinds.isEmpty { parameters["kinds"] = .array(kinds) }
        let path = socketPath ?? SocketPath.default(environment: Environment.all(), uid: getuid())
        do {
            let client = try VarlinkClient(path: path)
            var reply = try client.call(VaultMethod.subscribe.rawValue, parameters, more: true)
            // Bounded by the connection: the loop ends when vaultd ends the stream.
            while true {
                if let failure = daemonError(reply) { return failure }
                if json {
                    output.out(JSON.object(reply.parameters).text)
                } else if let event = reply.parameters["event"] {
                    output.out(describeEvent(event))
                } else if let sessions = reply.parameters["sessions"]?.arrayValue {
                    output.out("watching \(sessions.count) session\(sessions.count == 1 ? "" : "s"); events follow")
                }
                guard reply.continues else { return .ok }
                reply = try client.receive()
            }
        } catch {
            return reportUnreachable(error)
        }
    }

    func describeEvent(_ event: JSON) -> String {
        var line =
            "\(Format.time(event["time"]?.integerValue))  \(Format.pad(event["kind"]?.stringValue ?? "?", 17))"
            + "\(event["user"]?.stringValue ?? "?") @ \(event["provider"]?.stringValue ?? "?")"
        if let reason = event["reason"]?.stringValue { line += "  reason=\(reason)" }
        if let code = event["code"]?.stringValue { line += "  code=\(code)" }
        if let expires = event["expiresAt"]?.integerValue { line += "  expires=\(Format.time(expires))" }
        return line
    }

    // MARK: Plumbing

    /// The parameters that name a session: provider, user and, with `--owner`, its owner.
    func account(_ operands: [String]) -> [String: JSON] {
        var parameters: [String: JSON] = ["provider": .string(operands[0]), "user": .string(operands[1])]
        if let owner { parameters["ownerUid"] = .int(Int64(owner)) }
        return parameters
    }

    /// Calls vaultd; on success prints the reply (as JSON with --json, else via `human`).
    func call(_ method: String, _ parameters: [String: JSON], human: (VarlinkReply) -> Void) -> ExitCode {
        let path = socketPath ?? SocketPath.default(environment: Environment.all(), uid: getuid())
        let reply: VarlinkReply
        do {
            let client = try VarlinkClient(path: path)
            reply = try client.call(method, parameters)
        } catch {
            return reportUnreachable(error)
        }
        if let failure = daemonError(reply) { return failure }
        if json {
            output.out(JSON.object(reply.parameters).text)
        } else {
            human(reply)
        }
        return .ok
    }

    /// Reports a failed typed call as `daemonError` and `reportUnreachable` do.
    func report(_ error: VaultClientError) -> ExitCode {
        switch error {
        case .reply(let reply):
            return daemonError(VarlinkReply(error: reply.name, parameters: reply.parameters)) ?? .daemonError
        case .client(let failure):
            return reportUnreachable(failure)
        case .unexpectedReply:
            output.err("vaultctl: \(error)")
            return .daemonError
        }
    }

    func reportUnreachable(_ error: ClientError) -> ExitCode {
        switch error {
        case .unreachable(let path, let reason):
            output.err(
                "vaultctl: vaultd is not reachable at \(path) (\(reason)); start it with 'scripts/run' or 'systemctl --user start vaultd.socket', or pass --socket PATH"
            )
        case .connection(let message):
            output.err("vaultctl: \(message)")
        case .untrustedPeer, .timedOut:
            output.err("vaultctl: \(error)")
        }
        return .unreachable
    }

    /// Reports an error reply on stderr; nil for a successful reply.
    func daemonError(_ reply: VarlinkReply) -> ExitCode? {
        if let name = reply.error {
            let code = reply.parameters["code"]?.stringValue ?? name
            let message = reply.parameters["message"]?.stringValue ?? describeVarlinkError(reply)
            if json {
                output.err(
                    JSON.object(["error": .string(name), "code": .string(code), "message": .string(message)]).text)
            } else {
                output.err("vaultctl: \(message) (\(code))")
            }
            return .daemonError
        }
        return nil
    }

    func describeVarlinkError(_ reply: VarlinkReply) -> String {
        if let parameter = reply.parameters["parameter"]?.stringValue { return "invalid parameter '\(parameter)'" }
        return reply.error ?? "unknown error"
    }

    func describe(_ session: JSON) -> String {
        let user = session["user"]?.stringValue ?? "?"
        let provider = session["provider"]?.stringValue ?? "?"
        let expires = session["expiresAt"]?.integerValue.map { ", expires \(Format.time($0))" } ?? ""
        return "\(user) @ \(provider)\(expires)"
    }

    /// Reports bad usage on stderr, pointing to the help of `command` (or of vaultctl).
    func usage(_ message: String, command: String? = nil) -> ExitCode {
        let hint = command.map { "vaultctl help \($0)" } ?? "vaultctl help"
        output.err("vaultctl: \(message); see '\(hint)'")
        return .usage
    }

    enum ReadResult {
        case success(String)
        case failure(String)
    }

    /// Reads the credential from `file`, or from stdin (without echo on a terminal).
    func readCredential(_ file: String?) -> ReadResult {
        var bytes: [UInt8]
        do {
            if let file {
                bytes = try Files.read(file, limit: 1 << 20)
            } else {
                if isatty(0) != 0 {
                    output.err("Paste the token or token response, then press Enter and Ctrl-D:")
                    bytes = try Terminal.withoutEcho { () throws(SystemError) -> [UInt8] in
                        try Files.readAll(0, limit: 1 << 20, name: "stdin")
                    }
                } else {
                    bytes = try Files.readAll(0, limit: 1 << 20, name: "stdin")
                }
            }
        } catch {
            return .failure("cannot read the token: \(error)")
        }
        defer { bytes.withUnsafeMutableBytes { raw in for i in raw.indices { raw[i] = 0 } } }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            return .failure("the token is not UTF-8 text")
        }
        if text.allSatisfy({ $0.isWhitespace }) {
            return .failure("no token given: pipe it on stdin or pass --token-file FILE (never as an argument)")
        }
        return .success(text)
    }
}

/// Where vaultctl writes: stdout and stderr, or a capture in tests.
public struct Output: Sendable {
    let out: @Sendable (String) -> Void
    let err: @Sendable (String) -> Void

    /// Writes lines through the given functions.
    public init(out: @escaping @Sendable (String) -> Void, err: @escaping @Sendable (String) -> Void) {
        self.out = out
        self.err = err
    }

    /// The process's stdout and stderr.
    public static let standard = Output(out: { write(1, $0 + "\n") }, err: { write(2, $0 + "\n") })

    private static func write(_ fd: Int32, _ text: String) {
        var bytes = Array(text.utf8)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeMutableBytes { Glibc.write(fd, $0.baseAddress! + offset, $0.count - offset) }
            if n <= 0 {
                if n < 0 && errno == EINTR { continue }
                return
            }
            offset += n
        }
    }
}
