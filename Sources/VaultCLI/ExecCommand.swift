import Glibc
import VaultClient
import VaultCore

/// What `vaultctl exec` does to its command when the token is refreshed.
enum RefreshAction: Equatable {
    /// Stop the command (SIGTERM, then SIGKILL after the grace time) and start it again with the new token.
    case restart
    /// Send the command this signal; it reads the new token itself (`vaultctl token`).
    case signal(Int32)
    /// Leave the command alone.
    case none

    /// Reads `restart`, `none` or `signal:NAME` (`signal:HUP`, `signal:SIGUSR1`, `signal:10`).
    init?(_ text: String) {
        switch text {
        case "restart": self = .restart
        case "none": self = .none
        default:
            guard text.hasPrefix("signal:") else { return nil }
            var name = String(text.dropFirst("signal:".count)).uppercased()
            if name.hasPrefix("SIG") { name.removeFirst(3) }
            if let number = Int32(name), number > 0, number < 65 {
                self = .signal(number)
            } else if let number = RefreshAction.signals[name] {
                self = .signal(number)
            } else {
                return nil
            }
        }
    }

    /// The signals a command is usually told to reload with.
    static let signals: [String: Int32] = [
        "HUP": SIGHUP, "INT": SIGINT, "QUIT": SIGQUIT, "TERM": SIGTERM, "USR1": SIGUSR1, "USR2": SIGUSR2,
        "WINCH": SIGWINCH, "ALRM": SIGALRM,
    ]
}

/// The write end of the pipe the signal handler reports to; set once before
/// the handler is installed.
nonisolated(unsafe) private var execSignalPipe: Int32 = -1

/// The events after which the command must not keep the token.
private let sessionEndings: Set<EventKind> = [.logoutSuccess, .kickedOffline, .tokenInvalid, .tokenExpired]

extension VaultCtl {
    /// `vaultctl exec`: runs a command with the token in its environment and
    /// keeps it in step with the session (see the command's help).
    mutating func exec(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        let variables: [(name: String, field: SessionField)]
        switch Self.execVariables(command.values["--env"] ?? []) {
        case .success(let list): variables = list
        case .failure(let problem): return usage("exec: \(problem.message)", command: "exec")
        }
        let actionText = command.value("--on-refresh") ?? "restart"
        guard let action = RefreshAction(actionText) else {
            return usage(
                "exec: --on-refresh takes restart, none or signal:NAME (signal:HUP), not '\(actionText)'",
                command: "exec")
        }
        let signalGroup = command.has("--signal-group")
        guard !signalGroup || actionText.hasPrefix("signal:") else {
            return usage("exec: --signal-group goes with --on-refresh signal:NAME", command: "exec")
        }
        var grace = 10
        if let text = command.value("--grace") {
            guard let seconds = Int(text), seconds >= 0, seconds <= 3600 else {
                return usage("exec: --grace needs a number of seconds from 0 to 3600, not '\(text)'", command: "exec")
            }
            grace = seconds
        }
        var session = ExecSession(
            ctl: self, provider: provider, user: user, variables: variables, action: action,
            signalGroup: signalGroup, graceSeconds: grace, argv: command.trailing)
        return session.run()
    }

    /// A bad `--env`, said in words.
    struct EnvProblem: Error {
        var message: String
    }

    /// The variables `exec` gives its command, from its `--env` options:
    /// every field's own (`SessionField.variable`), and for each `--env
    /// NAME=FIELD` the field under NAME too. `--env NAME` puts the token
    /// under NAME instead of VAULTD_TOKEN.
    static func execVariables(_ options: [String]) -> Result<[(name: String, field: SessionField)], EnvProblem> {
        var named: [(name: String, field: SessionField)] = []
        var tokenRenamed = false
        for option in options {
            let parts = option.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
            guard isEnvironmentName(parts[0]) else {
                return .failure(
                    EnvProblem(
                        message: "--env needs NAME or NAME=FIELD, NAME of letters, digits and _, not '\(option)'"))
            }
            if parts.count == 1 {
                tokenRenamed = true
                named.append((parts[0], .token))
            } else if let field = SessionField(rawValue: parts[1]) {
                named.append((parts[0], field))
            } else {
                return .failure(
                    EnvProblem(
                        message: "--env \(parts[0])=FIELD: FIELD is one of \(SessionField.names), not '\(parts[1])'"))
            }
        }
        let own = SessionField.allCases.filter { !(tokenRenamed && $0 == .token) }.map { ($0.variable, $0) }
        return .success(own + named)
    }

