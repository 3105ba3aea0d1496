import Dispatch
import Glibc
import VaultCore
import VaultSystem

/// Where fresh tokens come from for a provider that can log in or refresh.
public protocol TokenProvider: Sendable {
    /// Obtains tokens for `account` (client credentials, an exec helper's
    /// login), with the credential the client gave, if any.
    func login(_ account: Account, credential: Secret?) async -> RefreshOutcome
    /// True when a token the client gives is a credential for `login` (an auth
    /// key for the helper) rather than the session's token itself.
    var exchangesCredentials: Bool { get }
    /// New tokens for the session of `record`.
    func refresh(_ record: SessionRecord) async -> RefreshOutcome
    /// True when `refresh` can work for this record.
    func canRefresh(_ record: SessionRecord) -> Bool
    /// Tells the provider the session ended; true when it accepted.
    func revoke(_ record: SessionRecord) async -> Bool
}

extension OAuth2Client: TokenProvider {
    public func login(_ account: Account, credential: Secret?) async -> RefreshOutcome { await clientCredentials() }

    public var exchangesCredentials: Bool { false }

    public func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        guard let refreshToken = record.tokens.refreshToken else {
            return .permanent(code: "no_refresh_token", reason: "the session has no refresh token")
        }
        return await refresh(using: refreshToken)
    }

    public func canRefresh(_ record: SessionRecord) -> Bool { record.tokens.refreshToken != nil }

    public func revoke(_ record: SessionRecord) async -> Bool {
        guard let refreshToken = record.tokens.refreshToken, settings.revocationURL != nil else { return true }
        return await revoke(refreshToken)
    }
}

/// A helper program that logs in, refreshes and revokes for vaultd (the
/// seeds' "trusted backend": CometChat's REST API, OpenIM's admin API). It is
/// run directly, never through a shell, with one JSON object on stdin; it
/// answers one JSON object on stdout: a token response, or
/// `{"error": CODE, "message": ...}`. Its run time and output are bounded and
/// its stderr is logged with every known token masked.
public struct ExecProvider: TokenProvider {
    /// The helper's command line and time limit.
    public let settings: ExecSettings
    /// Where the helper's stderr goes.
    public let log: Logger
    /// The most stdout read from one run.
    public static let maximumOutput = 64 * 1024

    /// A provider running `settings.command`.
    public init(settings: ExecSettings, log: Logger) {
        self.settings = settings
        self.log = log
    }

    /// The seeds' codes after which retrying cannot help.
    static let permanentCodes: Set<String> = [
        "AUTH_ERR_AUTH_TOKEN_NOT_FOUND", "ERR_UID_NOT_FOUND", "ERR_USER_DEACTIVATED", "AUTH_ERR_APIKEY_NOT_FOUND",
    ]

    public func login(_ account: Account, credential: Secret?) async -> RefreshOutcome {
        var input: [String: JSON] = [
            "action": "login", "provider": .string(account.provider), "user": .string(account.user),
        ]
        input["credential"] = credential.map { .string($0.revealed) }
        return await run(input, credential.map { [$0.revealed] } ?? [])
    }

    /// A token given at login goes to the helper as `credential` (CometChat's
    /// UID + auth key login); the helper answers with the session's token.
    public var exchangesCredentials: Bool { true }

