import Dispatch
import Foundation
import Glibc
import VaultCore

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
        let result = await ExecProvider.spawn(
            settings.command, input: JSON.object(input).serialized(), timeoutSeconds: settings.timeoutSeconds)
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
                text = text.replacingOccurrences(of: secret, with: Secret.mask(secret))
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
    static func spawn(_ argv: [String], input: [UInt8], timeoutSeconds: Int64) async -> RunResult {
        await withCheckedContinuation { (continuation: CheckedContinuation<RunResult, Never>) in
            DispatchQueue.global().async {
                continuation.resume(returning: spawnBlocking(argv, input: input, timeoutSeconds: timeoutSeconds))
            }
        }
    }

    static func spawnBlocking(_ argv: [String], input: [UInt8], timeoutSeconds: Int64) -> RunResult {
        var result = RunResult()
        let process = Process()
        process.executableURL = URL(fileURLWithPath: argv[0])
        process.arguments = Array(argv.dropFirst())
        var environment = ["PATH": "/usr/local/bin:/usr/bin:/bin"]
        for key in ["CREDENTIALS_DIRECTORY", "HOME", "LANG"] {
            if let value = ProcessInfo.processInfo.environment[key] { environment[key] = value }
        }
        process.environment = environment
        let stdin = Pipe()
        let stdout = Pipe()
        let stderr = Pipe()
        process.standardInput = stdin
        process.standardOutput = stdout
        process.standardError = stderr
        let exited = ExitFlag()
        process.terminationHandler = { _ in exited.set() }
        do { try process.run() } catch {
            result.failure = "the helper \(argv[0]) could not be started: \(error.localizedDescription)"
            return result
        }
        try? stdin.fileHandleForWriting.write(contentsOf: Data(input))
        try? stdin.fileHandleForWriting.close()
        // One loop reads both pipes with poll() against one deadline. A helper
        // whose children keep the pipes open cannot hold vaultd: reading stops
        // shortly after the helper itself exited, or at the deadline.
        var streams = [
            (fd: stdout.fileHandleForReading.fileDescriptor, limit: maximumOutput, data: [UInt8](), open: true),
            (fd: stderr.fileHandleForReading.fileDescriptor, limit: 8192, data: [UInt8](), open: true),
        ]
        for stream in streams { _ = fcntl(stream.fd, F_SETFL, fcntl(stream.fd, F_GETFL) | O_NONBLOCK) }
        let deadline = Monotonic.milliseconds() + UInt64(timeoutSeconds) * 1000
        var exitedAt: UInt64?
        var reapedStatus: Int32?
        var buffer = [UInt8](repeating: 0, count: 65536)
        // Foundation learns of the exit through a descriptor the helper's own
        // children inherit, so a helper that leaves a child behind looks alive
        // to it: ask the kernel too.
        func reapIfExited() -> Bool {
            if exited.isSet { return true }
            var status: Int32 = 0
            if waitpid(process.processIdentifier, &status, WNOHANG) == process.processIdentifier {
                let signal = status & 0x7f
                reapedStatus = signal == 0 ? (status >> 8) & 0xff : 128 + signal
                return true
            }
            return reapedStatus != nil
        }
        while streams.contains(where: { $0.open }) {
            let now = Monotonic.milliseconds()
            if exitedAt == nil, reapIfExited() { exitedAt = now }
            if let exitedAt, now > exitedAt + 200 { break }
            if now >= deadline {
                kill(process.processIdentifier, SIGKILL)
                result.failure = "the helper \(argv[0]) did not finish within \(timeoutSeconds)s and was killed"
                break
            }
            var fds = streams.filter { $0.open }.map { pollfd(fd: $0.fd, events: Int16(POLLIN), revents: 0) }
            _ = poll(&fds, nfds_t(fds.count), Int32(min(100, deadline - now)))
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
            kill(process.processIdentifier, SIGKILL)
            for _ in 0..<500 where !reapIfExited() { usleep(10_000) }
        }
        result.status = reapedStatus ?? (exited.isSet ? process.terminationStatus : -1)
        result.stdout = streams[0].data
        result.stderr = streams[1].data
        if result.failure == nil, result.stdout.count > maximumOutput {
            result.failure = "the helper \(argv[0]) wrote more than \(maximumOutput) bytes"
        }
        return result
    }
}

/// Set once by the termination handler, read by the reading loop.
private final class ExitFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false

    func set() {
        lock.lock()
        value = true
        lock.unlock()
    }

    var isSet: Bool {
        lock.lock()
        defer { lock.unlock() }
        return value
    }
}