    /// Whether `name` can be an environment variable's name.
    static func isEnvironmentName(_ name: String) -> Bool {
        guard let first = name.utf8.first, !(UInt8(ascii: "0")...UInt8(ascii: "9")).contains(first) else {
            return false
        }
        return name.utf8.allSatisfy {
            ($0 >= UInt8(ascii: "A") && $0 <= UInt8(ascii: "Z")) || ($0 >= UInt8(ascii: "a") && $0 <= UInt8(ascii: "z"))
                || ($0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9")) || $0 == UInt8(ascii: "_")
        }
    }
}

/// One run of `vaultctl exec`: the subscription, the child, and the loop
/// that waits on both and on signals.
struct ExecSession {
    let ctl: VaultCtl
    let provider: String
    let user: String
    /// The variables the command gets, and the field each holds.
    let variables: [(name: String, field: SessionField)]
    let action: RefreshAction
    /// Whether `signal:NAME` goes to the command's whole process group, not
    /// to the command alone: its own children may die of a signal they do not
    /// expect (SIGHUP's default is to end a process).
    let signalGroup: Bool
    let graceSeconds: Int
    let argv: [String]

    private var token: Token?
    private var child: pid_t = 0
    private var pump: EventPump?
    private var signalRead: Int32 = -1

    init(
        ctl: VaultCtl, provider: String, user: String, variables: [(name: String, field: SessionField)],
        action: RefreshAction, signalGroup: Bool, graceSeconds: Int, argv: [String]
    ) {
        self.ctl = ctl
        self.provider = provider
        self.user = user
        self.variables = variables
        self.action = action
        self.signalGroup = signalGroup
        self.graceSeconds = graceSeconds
        self.argv = argv
    }

    /// Why the loop ended.
    private enum Outcome {
        case childExited(Int32)
        case sessionEnded(String)
        case failed(VaultCtl.ExitCode)
    }

    private enum Connected {
        case success
        case failure(VaultClientError)
    }

    mutating func run() -> VaultCtl.ExitCode {
        // Subscribe before reading the token, so no refresh falls between the two.
        if case .failure(let error) = connect() { return ctl.report(error) }
        installSignalHandlers()
        guard let first = token, spawn(first) else { return .daemonError }
        let outcome = loop()
        switch outcome {
        case .childExited(let status):
            return VaultCtl.ExitCode(rawValue: status)
        case .sessionEnded(let why):
            stopChild()
            ctl.output.err("vaultctl: \(why); the command was stopped")
            return .sessionEnded
        case .failed(let code):
            stopChild()
            return code
        }
    }

    /// Subscribes to the account's events and reads its token.
    private mutating func connect() -> Connected {
        do throws(VaultClientError) {
            let vault = try ctl.connect()
            let stream = try vault.subscribe(
                provider: provider, user: user,
                kinds: [.tokenRefreshed] + sessionEndings.sorted { $0.rawValue < $1.rawValue })
            token = try vault.token(provider: provider, user: user, ownerUID: ctl.owner)
            stream.setReceiveTimeout(seconds: 0)
            pump = EventPump(stream)
            return .success
        } catch {
            return .failure(error)
        }
    }

    /// Waits for signals and events until the child ends or the session does.
    private mutating func loop() -> Outcome {
        var reconnection = ReconnectSchedule(policy: .standard)
        // Bounded by the child: every turn ends when it exits, the session ends, or a signal comes.
        while true {
            var fds = [pollfd(fd: signalRead, events: Int16(POLLIN), revents: 0)]
            if let pump { fds.append(pollfd(fd: pump.wakeFD, events: Int16(POLLIN), revents: 0)) }
            let timeout = reconnection.waitMilliseconds(now: ReconnectSchedule.now())
            let ready = poll(&fds, nfds_t(fds.count), timeout)
            if ready < 0 && errno != EINTR { return .failed(.daemonError) }
            if fds[0].revents != 0, let outcome = handleSignals() { return outcome }
            if let current = pump, fds.count > 1, fds[1].revents != 0 {
                for item in current.take() {
                    switch item {
                    case .event(let event):
                        if sessionEndings.contains(event.kind) {
                            return .sessionEnded("the session of \(user) @ \(provider) ended (\(event.kind.rawValue))")
                        }
                        if let outcome = tokenMayHaveChanged() { return outcome }
                    case .ended(let why):
                        ctl.output.err(Reconnecting.lostLine(why))
                        pump = nil
                        reconnection.lost(now: ReconnectSchedule.now())
                    }
                }
            }
            if reconnection.isDue(now: ReconnectSchedule.now()) {
                let before = token?.value
                switch connect() {
                case .success:
                    reconnection.connected()
                    ctl.output.err(Reconnecting.backLine)
                    if token?.value != before, let outcome = apply() { return outcome }
                case .failure(let error):
                    if error.vaultCode == .notLoggedIn {
                        return .sessionEnded("the session of \(user) @ \(provider) is gone")
                    }
                    guard ReconnectPolicy.isWorthRetrying(error) else {
                        return .failed(ctl.report(error))
                    }
                    reconnection.failed(now: ReconnectSchedule.now())
                }
            }
        }
    }

