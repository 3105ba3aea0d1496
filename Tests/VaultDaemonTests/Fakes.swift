import Synchronization
import VaultCore
import VaultDaemon

/// A clock moved by hand. Sleepers wake when it is moved past their deadline
/// (or when their task is cancelled).
final class ManualClock: WallClock, Sendable {
    private struct State {
        var now: Double
        var sleepers: [(id: UInt64, deadline: Double, continuation: CheckedContinuation<Void, any Error>)] = []
        var nextID: UInt64 = 0
    }
    private let state: Mutex<State>

    init(_ seconds: Int64 = 1_800_000_000) { state = Mutex(State(now: Double(seconds))) }

    func now() -> UnixTime { UnixTime(seconds: Int64(state.withLock { $0.now }.rounded(.down))) }
    func preciseNow() -> Double { state.withLock { $0.now } }

    /// Tasks waiting on this clock.
    var sleeping: Int { state.withLock { $0.sleepers.count } }

    func sleep(until deadline: Double) async throws {
        let id = state.withLock { state -> UInt64 in
            state.nextID += 1
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let resumeNow = state.withLock { state -> Bool in
                    if state.now >= deadline || Task.isCancelled { return true }
                    state.sleepers.append((id, deadline, continuation))
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            let woken = state.withLock { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.sleepers.firstIndex(where: { $0.id == id }) else { return nil }
                return state.sleepers.remove(at: index).continuation
            }
            woken?.resume(throwing: CancellationError())
        }
        try Task.checkCancellation()
    }

    /// Moves the clock forward by `seconds` and wakes the sleepers now due.
    func advance(by seconds: Double) {
        let due = state.withLock { state -> [CheckedContinuation<Void, any Error>] in
            state.now += seconds
            let now = state.now
            let due = state.sleepers.filter { $0.deadline <= now }.map(\.continuation)
            state.sleepers.removeAll { $0.deadline <= now }
            return due
        }
        for continuation in due { continuation.resume() }
    }
}

/// A session store in memory whose writes can be made to fail, and whose
/// contents can be copied at any instant (a crash: the next manager starts
/// from what the store held then).
final class FaultyStore: SessionStore, Sendable {
    struct Contents: Sendable {
        var records: [SessionKey: SessionRecord] = [:]
        var providerSecrets: [String: Secret] = [:]
        var pending: [String: PendingRevocation] = [:]
    }
    private struct State {
        var contents = Contents()
        /// Writes that fail from now on, counted down (Int.max: all).
        var failingWrites = 0
        /// Writes to skip before the failures start.
        var writesBeforeFailing = 0
        var writes = 0
        /// The store is gone (or locked): every call fails, reads too, until it returns.
        var outage: StoreProbe?
        /// Calls that reached the store during an outage.
        var callsDuringOutage = 0
    }
    private let state: Mutex<State>

    let location = "faulty memory store (tests)"

    init(_ contents: Contents = Contents()) { state = Mutex(State(contents: contents)) }

    /// What the store holds now.
    var contents: Contents { state.withLock { $0.contents } }
    /// Writes attempted so far.
    var writes: Int { state.withLock { $0.writes } }

    /// Makes the next `count` writes fail, after `after` more succeed.
    func failWrites(_ count: Int, after: Int = 0) {
        state.withLock {
            $0.failingWrites = count
            $0.writesBeforeFailing = after
        }
    }

    /// The store goes away (`locked`: it is locked) until `restore()`.
    func goDown(locked: Bool) {
        state.withLock {
            $0.outage = locked ? .locked("locked (injected)") : .unavailable("gone (injected)")
            $0.callsDuringOutage = 0
        }
    }

    /// The store is back, holding what it held.
    func comeBack() { state.withLock { $0.outage = nil } }

    /// The outage in force, if any.
    var outage: StoreProbe? { state.withLock { $0.outage } }

    /// Calls that reached the store during the current outage.
    var callsDuringOutage: Int { state.withLock { $0.callsDuringOutage } }

    /// The error of a call during an outage; nil when the store is up.
    private func outageError(_ what: String) -> VaultError? {
        state.withLock { state -> VaultError? in
            switch state.outage {
            case nil, .available?: return nil
            case .unavailable(let why)?:
                state.callsDuringOutage += 1
                return VaultError(.storeUnavailable, "\(what): \(why)")
            case .locked(let why)?:
                state.callsDuringOutage += 1
                return VaultError(.storeLocked, "\(what): \(why)")
            }
        }
    }

    func probe() async -> StoreProbe { outage ?? .available }

    private func write(_ what: String, _ body: (inout Contents) -> Void) throws(VaultError) {
        if let error = outageError(what) { throw error }
        let failed = state.withLock { state -> Bool in
            state.writes += 1
            if state.writesBeforeFailing > 0 {
                state.writesBeforeFailing -= 1
            } else if state.failingWrites > 0 {
                if state.failingWrites != Int.max { state.failingWrites -= 1 }
                return true
            }
            body(&state.contents)
            return false
        }
        if failed { throw VaultError(.storeFailed, "\(what) failed (injected fault)") }
    }