    public func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        await run(input("refresh", record), secrets(record))
    }

    public func canRefresh(_ record: SessionRecord) -> Bool { true }

    public func revoke(_ record: SessionRecord) async -> Bool {
        if case .refreshed = await run(input("revoke", record), secrets(record)) { return true }
        return false
    }

    private func input(_ action: String, _ record: SessionRecord) -> [String: JSON] {
        var o: [String: JSON] = [
            "action": .string(action), "provider": .string(record.account.provider),
            "user": .string(record.account.user), "accessToken": .string(record.tokens.accessToken.revealed),
        ]
        o["refreshToken"] = record.tokens.refreshToken.map { .string($0.revealed) }
        return o
    }

    private func secrets(_ record: SessionRecord) -> [String] {
        [record.tokens.accessToken.revealed] + (record.tokens.refreshToken.map { [$0.revealed] } ?? [])
    }

    /// Runs the helper once and sorts its answer.
    func run(_ input: [String: JSON], _ knownSecrets: [String]) async -> RefreshOutcome {
        var result = await ExecProvider.spawn(settings.command, input: input, timeoutSeconds: settings.timeoutSeconds)
        // The helper's answer holds tokens: wipe it once it is read.
        defer {
            result.stdout.wipe()
            result.stderr.wipe()
        }
        let action = input["action"]?.stringValue ?? "?"
        if !result.stderr.isEmpty {
            // Mask every token vaultd knows, and the ones the helper just printed.
            var secrets = knownSecrets
            if let answer = try? JSON.parse(result.stdout) {
                for key in ["access_token", "refresh_token"] {
                    if let token = answer[key]?.stringValue { secrets.append(token) }
                }
            }
            var text = String(decoding: result.stderr.prefix(2048), as: UTF8.self)
            for secret in secrets where secret.count >= 4 {
                text = text.replacing(secret, with: Secret.mask(secret))
            }
            log.info("helper stderr", ["action": action, "program": settings.command[0], "stderr": text])
        }
        if let failure = result.failure { return .transient(reason: failure, retryAfter: nil) }
        guard let json = try? JSON.parse(result.stdout), case .object = json else {
            return .transient(
                reason: "the helper \(settings.command[0]) exited \(result.status) without a JSON answer",
                retryAfter: nil)
        }
        if let code = json["error"]?.stringValue {
            let message = json["message"]?.stringValue ?? code
            if ExecProvider.permanentCodes.contains(code) { return .permanent(code: code, reason: message) }
            return .transient(reason: "\(code): \(message)", retryAfter: nil)
        }
        if action == "revoke" { return .refreshed(TokenSet(accessToken: Secret("-")), expiresIn: nil) }
        guard result.status == 0, let credential = try? LoginCredential(tokenResponse: json) else {
            return .transient(reason: "the helper answered without an access_token", retryAfter: nil)
        }
        return .refreshed(credential.tokens, expiresIn: credential.expiresIn)
    }

    struct RunResult {
        var status: Int32 = -1
        var stdout: [UInt8] = []
        var stderr: [UInt8] = []
        var failure: String?
    }

    /// Starts `argv` (no shell), feeds `input`, collects bounded output, and
    /// kills it at the deadline. Blocking waits happen on Dispatch threads, not
    /// on the cooperative pool.
    static func spawn(_ argv: [String], input: [String: JSON], timeoutSeconds: Int64) async -> RunResult {
        await withCheckedContinuation { (continuation: CheckedContinuation<RunResult, Never>) in
            DispatchQueue.global().async {
                // Serialized here, so that this is the only copy of the input and wiping it counts.
                var bytes = JSON.object(input).serialized()
                defer { bytes.wipe() }
                continuation.resume(returning: spawnBlocking(argv, input: bytes, timeoutSeconds: timeoutSeconds))
            }
        }
    }

    static func spawnBlocking(_ argv: [String], input: [UInt8], timeoutSeconds: Int64) -> RunResult {
        var result = RunResult()
        var environment = ["PATH": "/usr/local/bin:/usr/bin:/bin"]
        for key in ["CREDENTIALS_DIRECTORY", "HOME", "LANG"] {
            if let value = Environment.get(key) { environment[key] = value }
        }
        let child: ChildProcess
        do {
            child = try ChildProcess.spawn(argv, environment: environment)
        } catch {
            result.failure = "the helper \(argv[0]) could not be started: \(error)"
            return result
        }
        var stdinFD = child.stdin
        defer {
            for fd in [stdinFD, child.stdout, child.stderr] where fd >= 0 { close(fd) }
        }
        // One loop writes the input and reads both pipes with poll() against one
        // deadline. A helper whose children keep the pipes open cannot hold
        // vaultd: reading stops shortly after the helper itself exited, or at
        // the deadline.
        var pendingInput = input[...]
        var streams = [
            (fd: child.stdout, limit: maximumOutput, data: [UInt8](), open: true),
            (fd: child.stderr, limit: 8192, data: [UInt8](), open: true),
        ]
        // Room for all that is kept up front: a buffer that grew would leave
        // copies of the helper's answer behind in freed memory.
        for index in streams.indices { streams[index].data.reserveCapacity(streams[index].limit + 1) }
        let deadline = Monotonic.milliseconds() + UInt64(timeoutSeconds) * 1000
        var exitedAt: UInt64?
        var exitStatus: Int32?
        var buffer = [UInt8](repeating: 0, count: 65536)
        func reapIfExited() -> Bool {
            guard exitStatus == nil else { return true }
            var status: Int32 = 0
            guard waitpid(child.pid, &status, WNOHANG) == child.pid else { return false }
            exitStatus = ChildProcess.exitCode(fromWaitStatus: status)
            return true
        }
        func closeInput() {
            close(stdinFD)
            stdinFD = -1
        }
        if pendingInput.isEmpty { closeInput() }
        while streams.contains(where: { $0.open }) {
            let now = Monotonic.milliseconds()
            if exitedAt == nil, reapIfExited() { exitedAt = now }
            if let exitedAt, now > exitedAt + 200 { break }
            if now >= deadline {
                // A helper that exited just now is not killed (its pid may be reused).
                if exitStatus == nil {
                    kill(child.pid, SIGKILL)
                    result.failure = "the helper \(argv[0]) did not finish within \(timeoutSeconds)s and was killed"
                }
                break
            }
            var fds = streams.filter { $0.open }.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            if stdinFD >= 0 { fds.append(pollfd(fd: stdinFD, events: Int16(POLLOUT), revents: 0)) }
            _ = poll(&fds, nfds_t(fds.count), Int32(min(100, deadline - now)))
            if stdinFD >= 0 {
                let n = pendingInput.withUnsafeBytes { write(stdinFD, $0.baseAddress, $0.count) }
                if n > 0 { pendingInput = pendingInput.dropFirst(n) }
                // Done, or the helper closed its input without reading it all.
                if pendingInput.isEmpty || (n < 0 && errno != EAGAIN && errno != EINTR) { closeInput() }
            }
            for index in streams.indices where streams[index].open {
                let n = buffer.withUnsafeMutableBytes { read(streams[index].fd, $0.baseAddress, $0.count) }
                if n == 0 {
                    streams[index].open = false
                } else if n > 0 {
                    let room = streams[index].limit + 1 - streams[index].data.count
                    if room > 0 { streams[index].data.append(contentsOf: buffer.prefix(min(n, room))) }
                }
            }
        }
        if !reapIfExited() {
            kill(child.pid, SIGKILL)
            for _ in 0..<500 where !reapIfExited() { usleep(10_000) }
            if exitStatus == nil {
                // Killed but not gone yet (stuck in the kernel): reap it whenever it goes.
                let pid = child.pid
                DispatchQueue.global().async {
                    var status: Int32 = 0
                    _ = waitpid(pid, &status, 0)
                }
            }
        }
        buffer.wipe()
        result.status = exitStatus ?? -1
        result.stdout = streams[0].data
        result.stderr = streams[1].data
        if result.failure == nil, result.stdout.count > maximumOutput {
            result.failure = "the helper \(argv[0]) wrote more than \(maximumOutput) bytes"
        }
        return result
    }
}