    /// After `tokenRefreshed`: reads the token and acts when it changed.
    private mutating func tokenMayHaveChanged() -> Outcome? {
        do throws(VaultClientError) {
            let fresh = try ctl.connect().token(provider: provider, user: user, ownerUID: ctl.owner)
            // The new expiry of a token that stays goes to the next start; only a new token acts.
            defer { token = fresh }
            guard fresh.value != token?.value else { return nil }
        } catch {
            if error.vaultCode == .notLoggedIn {
                return .sessionEnded("the session of \(user) @ \(provider) ended")
            }
            ctl.output.err("vaultctl: could not read the refreshed token: \(error.message)")
            return nil
        }
        return apply()
    }

    /// Does what `--on-refresh` says with the new token.
    private mutating func apply() -> Outcome? {
        switch action {
        case .none:
            return nil
        case .signal(let number):
            kill(signalGroup ? -child : child, number)
            return nil
        case .restart:
            guard let token else { return nil }
            stopChild()
            return spawn(token) ? nil : .failed(.daemonError)
        }
    }

    /// Handles what the signal pipe reported: a child that exited, or a
    /// signal to pass on to it.
    private mutating func handleSignals() -> Outcome? {
        var bytes = [UInt8](repeating: 0, count: 64)
        let n = read(signalRead, &bytes, bytes.count)
        for number in bytes.prefix(max(0, n)).map(Int32.init) where number != SIGCHLD {
            // SIGINT, SIGTERM, SIGHUP: the command decides; vaultctl ends with it.
            if child > 0 { kill(-child, number) }
        }
        guard child > 0 else { return nil }
        var status: Int32 = 0
        let reaped = waitpid(child, &status, WNOHANG)
        guard reaped == child else { return nil }
        child = 0
        return .childExited(Self.exitStatus(status))
    }

    /// Stops the child (its process group): SIGTERM, then SIGKILL after the
    /// grace time. Returns its exit status, or nil when there was none.
    @discardableResult
    private mutating func stopChild() -> Int32? {
        guard child > 0 else { return nil }
        kill(-child, SIGTERM)
        let deadline = Self.nowMilliseconds() + UInt64(graceSeconds) * 1000
        var status: Int32 = 0
        while true {
            if waitpid(child, &status, WNOHANG) == child { break }
            let now = Self.nowMilliseconds()
            if now >= deadline {
                kill(-child, SIGKILL)
                while waitpid(child, &status, 0) < 0 && errno == EINTR {}
                break
            }
            var fds = [pollfd(fd: signalRead, events: Int16(POLLIN), revents: 0)]
            _ = poll(&fds, 1, Int32(min(deadline - now, 100)))
            if fds[0].revents != 0 {
                var bytes = [UInt8](repeating: 0, count: 64)
                _ = read(signalRead, &bytes, bytes.count)
            }
        }
        child = 0
        return Self.exitStatus(status)
    }

    /// The session's fields as `token` and the arguments tell them.
    func fields(_ token: Token) -> SessionFields {
        SessionFields(
            token: token.value, tokenType: token.tokenType, expiresAt: token.expiresAt?.seconds,
            instanceURL: token.instanceURL, scope: token.scope, provider: provider, user: user)
    }