    func loadAll() async throws(VaultError) -> StoreContents {
        if let error = outageError("reading sessions") { throw error }
        let records = state.withLock { $0.contents.records.values.sorted { $0.key < $1.key } }
        return StoreContents(records: records, unreadable: [])
    }

    func save(_ record: SessionRecord) async throws(VaultError) {
        try write("writing \(record.account)") { $0.records[record.key] = record }
    }

    func delete(_ key: SessionKey) async throws(VaultError) {
        try write("deleting \(key)") { _ = $0.records.removeValue(forKey: key) }
    }

    func saveProviderSecret(_ provider: String, _ secret: Secret) async throws(VaultError) {
        try write("writing a client secret") { $0.providerSecrets[provider] = secret }
    }

    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        if let error = outageError("reading a client secret") { throw error }
        return state.withLock { $0.contents.providerSecrets[provider] }
    }

    func savePendingRevocation(_ revocation: PendingRevocation) async throws(VaultError) {
        try write("queueing a revocation") { $0.pending[revocation.id] = revocation }
    }

    func deletePendingRevocation(_ revocation: PendingRevocation) async throws(VaultError) {
        try write("removing a revocation") { _ = $0.pending.removeValue(forKey: revocation.id) }
    }

    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        if let error = outageError("reading revocations") { throw error }
        return state.withLock { $0.contents.pending.values.sorted { ($0.record.key, $0.id) < ($1.record.key, $1.id) } }
    }
}

/// An OAuth 2.0 token endpoint as vaultd sees it, in memory: grants whose
/// refresh tokens rotate on every refresh, reuse detection (a rotated
/// refresh token sent again counts as reuse and revokes its grant, as RFC
/// 9700 advises), revocation, and faults chosen by the test.
final class FakeProvider: TokenProvider, Sendable {
    enum Mode: Sendable { case normal, transient, refused }
    /// How client-credentials logins (`login` without a credential) answer.
    enum LoginMode: Sendable { case unsupported, normal, transient, rateLimited, refused }
    /// One login the provider was asked for: when (by `clock`), for which account, and how it ended.
    struct LoginAttempt: Sendable {
        var account: Account
        var at: Double
        var succeeded: Bool
    }

    struct State {
        var grantOfToken: [String: Int] = [:]
        /// The refresh token of each grant that is valid now.
        var current: [Int: String] = [:]
        var revokedGrants: Set<Int> = []
        var rotated: Set<String> = []
        /// Grants on which a rotated refresh token was sent again.
        var reusedGrants: [Int] = []
        var inFlight: [Int: Int] = [:]
        var mostInFlight = 0
        var refreshCalls = 0
        var revokeCalls = 0
        var mode = Mode.normal
        var revocationsFail = false
        var issued = 0
        var lifetime: Int64 = 300
        /// Every token ever issued (to check that none reaches an event or a log).
        var everIssued: [String] = []
        /// Grants whose tokens have no expiry (no `expires_in`, at login and refresh).
        var eternalGrants: Set<Int> = []
        /// Refresh requests per grant.
        var refreshesOfGrant: [Int: Int] = [:]
        var loginMode = LoginMode.unsupported
        /// The lifetime of the tokens a login issues.
        var loginLifetime: Int64 = 120
        var loginAttempts: [LoginAttempt] = []
        /// Logins in flight per account, and the most of one account at once.
        var loginsInFlight: [Account: Int] = [:]
        var mostLoginsInFlight = 0
    }
    let state = Mutex(State())
    /// What the login attempts are timed by (nil: time 0).
    let clock: ManualClock?

    /// A provider; `clock` times its login attempts.
    init(clock: ManualClock? = nil) { self.clock = clock }
    /// While true, a refresh that rotated waits before it answers (the
    /// server has rotated, vaultd has not heard yet): `held` counts them,
    /// `releaseHeld()` lets them answer.
    let holdAfterRotation = Mutex(false)
    private let heldAnswers = Mutex<[CheckedContinuation<Void, Never>]>([])

    /// Refreshes that rotated and wait to answer.
    var held: Int { heldAnswers.withLock { $0.count } }

    /// Lets every held refresh answer.
    func releaseHeld() {
        for continuation in heldAnswers.withLock({ held in
            defer { held = [] }
            return held
        }) { continuation.resume() }
    }

    var exchangesCredentials: Bool { false }

    /// A new grant: the token response a client would bring to `Login`;
    /// `lifetime` nil: its tokens have no expiry, now and after every refresh.
    func grant(lifetime: Int64?) -> (grant: Int, response: JSON) {
        state.withLock { state in
            state.issued += 1
            let grant = state.issued
            let access = "at-\(grant)-0-" + String(repeating: "a", count: 16)
            let refresh = "rt-\(grant)-0-" + String(repeating: "r", count: 16)
            state.grantOfToken[refresh] = grant
            state.current[grant] = refresh
            state.everIssued += [access, refresh]
            if lifetime == nil { state.eternalGrants.insert(grant) }
            var response: [String: JSON] = [
                "access_token": .string(access), "refresh_token": .string(refresh), "token_type": "Bearer",
            ]
            response["expires_in"] = lifetime.map(JSON.int)
            return (grant, .object(response))
        }
    }

