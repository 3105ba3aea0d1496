import Dispatch
import Glibc
import Varlink
import VaultCore
import VaultSystem

/// A helper program that logs in, refreshes and revokes for vaultd (the
/// seeds' "trusted backend": CometChat's REST API, OpenIM's admin API). It is
/// run directly, never through a shell, with one JSON object on stdin; it
/// answers one JSON object on stdout: a token response (which may carry the
/// user's `profile`), or `{"error": CODE, "message": ...}`. Its run time and output are bounded,
/// it runs on vaultd's helper pool within its provider's
/// `MaxConcurrentHelpers=`, and nothing it prints is logged or kept without
/// going through `Redactor` first.
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

    /// The seeds' codes after which retrying cannot help (a wrong API key
    /// too: `ProviderFailure.permanentKind` calls it an invalid client).
    static let permanentCodes: Set<String> = [
        "AUTH_ERR_AUTH_TOKEN_NOT_FOUND", "ERR_UID_NOT_FOUND", "ERR_USER_DEACTIVATED", "AUTH_ERR_APIKEY_NOT_FOUND",
        "ERR_INVALID_API_KEY",
    ]

    public func login(_ account: Account) async -> RefreshOutcome {
        await run(["action": "login", "provider": .string(account.provider), "user": .string(account.user)], [])
    }

    public func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        await run(input("refresh", record), secrets(record))
    }

    public func canRefresh(_ record: SessionRecord) -> Bool { true }

    public func revokes(_ record: SessionRecord) -> Bool { true }

    public func revoke(_ record: SessionRecord) async -> Bool {
        if case .refreshed = await run(input("revoke", record), secrets(record)) { return true }
        return false
    }

    /// A refresh that handed out a new access token replaced one that may
    /// stay valid at the provider (a CometChat auth token lives until it is
    /// deleted): it is revoked through the helper.
    public func revokesReplaced(_ old: SessionRecord, by new: TokenSet) -> Bool {
        old.tokens.accessToken != new.accessToken
    }

    /// Runs the helper's `revoke` with `"replaced": true`: only `accessToken`
    /// (a token a refresh replaced) is to go, the session goes on. A helper
    /// that can only sign the whole user out (OpenIM's force_logout) answers
    /// `{}` and does nothing.
    public func revokeReplaced(_ old: SessionRecord) async -> Bool {
        var request = input("revoke", old)
        request["replaced"] = true
        if case .refreshed = await run(request, secrets(old)) { return true }
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

    /// The most of a helper's stderr read per run.
    static let capturedStderr = 8192
    /// The most of a helper's stderr (or of stdout that is no JSON answer)
    /// logged per run, after masking.
    static let loggedStderr = 2048
    /// The most of a helper's `message` kept, after masking.
    static let keptMessage = 512

    /// Runs the helper once and sorts its answer. Nothing the helper printed
    /// leaves this function unmasked: stderr, the `message` and `error` of its
    /// answer and its stdout go through `Redactor` (secret-looking keys,
    /// `knownSecrets`, the tokens of its answer) before they are logged or
    /// returned as a reason (which becomes the session's last error).
    func run(_ input: [String: JSON], _ knownSecrets: [String]) async -> RefreshOutcome {
        let provider = input["provider"]?.stringValue ?? "?"
        var result = await ExecProvider.spawn(settings, provider: provider, input: input)
        // The helper's answer holds tokens: wipe it once it is read.
        defer {
            result.stdout.wipe()
            result.stderr.wipe()
        }
        let action = input["action"]?.stringValue ?? "?"
        let program = settings.command[0]
        // Parsed once: its strings are Swift strings, which cannot be wiped.
        let answer = try? JSON.parse(result.stdout)
        var secrets = knownSecrets
        for key in ["access_token", "refresh_token", "id_token"] {
            if let token = answer?[key]?.stringValue { secrets.append(token) }
        }
        func masked(_ bytes: [UInt8], cut: Bool = false, limit: Int) -> String {
            Redactor.redact(utf8: bytes, cut: cut, knownSecrets: secrets, limit: limit) { $0.wipe() }
        }
        func masked(_ text: String, limit: Int) -> String {
            var bytes = Array(text.utf8)
            defer { bytes.wipe() }
            return masked(bytes, limit: limit)
        }
        if !result.stderr.isEmpty {
            log.info(
                "helper stderr",
                [
                    "action": action, "program": program,
                    "stderr": masked(
                        result.stderr, cut: result.stderr.count > ExecProvider.capturedStderr,
                        limit: ExecProvider.loggedStderr),
                ])
        }
        if let failure = result.failure {
            return .transient(
                reason: failure, retryAfter: nil, code: result.unavailable ? ProviderFailure.helperUnavailable : nil)
        }
        let ended = ExecProvider.ending(program, result)
        guard let json = answer, case .object = json else {
            if !result.stdout.isEmpty {
                log.info(
                    "helper stdout",
                    [
                        "action": action, "program": program,
                        "stdout": masked(
                            result.stdout, cut: result.stdout.count > ExecProvider.maximumOutput,
                            limit: ExecProvider.loggedStderr),
                    ])
            }
            return .transient(reason: "\(ended) without a JSON answer", retryAfter: nil)
        }
        if let error = json["error"]?.stringValue {
            let code = ExecProvider.plausibleCode(error) ? error : "ERR_HELPER"
            let message = json["message"]?.stringValue.map { masked($0, limit: ExecProvider.keptMessage) } ?? code
            if ExecProvider.permanentCodes.contains(code) { return .permanent(code: code, reason: message) }
            return .transient(reason: "\(code): \(message)", retryAfter: nil, code: code)
        }
        if action == "revoke" { return .refreshed(TokenSet(accessToken: Secret("-")), expiresIn: nil) }
        guard result.status == 0 else {
            return .transient(reason: "\(ended); an answer is taken only from a helper that exits 0", retryAfter: nil)
        }
        guard let (credential, profileError) = ExecProvider.credential(in: json) else {
            return .transient(reason: "the helper answered without an access_token", retryAfter: nil)
        }
        if let profileError {
            // The tokens are good: a malformed profile costs only the profile.
            log.info(
                "helper profile ignored",
                [
                    "action": action, "program": program,
                    "reason": masked(profileError.message, limit: ExecProvider.keptMessage),
                ])
        }
        return .refreshed(credential.tokens, expiresIn: credential.expiresIn, profile: credential.profile)
    }

    /// The tokens of a helper's answer, and the user's profile: the answer's
    /// `profile` (CometChat's User fields; `uid` may be left out, it is the
    /// session's user whatever it says), else the claims of its `id_token`.
    /// A malformed `profile` is left out and returned as the error naming
    /// the field; nil when the answer holds no usable token response.
    static func credential(in answer: JSON) -> (LoginCredential, profileError: VaultError?)? {
        guard var credential = try? LoginCredential(tokenResponse: answer) else { return nil }
        guard let json = answer["profile"], json != .null else { return (credential, nil) }
        do throws(VaultError) {
            credential.profile = try UserProfile(providerJSON: json)
            return (credential, nil)
        } catch {
            return (credential, error)
        }
    }

    /// How the helper's run ended, for a message: "the helper P exited 3", or
    /// "the helper P crashed (signal 11, Segmentation fault)".
    static func ending(_ program: String, _ result: RunResult) -> String {
        guard let signal = result.signal else { return "the helper \(program) exited \(result.status)" }
        let name = strsignal(signal).map { String(cString: $0) } ?? "unknown signal"
        return "the helper \(program) crashed (signal \(signal), \(name))"
    }

    /// True for an `error` a helper may answer that can be shown as it is: a
    /// code such as `ERR_UID_NOT_FOUND` (letters, digits, `_`, `-`, `.`, at
    /// most 64), not free text that could hold a secret.
    static func plausibleCode(_ code: String) -> Bool {
        !code.isEmpty && code.utf8.count <= 64
            && code.utf8.allSatisfy { byte in
                (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                    || byte == UInt8(ascii: "_") || byte == UInt8(ascii: "-") || byte == UInt8(ascii: ".")
            }
    }

    struct RunResult {
        var status: Int32 = -1
        /// The signal that ended the helper, when one did.
        var signal: Int32?
        var stdout: [UInt8] = []
        var stderr: [UInt8] = []
        var failure: String?
        /// The helper could not be run at all (missing, not executable, a bad
        /// interpreter): `ERR_HELPER_UNAVAILABLE`, not a network error.
        var unavailable = false
    }

    /// Runs the helper of `settings` on vaultd's helper pool once a slot of
    /// `provider` is free (`MaxConcurrentHelpers=`); the time spent waiting
    /// for it counts against `Timeout=`.
    static func spawn(
        _ settings: ExecSettings, provider: String, input: [String: JSON], pool: WorkerPool = .shared
    )
        async -> RunResult
    {
        let argv = settings.command
        let timeout = settings.timeoutSeconds
        let deadline = Monotonic.milliseconds() + UInt64(timeout) * 1000
        let result = await pool.run(.helper, lane: provider, cap: settings.maxConcurrentHelpers, deadline: deadline) {
            () -> RunResult? in
            guard Monotonic.milliseconds() < deadline else { return nil }
            // Serialized here, so that this is the only copy of the input and wiping it counts.
            var bytes = JSON.object(input).serialized()
            defer { bytes.wipe() }
            return spawnBlocking(argv, input: bytes, deadline: deadline, timeoutSeconds: timeout)
        }
        if let ran = result ?? nil { return ran }
        var waited = RunResult()
        waited.failure =
            "the helper \(argv[0]) did not start within \(timeout)s: it waited the whole time for a free helper slot (provider '\(provider)' runs at most \(settings.maxConcurrentHelpers) at once; raise MaxConcurrentHelpers= or Timeout=, or fix the helpers that hang)"
        return waited
    }

    /// Starts `argv` (no shell), feeds `input`, collects bounded output, and
    /// kills it at `deadline` (CLOCK_MONOTONIC milliseconds; `timeoutSeconds`
    /// names the limit in the message). Blocks: call it on a helper worker.
    static func spawnBlocking(_ argv: [String], input: [UInt8], deadline: UInt64, timeoutSeconds: Int64) -> RunResult {
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
            if let problem = HelperProgram.spawnProblem(error.errno) {
                result.unavailable = true
                result.failure =
                    "the helper \(argv[0]) cannot be run (\(problem)); install it or fix Command=, then reload vaultd"
            }
            return result
        }
        var stdinFD = child.stdin
        defer {
            for fd in [stdinFD, child.stdout, child.stderr] where fd >= 0 { close(fd) }
        }
        // One loop writes the input and reads both pipes with poll() against one
        // deadline. The helper runs in a process group of its own: once it has
        // exited, at the deadline, and when it writes too much, the whole group
        // is killed, so a child it left behind holding the pipes is neither
        // waited for nor left running. Reading stops shortly after the helper
        // exited at the latest, or at the deadline.
        var pendingInput = input[...]
        var streams = [
            (fd: child.stdout, limit: maximumOutput, data: [UInt8](), open: true),
            (fd: child.stderr, limit: capturedStderr, data: [UInt8](), open: true),
        ]
        // Room for all that is kept up front: a buffer that grew would leave
        // copies of the helper's answer behind in freed memory.
        for index in streams.indices { streams[index].data.reserveCapacity(streams[index].limit + 1) }
        var exitedAt: UInt64?
        var buffer = [UInt8](repeating: 0, count: 65536)
        func closeInput() {
            close(stdinFD)
            stdinFD = -1
        }
        if pendingInput.isEmpty { closeInput() }
        while streams.contains(where: { $0.open }) {
            let now = Monotonic.milliseconds()
            if exitedAt == nil, child.hasExited() {
                exitedAt = now
                // Not reaped yet, so the group id is still the helper's own.
                child.killGroup()
            }
            if let exitedAt, now > exitedAt + 200 { break }
            if now >= deadline {
                if exitedAt == nil {
                    result.failure = "the helper \(argv[0]) did not finish within \(timeoutSeconds)s and was killed"
                }
                child.killGroup()
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
            if streams[0].data.count > maximumOutput {
                // No answer is that long: stop the helper rather than read on.
                result.failure =
                    "the helper \(argv[0]) wrote more than \(maximumOutput) bytes to its output and was killed"
                child.killGroup()
                break
            }
        }
        if exitedAt == nil {
            if result.failure == nil {
                // Both pipes closed: the helper is most likely exiting; let it finish (bounded).
                for _ in 0..<20 {
                    if child.hasExited() { break }
                    usleep(10_000)
                }
            }
            child.killGroup()
        }
        var exitStatus: Int32?
        for _ in 0..<500 {
            var status: Int32 = 0
            if waitpid(child.pid, &status, WNOHANG) == child.pid {
                exitStatus = status
                break
            }
            usleep(10_000)
        }
        if exitStatus == nil {
            // Killed but not gone yet (stuck in the kernel): reap it whenever it goes.
            let pid = child.pid
            DispatchQueue.global().async {
                var status: Int32 = 0
                _ = waitpid(pid, &status, 0)
            }
        }
        buffer.wipe()
        result.status = exitStatus.map(ChildProcess.exitCode(fromWaitStatus:)) ?? -1
        result.signal = exitStatus.flatMap(ChildProcess.signal(fromWaitStatus:))
        result.stdout = streams[0].data
        result.stderr = streams[1].data
        return result
    }
}
