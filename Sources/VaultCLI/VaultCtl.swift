import Glibc
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// vaultctl: the command-line client of vaultd. Exit codes: 0 ok, 1 an error
/// from vaultd, 2 bad usage, 3 vaultd not reachable.
public struct VaultCtl {
    /// Process exit codes: 0 ok, 1 an error from vaultd, 2 bad usage, 3 vaultd
    /// not reachable; `exec` also passes on its command's own status, and
    /// ends with `sessionEnded` when the session did.
    public struct ExitCode: RawRepresentable, Equatable, Sendable, CustomStringConvertible {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        public static let ok = ExitCode(rawValue: 0)
        public static let daemonError = ExitCode(rawValue: 1)
        public static let usage = ExitCode(rawValue: 2)
        public static let unreachable = ExitCode(rawValue: 3)
        /// `exec`: the session ended (logout, kick, invalid or expired token)
        /// and the command was stopped; 75 is sysexits' EX_TEMPFAIL, "try
        /// again later", which a service manager can be told to restart on.
        public static let sessionEnded = ExitCode(rawValue: 75)

        public var description: String { String(rawValue) }
    }

    /// The version printed by `--version`.
    public static let version = VaultdVersion.current

    /// How long a call waits for vaultd unless `--timeout` says otherwise: long
    /// enough for a login through a slow provider, short enough that a vaultd
    /// that accepts and never answers does not hang a script.
    public static let defaultTimeoutSeconds = 60