    /// A client-credentials login, answered as `loginMode` says: a new grant
    /// without a refresh token (the session ends when it expires), a
    /// transient failure, a 429 with Retry-After: 60, or a refusal.
    func login(_ account: Account, credential: Secret?) async -> RefreshOutcome {
        let at = clock?.preciseNow() ?? 0
        let mode = state.withLock { state -> LoginMode in
            state.loginsInFlight[account, default: 0] += 1
            state.mostLoginsInFlight = max(state.mostLoginsInFlight, state.loginsInFlight[account]!)
            return state.loginMode
        }
        if mode == .unsupported {
            state.withLock { $0.loginsInFlight[account]! -= 1 }
            return .permanent(code: "unsupported_grant_type", reason: "the fake issues grants to tests only")
        }
        // Let whatever else is runnable run while the request is "out".
        for _ in 0..<3 { await Task.yield() }
        return state.withLock { state -> RefreshOutcome in
            state.loginsInFlight[account]! -= 1
            state.loginAttempts.append(LoginAttempt(account: account, at: at, succeeded: state.loginMode == .normal))
            switch state.loginMode {
            case .unsupported, .refused: return .permanent(code: "invalid_client", reason: "refused (injected)")
            case .transient: return .transient(reason: "HTTP 503 (injected)", retryAfter: nil)
            case .rateLimited: return .transient(reason: "HTTP 429 (injected)", retryAfter: 60)
            case .normal: break
            }
            state.issued += 1
            let access = "at-\(state.issued)-login-" + String(repeating: "a", count: 16)
            state.everIssued.append(access)
            var tokens = TokenSet(accessToken: Secret(access))
            tokens.tokenType = "Bearer"
            return .refreshed(tokens, expiresIn: state.loginLifetime)
        }
    }

    func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        guard let token = record.tokens.refreshToken?.revealed else {
            return .permanent(code: "invalid_request", reason: "no refresh token")
        }
        let grant = state.withLock { state -> Int? in
            state.refreshCalls += 1
            guard let grant = state.grantOfToken[token] else { return nil }
            state.refreshesOfGrant[grant, default: 0] += 1
            state.inFlight[grant, default: 0] += 1
            state.mostInFlight = max(state.mostInFlight, state.inFlight[grant]!)
            return grant
        }
        guard let grant else { return .permanent(code: "invalid_grant", reason: "unknown refresh token") }
        // Let whatever else is runnable run while the request is "out".
        for _ in 0..<3 { await Task.yield() }
        let outcome = state.withLock { state -> RefreshOutcome in
            state.inFlight[grant]! -= 1
            switch state.mode {
            case .transient: return .transient(reason: "HTTP 503 (injected)", retryAfter: nil)
            case .refused: return .permanent(code: "invalid_grant", reason: "refused (injected)")
            case .normal: break
            }
            if state.rotated.contains(token) {
                state.reusedGrants.append(grant)
                state.revokedGrants.insert(grant)
                return .permanent(code: "invalid_grant", reason: "refresh token reused")
            }
            if state.revokedGrants.contains(grant) {
                return .permanent(code: "invalid_grant", reason: "grant revoked")
            }
            state.issued += 1
            let access = "at-\(grant)-\(state.issued)-" + String(repeating: "a", count: 16)
            let refresh = "rt-\(grant)-\(state.issued)-" + String(repeating: "r", count: 16)
            state.rotated.insert(token)
            state.grantOfToken[refresh] = grant
            state.current[grant] = refresh
            state.everIssued += [access, refresh]
            var tokens = TokenSet(accessToken: Secret(access))
            tokens.refreshToken = Secret(refresh)
            tokens.tokenType = "Bearer"
            return .refreshed(tokens, expiresIn: state.eternalGrants.contains(grant) ? nil : state.lifetime)
        }
        if case .refreshed = outcome, holdAfterRotation.withLock({ $0 }) {
            await withCheckedContinuation { continuation in heldAnswers.withLock { $0.append(continuation) } }
        }
        return outcome
    }

    func canRefresh(_ record: SessionRecord) -> Bool { record.tokens.refreshToken != nil }

    func revokes(_ record: SessionRecord) -> Bool { record.tokens.refreshToken != nil }

    func revoke(_ record: SessionRecord) async -> Bool {
        state.withLock { state in
            state.revokeCalls += 1
            if state.revocationsFail { return false }
            if let token = record.tokens.refreshToken?.revealed, let grant = state.grantOfToken[token] {
                state.revokedGrants.insert(grant)
            }
            return true
        }
    }
}

/// The configuration the in-process tests run with: one oauth2 provider
/// (served by `FakeProvider`) and one static provider.
enum TestConfig {
    static func make(_ extra: String = "") throws -> VaultConfig {
        try ConfigParser.parse(
            """
            [Vault]
            MinRefreshInterval=0
            \(extra)
            [Provider oauth]
            Type=oauth2
            TokenURL=http://127.0.0.1:9/token
            ClientID=sim
            RevocationURL=http://127.0.0.1:9/revoke

            [Provider demo]
            Type=static
            """, file: "test.conf")
    }
}