    /// Starts the command in a process group of its own, with the session's
    /// fields in `variables` (one the session lacks is unset, not inherited)
    /// and the signals vaultctl handles back at their defaults.
    private mutating func spawn(_ token: Token) -> Bool {
        let fields = fields(token)
        let managed = Set(variables.map(\.name) + SessionField.allCases.map(\.variable))
        var environment: [String] = []
        var cursor = environ
        while let entry = cursor.pointee {
            let text = String(cString: entry)
            let name = text.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false).first ?? ""
            if !managed.contains(String(name)) { environment.append(text) }
            cursor += 1
        }
        for (name, field) in variables {
            if field == .token {
                environment.append(name + "=" + token.value.revealed)
            } else if let value = fields.text(field) {
                environment.append(name + "=" + value)
            }
        }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t()
        sigemptyset(&none)
        posix_spawnattr_setsigmask(&attributes, &none)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for number in [SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE] { sigaddset(&defaults, number) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setpgroup(&attributes, 0)
        posix_spawnattr_setflags(
            &attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETPGROUP))
        var cArguments = argv.map { strdup($0) } + [nil]
        var cEnvironment = environment.map { strdup($0) } + [nil]
        defer {
            for pointer in cArguments { free(pointer) }
            // The token is in one of these: zero them before they are freed.
            for pointer in cEnvironment {
                if let pointer { memset(pointer, 0, strlen(pointer)) }
                free(pointer)
            }
        }
        var pid: pid_t = 0
        let result = posix_spawnp(&pid, argv[0], nil, &attributes, &cArguments, &cEnvironment)
        guard result == 0 else {
            ctl.output.err("vaultctl: cannot run \(argv[0]): \(String(cString: strerror(result)))")
            return false
        }
        child = pid
        return true
    }

    /// Reports SIGINT, SIGTERM, SIGHUP and SIGCHLD through a pipe the loop polls.
    private mutating func installSignalHandlers() {
        guard let ends = makePipe() else { return }
        signalRead = ends[0]
        execSignalPipe = ends[1]
        for number in [SIGINT, SIGTERM, SIGHUP, SIGCHLD] {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = { number in
                var byte = UInt8(truncatingIfNeeded: number)
                _ = write(execSignalPipe, &byte, 1)
            }
            action.sa_flags = SA_RESTART
            sigemptyset(&action.sa_mask)
            sigaction(number, &action, nil)
        }
        var signals = sigset_t()
        sigemptyset(&signals)
        for number in [SIGINT, SIGTERM, SIGHUP, SIGCHLD] { sigaddset(&signals, number) }
        sigprocmask(SIG_UNBLOCK, &signals, nil)
    }

    /// A wait status as a shell shows it: the exit code, or 128 + the signal.
    static func exitStatus(_ status: Int32) -> Int32 {
        let signal = status & 0x7F
        return signal == 0 ? (status >> 8) & 0xFF : 128 + signal
    }

    static func nowMilliseconds() -> UInt64 { ReconnectSchedule.now() }
}

/// Reads a subscription on a thread of its own and hands what it read to the
/// loop, waking it through a pipe.
final class EventPump: @unchecked Sendable {
    /// What the reader thread saw.
    enum Item {
        case event(VaultEvent)
        case ended(String)
    }

    let wakeFD: Int32
    private let wakeWrite: Int32
    private let stream: VaultEventStream
    private var lock = pthread_mutex_t()
    private var items: [Item] = []

    init(_ stream: VaultEventStream) {
        self.stream = stream
        let ends = makePipe() ?? [-1, -1]
        wakeFD = ends[0]
        wakeWrite = ends[1]
        pthread_mutex_init(&lock, nil)
        var thread = pthread_t()
        let context = Unmanaged.passRetained(self).toOpaque()
        pthread_create(
            &thread, nil,
            { context in
                let pump = Unmanaged<EventPump>.fromOpaque(context!).takeRetainedValue()
                pump.readEvents()
                return nil
            }, context)
        pthread_detach(thread)
    }

    /// Reads until the stream ends; each item wakes the loop.
    private func readEvents() {
        // Bounded by the connection: next() returns nil or throws when it closes.
        while true {
            let item: Item
            do throws(VaultClientError) {
                guard let event = try stream.next() else {
                    push(.ended(stream.end?.description ?? "vaultd closed the connection"))
                    return
                }
                item = .event(event)
            } catch {
                push(.ended(error.description))
                return
            }
            push(item)
        }
    }

    private func push(_ item: Item) {
        pthread_mutex_lock(&lock)
        items.append(item)
        pthread_mutex_unlock(&lock)
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    /// Everything read since the last call.
    func take() -> [Item] {
        var drain = [UInt8](repeating: 0, count: 256)
        while read(wakeFD, &drain, drain.count) > 0 {}
        pthread_mutex_lock(&lock)
        defer { pthread_mutex_unlock(&lock) }
        let taken = items
        items.removeAll()
        return taken
    }

    deinit {
        shutdown(stream.raw.fileDescriptor, Int32(SHUT_RDWR))
        close(wakeFD)
        close(wakeWrite)
    }
}

/// A pipe whose two ends are non-blocking and closed on exec, or nil.
func makePipe() -> [Int32]? {
    var ends: [Int32] = [0, 0]
    guard pipe(&ends) == 0 else { return nil }
    for end in ends {
        _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
    }
    return ends
}