    var json = false
    var socketPath: String?
    var timeoutSeconds = VaultCtl.defaultTimeoutSeconds
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
        if let status = TokenFastPath.run(arguments, output: .standard) { return status }
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
            output.out(Help.tool(width: output.columns()))
            return .ok
        }
        if invocation.wantsHelp {
            output.out(Help.command(command.spec, width: output.columns()))
            return .ok
        }
        json = invocation.globalFlags.contains("--json")
        socketPath = invocation.globalValues["--socket"]
        if let text = invocation.globalValues["--timeout"] {
            guard let seconds = Int(text), seconds > 0, seconds <= 86400 else {
                return usage("--timeout needs a number of seconds from 1 to 86400, not '\(text)'")
            }
            timeoutSeconds = seconds
        }
        if let name = invocation.globalValues["--owner"] {
            if let uid = UInt32(name) {
                owner = uid
            } else if let uid = UserLookup.uid(named: name) {
                owner = uid
            } else {
                return usage(
                    "--owner: no user '\(name)' in \(UserLookup.passwdPath) or systemd's user database; pass the uid instead"
                )
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
        let (provider, user) = (positional[0], positional[1])
        let replace = command.has("--replace")
        var profile: UserProfile?
        if let file = command.value("--profile-file") {
            switch readProfile(file, user: user) {
            case .success(let read): profile = read
            case .failure(let error):
                output.err("vaultctl: \(error.message) (\(error.code.seedCode))")
                return .usage
            }
        }
        if command.has("--from-provider") {
            // The provider obtains the tokens itself (client credentials, an exec helper).
            return run { vault throws(VaultClientError) in
                let result = try vault.loginFromProvider(
                    provider: provider, user: user, profile: profile, ownerUID: owner, replace: replace)
                return (loginJSON(result), "\(loginWhat(result)): \(describe(result.session))")
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
        let trimmed = LoginCredential.trimmed(text)
        let response = trimmed.hasPrefix("{") ? try? JSON.parse(trimmed) : nil
        let expiry = expiresAt.map(UnixTime.init(seconds:))
        return run { vault throws(VaultClientError) in
            let result =
                if let response {
                    try vault.login(
                        provider: provider, user: user, tokenResponse: response, expiresAt: expiry, profile: profile,
                        ownerUID: owner, replace: replace)
                } else {
                    try vault.login(
                        provider: provider, user: user, token: credential.tokens.accessToken.revealed,
                        expiresAt: expiry, profile: profile, ownerUID: owner, replace: replace)
                }
            return (loginJSON(result), "\(loginWhat(result)): \(describe(result.session))")
        }
    }

    func loginJSON(_ result: LoginResult) -> JSON {
        var o: [String: JSON] = ["session": result.session.json, "created": .bool(result.created)]
        if result.replaced { o["replaced"] = true }
        return .object(o)
    }

    /// What a login did, as the first words of its line.
    func loginWhat(_ result: LoginResult) -> String {
        result.replaced ? "replaced" : result.created ? "logged in" : "already logged in"
    }

    mutating func logout(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        return run { vault throws(VaultClientError) in
            try vault.logout(provider: provider, user: user, ownerUID: owner)
            return (.object([:]), "logged out: \(user) @ \(provider)")
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
        let secret = Secret(LoginCredential.trimmed(text))
        return run { vault throws(VaultClientError) in
            try vault.setProviderSecret(provider: provider, secret: secret)
            return (.object([:]), "client secret of \(provider) stored in the secret store")
        }
    }

    mutating func refresh(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        return run { vault throws(VaultClientError) in
            let session = try vault.refresh(provider: provider, user: user, ownerUID: owner)
            return (.object(["session": session.json]), "refreshed: \(describe(session))")
        }
    }

    mutating func status(_ command: ParsedCommand) -> ExitCode {
        let operands = command.arguments
        if operands.isEmpty { return list() }
        let (provider, user) = (operands[0], operands[1])
        return run { vault throws(VaultClientError) in
            let session = try vault.session(provider: provider, user: user, ownerUID: owner)
            return (.object(["session": session.json]), statusText(session.json))
        }
    }

    /// `vaultctl status PROVIDER USER` for a human: one field per line.
    func statusText(_ session: JSON) -> String {
        var lines: [(String, String)] = [
            ("Provider", session["provider"]?.stringValue ?? "-"),
            ("User", session["user"]?.stringValue ?? "-"),
            ("State", session["state"]?.stringValue ?? "-"),
            ("Expires", Format.time(session["expiresAt"]?.integerValue)),
            ("Created", Format.time(session["createdAt"]?.integerValue)),
            ("Owner", session["ownerUid"]?.integerValue.map { ownerName(UInt32(truncatingIfNeeded: $0)) } ?? "-"),
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
        if let error = session["lastError"]?.stringValue {
            let code = session["lastErrorCode"]?.stringValue
            lines.append(("Last error", code.map { "\($0): \(error)" } ?? error))
        }
        if let code = session["lastProviderCode"]?.stringValue {
            let words = session["lastProviderMessage"]?.stringValue
            lines.append(("Provider said", words.map { "\(code): \($0)" } ?? code))
        }
        if let at = session["nextRetryAt"]?.integerValue { lines.append(("Next retry", Format.time(at))) }
        if session["unsaved"]?.boolValue == true { lines.append(("Unsaved", "yes (the store write is retried)")) }
        if let error = session["tokenFileError"]?.stringValue { lines.append(("Token file", error)) }
        if let name = session["profile"]?["name"]?.stringValue { lines.append(("Name", name)) }
        if let avatar = session["profile"]?["avatar"]?.stringValue { lines.append(("Avatar", avatar)) }
        if let email = session["profile"]?["metadata"]?["email"]?.stringValue { lines.append(("Email", email)) }
        for client in session["clients"]?.arrayValue ?? [] {
            let pid = client["pid"]?.integerValue.map { String($0) } ?? "?"
            let state = client["state"]?.stringValue ?? "?"
            let since = Format.time(client["since"]?.integerValue)
            lines.append(("Client", "\(client["name"]?.stringValue ?? "?") (pid \(pid)): \(state) since \(since)"))
        }
        return lines.map { Format.pad($0.0 + ":", 15) + $0.1 }.joined(separator: "\n")
    }

    mutating func list() -> ExitCode {
        let sessions: [Session]
        let store: String?
        do {
            // Every page, to the last; a page too large for vaultd's output limit is asked for in halves.
            (sessions, store) = try connect().sessionList()
        } catch {
            return report(error)
        }
        if json {
            var document: [String: JSON] = ["sessions": .array(sessions.map(\.json))]
            document["store"] = store.map(JSON.string)
            output.out(JSON.object(document).text)
            return .ok
        }
        // A store that is away is said first: what the list shows cannot change meanwhile.
        if let store, store != "available" {
            let until = store == "locked" ? "it is unlocked" : "it is back"
            output.out("store: \(store): tokens are served from memory, logins and logouts are refused until \(until)")
        }
        if sessions.isEmpty {
            output.out("no sessions")
            return .ok
        }
        var owners: [UInt32: String] = [:]
        for uid in Set(sessions.compactMap(\.ownerUID)) { owners[uid] = ownerName(uid) }
        var rows = [["PROVIDER", "USER", "STATE", "EXPIRES", "OWNER"]]
        for s in sessions {
            rows.append([
                s.account.provider, s.account.user, s.state.rawValue, Format.time(s.expiresAt?.seconds),
                s.ownerUID.flatMap { owners[$0] } ?? "-",
            ])
        }
        for line in Format.table(rows) { output.out(line) }
        return .ok
    }

    mutating func token(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        var minValid: Int64?
        if let text = command.value("--min-valid") {
            guard let value = Int64(text), value >= 0 else {
                return usage("token: --min-valid needs a number of seconds, not '\(text)'", command: "token")
            }
            minValid = value
        }
        return run { vault throws(VaultClientError) in
            let token = try vault.token(provider: provider, user: user, minValidSeconds: minValid, ownerUID: owner)
            var reply: [String: JSON] = [
                "token": .string(token.value.revealed), "ownerUid": .int(Int64(token.ownerUID)),
            ]
            reply["tokenType"] = token.tokenType.map(JSON.string)
            reply["expiresAt"] = token.expiresAt.map { .int($0.seconds) }
            reply["instanceUrl"] = token.instanceURL.map(JSON.string)
            reply["scope"] = token.scope.map(JSON.string)
            return (.object(reply), token.value.revealed)
        }
    }

    mutating func kick(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        let reason = command.value("--reason")
        return run { vault throws(VaultClientError) in
            try vault.forceLogout(provider: provider, user: user, reason: reason, ownerUID: owner)
            return (.object([:]), "kicked offline: \(user) @ \(provider)")
        }
    }

    /// Prints vaultctl's help, or one command's.
    mutating func help(_ command: ParsedCommand) -> ExitCode {
        guard let name = command.arguments.first else {
            output.out(Help.tool(width: output.columns()))
            return .ok
        }
        guard let spec = CommandTable.command(name) else { return usage("unknown command '\(name)'") }
        output.out(Help.command(spec, width: output.columns()))
        return .ok
    }

    /// Prints the completion script for the shell named.
    mutating func completion(_ command: ParsedCommand) -> ExitCode {
        output.out(Completion.script(for: command.arguments[0]))
        return .ok
    }

    /// Prints events as they come, one line each, until interrupted. When
    /// vaultd goes away it says so, reconnects on `ReconnectPolicy.standard`'s
    /// schedule and prints the sessions as they are then, unless
    /// `--no-reconnect` asks for the end of the stream to end watch.
    mutating func watch(_ command: ParsedCommand) -> ExitCode {
        let positional = command.arguments
        var kinds: [EventKind] = []
        for name in command.values["--kind"] ?? [] {
            guard let kind = EventKind(rawValue: name) else {
                let known = EventKind.allCases.map(\.rawValue).joined(separator: ", ")
                return usage("watch: --kind \(name) is not an event kind (\(known))", command: "watch")
            }
            kinds.append(kind)
        }
        let reconnect = !command.has("--no-reconnect")
        do throws(VaultClientError) {
            let stream = try connect().subscribe(
                provider: positional.first, user: positional.count > 1 ? positional[1] : nil, kinds: kinds,
                reconnect: reconnect ? .standard : nil)
            if json {
                output.out(JSON.object(["sessions": .array(stream.snapshot.map(\.json))]).text)
            } else {
                let count = stream.snapshot.count
                output.out("watching \(count) session\(count == 1 ? "" : "s"); events follow")
            }
            // Events may be hours apart: only the subscription itself was bounded by --timeout.
            stream.setReceiveTimeout(seconds: 0)
            var seen = WatchCatchUp(stream.snapshot)
            let (output, json) = (self.output, self.json)
            stream.onDisconnect = { why in output.err(Reconnecting.lostLine(why)) }
            stream.onReconnect = { sessions in
                output.err(Reconnecting.backLine)
                for line in seen.catchUp(sessions, json: json) { output.out(line) }
            }
            // Bounded by the connection: the loop ends when vaultd ends the
            // stream (with --no-reconnect), or when reconnecting fails for good.
            while let event = try stream.next() {
                seen.saw(event.account)
                output.out(json ? JSON.object(["event": event.json()]).text : describeEvent(event.json()))
            }
            switch stream.end {
            case .error(let reply): return report(.reply(reply))
            case .closed:
                output.err("vaultctl: vaultd closed the connection (it stopped or restarted); run watch again")
                return .unreachable
            case .finished, nil: return .ok
            }
        } catch {
            return report(error)
        }
    }

    /// The width of `watch`'s kind column: the longest kind and two spaces.
    static let kindColumn = (EventKind.allCases.map(\.rawValue.count).max() ?? 0) + 2

    /// One event as `watch` prints it: time, kind and account in columns,
    /// then what else the event carries.
    func describeEvent(_ event: JSON) -> String {
        var line =
            "\(Format.time(event["time"]?.integerValue))  "
            + Format.pad(event["kind"]?.stringValue ?? "?", Self.kindColumn)
            + "\(event["user"]?.stringValue ?? "?") @ \(event["provider"]?.stringValue ?? "?")"
        if let reason = event["reason"]?.stringValue { line += "  reason=\(reason)" }
        if let code = event["code"]?.stringValue { line += "  code=\(code)" }
        if let code = event["providerCode"]?.stringValue { line += "  providerCode=\(code)" }
        if let expires = event["expiresAt"]?.integerValue { line += "  expires=\(Format.time(expires))" }
        if let source = event["source"]?.stringValue { line += "  source=\(source)" }
        if let client = event["client"]?.stringValue { line += "  client=\(client)" }
        if let message = event["message"]?.stringValue { line += "  message=\(message)" }
        return line
    }

    // MARK: Plumbing

    /// A connection to vaultd at `--socket` (or the default path), every wait bounded by `--timeout`.
    func connect() throws(VaultClientError) -> VaultConnection {
        try VaultConnection(path: socketPath, timeoutSeconds: timeoutSeconds)
    }

    /// Connects, runs one typed call, and prints what it returns: the JSON
    /// with --json, else the text for a human. Failures are reported as
    /// `report` does.
    func run(_ call: (VaultConnection) throws(VaultClientError) -> (json: JSON, text: String)) -> ExitCode {
        do throws(VaultClientError) {
            let answer = try call(try connect())
            output.out(json ? answer.json.text : answer.text)
            return .ok
        } catch {
            return report(error)
        }
    }

    /// Reports a failed call on stderr and returns the exit code: 1 for an
    /// error vaultd answered with, 3 when vaultd could not be reached or did
    /// not answer in time.
    func report(_ error: VaultClientError) -> ExitCode {
        switch error {
        case .reply(let reply):
            if json {
                var fields: [String: JSON] = [
                    "error": .string(reply.name), "code": .string(reply.code ?? reply.name),
                    "message": .string(reply.message),
                ]
                fields["providerCode"] = reply.providerCode.map(JSON.string)
                fields["providerMessage"] = reply.providerMessage.map(JSON.string)
                output.err(JSON.object(fields).text)
            } else {
                output.err("vaultctl: \(reply)")
            }
            return .daemonError
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

    /// An owner as `list` and `status` show it: the user's name, or the uid
    /// when no user has it. Looked up as `--owner` is (`UserLookup`), not with
    /// getpwuid_r: the static vaultctl has no NSS.
    func ownerName(_ uid: UInt32) -> String {
        UserLookup.name(uid: uid) ?? String(uid)
    }

    func describe(_ session: Session) -> String {
        let expires = session.expiresAt.map { ", expires \(Format.time($0.seconds))" } ?? ""
        return "\(session.account.user) @ \(session.account.provider)\(expires)"
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

    /// Reads `--profile-file`: a JSON object with CometChat's User fields
    /// (`name`, `avatar`, `metadata`, ...); a missing `uid` is `user`. The
    /// message of a failure names the file.
    func readProfile(_ file: String, user: String) -> Result<UserProfile, VaultError> {
        let bytes: [UInt8]
        do { bytes = try Files.read(file, limit: 1 << 20) } catch {
            return .failure(VaultError(.invalidParameter, "cannot read the profile file \(file): \(error)"))
        }
        let json: JSON
        do { json = try JSON.parse(bytes) } catch {
            return .failure(
                VaultError(
                    .invalidParameter,
                    "the profile file \(file) is not valid JSON (\(error.description)); it must hold one object such as {\"name\": \"Alice\"}"
                ))
        }
        guard case .object(var o) = json else {
            return .failure(
                VaultError(.invalidParameter, "the profile file \(file) holds a JSON \(json.typeName), not an object"))
        }
        if o["uid"] == nil { o["uid"] = .string(user) }
        do { return .success(try UserProfile(json: .object(o))) } catch {
            return .failure(
                VaultError(.invalidParameter, "the profile file \(file) is not a profile: \(error.message)"))
        }
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
    /// How wide the help texts may be.
    let columns: @Sendable () -> Int

    /// Writes lines through the given functions; help is `columns` wide.
    public init(
        out: @escaping @Sendable (String) -> Void, err: @escaping @Sendable (String) -> Void,
        columns: @escaping @Sendable () -> Int = { 80 }
    ) {
        self.out = out
        self.err = err
        self.columns = columns
    }

    /// The process's stdout and stderr; help as wide as the terminal.
    public static let standard = Output(
        out: { write(1, $0 + "\n") }, err: { write(2, $0 + "\n") }, columns: { terminalColumns(1) })

    /// The width of the terminal `fd` is, or 80 when it is none (a pipe, a
    /// file) or says 0 columns. At least 40, so the help stays readable.
    static func terminalColumns(_ fd: Int32) -> Int {
        var size = winsize()
        guard isatty(fd) != 0, ioctl(fd, UInt(TIOCGWINSZ), &size) == 0, size.ws_col > 0 else { return 80 }
        return max(40, Int(size.ws_col))
    }

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
