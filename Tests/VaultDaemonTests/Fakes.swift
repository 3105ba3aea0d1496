import Foundation
import Glibc
import Synchronization
import Varlink
import VaultCore
import VaultDaemon
import VaultSystem

/// Yields until `condition` holds or `seconds` of real time pass, and says
/// whether it holds. Bounded by time, not by a count of yields: on a loaded
/// machine the task that makes it hold may not run for a while, and 20,000
/// yields passed in milliseconds (the fleet simulation's "did not end at
/// shutdown", three times in five at load 20).
@discardableResult
func yieldUntil(seconds: Double = 60, _ condition: () async -> Bool) async -> Bool {
    let deadline = ContinuousClock.now + .seconds(seconds)
    while !(await condition()) {
        guard ContinuousClock.now < deadline else { return false }
        await Task.yield()
    }
    return true
}

/// A clock moved by hand.
final class ManualClock: WallClock, Sendable {
    private let seconds: Mutex<Double>

    init(_ seconds: Int64 = 1_800_000_000) { self.seconds = Mutex(Double(seconds)) }

    func now() -> UnixTime { UnixTime(seconds: Int64(preciseNow().rounded(.down))) }
    func preciseNow() -> Double { seconds.withLock { $0 } }

    /// Moves the clock forward by `seconds`.
    func advance(by seconds: Double) { self.seconds.withLock { $0 += seconds } }
}

/// What a `FaultyStore` holds, as the invariants read it.
struct StoreSnapshot: Sendable, Equatable {
    var records: [SessionKey: SessionRecord] = [:]
    var providerSecrets: [String: Secret] = [:]
    var pending: [String: PendingRevocation] = [:]
}

/// The store under a `FaultyStore`: one of vaultd's engines, and what a
/// crash leaves of it for the next process.
protocol CrashableStore: SessionStore {
    /// Everything the store holds now, read back from it; every row must read.
    func snapshot() async throws(VaultError) -> StoreSnapshot
    /// The store as the next process opens it: what the store kept (`kept`,
    /// read at the crash), nothing of this process's memory.
    func reopen(kept: StoreSnapshot) async throws(VaultError) -> any CrashableStore
    /// This process is gone: its connection to the store is dropped.
    func disconnect()
}

/// The in-memory engine: contents in this process, copied at a crash (as if
/// the store had written them to a disk the next process reads).
final class MemoryEngine: CrashableStore, Sendable {
    private let state: Mutex<StoreSnapshot>

    let profile = StoreProfile(location: "memory (tests)")

    init(_ contents: StoreSnapshot = StoreSnapshot()) { state = Mutex(contents) }

    /// What the engine holds now.
    var contents: StoreSnapshot { state.withLock { $0 } }

    func snapshot() async throws(VaultError) -> StoreSnapshot { contents }
    /// A copy of what the engine held at the crash: the memory engine's "disk".
    func reopen(kept: StoreSnapshot) async throws(VaultError) -> any CrashableStore { MemoryEngine(kept) }
    func disconnect() {}

    func loadAll() async throws(VaultError) -> StoreContents {
        StoreContents(records: Array(state.withLock { $0.records.values }), unreadable: [])
    }
    func apply(_ change: StoreChange) async throws(VaultError) {
        state.withLock { state in
            switch change {
            case .save(let record): state.records[record.key] = record
            case .delete(let key): state.records[key] = nil
            case .saveProviderSecret(let provider, let secret): state.providerSecrets[provider] = secret
            case .savePendingRevocation(let revocation): state.pending[revocation.id] = revocation
            case .deletePendingRevocation(let revocation): state.pending[revocation.id] = nil
            }
        }
    }
    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        state.withLock { $0.providerSecrets[provider] }
    }
    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        Array(state.withLock { $0.pending.values })
    }
}

/// A data key source holding one key, made for one test.
struct FixedDataKeys: DataKeySource {
    let key: DataKey
    init(_ key: DataKey = DataKey.random()) { self.key = key }
    var description: String { "test key" }
    func keyForNewDatabase() async throws(VaultError) -> DataKey { key }
    func key(id: String) async throws(VaultError) -> DataKey? { id == key.id ? key : nil }
    func preferredKey() async throws(VaultError) -> DataKey? { nil }
    func keyToRotateTo(from current: DataKey) async throws(VaultError) -> DataKey { key }
    func retireKeys(except keep: DataKey) async throws(VaultError) {}
    func missingKeyAdvice(id: String) async -> String { "the test holds only key \(key.id)" }
}

/// A directory removed with everything in it when the last reference goes.
final class TemporaryDirectory: Sendable {
    let path: String

    /// `$TMPDIR`, else `/tmp`.
    static var temporaryParent: String {
        ProcessInfo.processInfo.environment["TMPDIR"].flatMap { $0.isEmpty ? nil : $0 } ?? "/tmp"
    }

    /// `/dev/shm` when it is a memory file system this process may write, else `temporaryParent`.
    static var memoryParent: String {
        let inMemory = (try? Directory("/dev/shm").isInMemory()) ?? false
        return inMemory && access("/dev/shm", W_OK) == 0 ? "/dev/shm" : temporaryParent
    }

    /// A new directory under `parent`, named after `prefix`.
    init(_ prefix: String, in parent: String = TemporaryDirectory.temporaryParent) throws(VaultError) {
        var template = Array("\(parent)/\(prefix)-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else {
            throw VaultError(.internalError, "cannot make a temporary directory in \(parent)")
        }
        path = String(cString: made)
    }

    /// Removes the directory now (work a test left behind may still hold its files open).
    func remove() { try? FileManager.default.removeItem(atPath: path) }

    deinit { remove() }
}

/// The SQLite engine on a temporary file: a crash drops the connection and
/// the next process opens the same file again, so it gets what the disk holds.
final class SQLiteEngine: CrashableStore, Sendable {
    let directory: TemporaryDirectory
    let keys: FixedDataKeys
    /// The database's lock, held for the whole simulation: the successive
    /// processes are one test process, and a dead one's store may outlive
    /// its crash for a moment (a call in flight holds it).
    let lock: DatabaseLock
    private let store: Mutex<SQLiteStore?>
    let profile: StoreProfile

    private init(directory: TemporaryDirectory, keys: FixedDataKeys, lock: DatabaseLock, store: SQLiteStore) {
        self.directory = directory
        self.keys = keys
        self.lock = lock
        self.store = Mutex(store)
        profile = store.profile
    }

    /// A new database in a temporary directory of its own, under a random
    /// key: on a memory file system when there is one (`VAULTD_SIM_DIR`
    /// chooses another), since the simulation tests vaultd's logic over the
    /// engine, not the disk's flushes, and each write flushes.
    static func temporary() async throws(VaultError) -> SQLiteEngine {
        let parent = ProcessInfo.processInfo.environment["VAULTD_SIM_DIR"] ?? TemporaryDirectory.memoryParent
        let directory = try TemporaryDirectory("vaultd-sim", in: parent)
        let lock = try DatabaseLock.acquire(for: directory.path + "/sessions.db")
        return try await open(directory: directory, keys: FixedDataKeys(), lock: lock)
    }

    private static func open(directory: TemporaryDirectory, keys: FixedDataKeys, lock: DatabaseLock)
        async throws(VaultError) -> SQLiteEngine
    {
        let store = try await SQLiteStore.open(
            path: directory.path + "/sessions.db", keys: keys, timeoutSeconds: 60,
            log: Logger(level: .debug, target: .discard), lock: lock, callsInline: SimulationThread.isOn)
        return SQLiteEngine(directory: directory, keys: keys, lock: lock, store: store)
    }

    /// The open store; after `close()`, an error (a dead process reaches no disk).
    private func live() throws(VaultError) -> SQLiteStore {
        guard let store = store.withLock({ $0 }) else {
            throw VaultError(.storeUnavailable, "the SQLite engine was closed (the process died)")
        }
        return store
    }

    func snapshot() async throws(VaultError) -> StoreSnapshot {
        let store = try live()
        let loaded = try await store.loadAll()
        if !loaded.unreadable.isEmpty {
            throw VaultError(.storeFailed, "rows of the database do not read: \(loaded.unreadable)")
        }
        var snapshot = StoreSnapshot()
        for record in loaded.records { snapshot.records[record.key] = record }
        for revocation in try await store.loadPendingRevocations() { snapshot.pending[revocation.id] = revocation }
        snapshot.providerSecrets = try await store.loadProviderSecrets()
        return snapshot
    }

    /// The same file opened again (`kept` is not used: the file is what the next process gets).
    func reopen(kept: StoreSnapshot) async throws(VaultError) -> any CrashableStore {
        try await Self.open(directory: directory, keys: keys, lock: lock)
    }

    func disconnect() { store.withLock { $0 = nil } }

    func loadAll() async throws(VaultError) -> StoreContents { try await live().loadAll() }
    func apply(_ change: StoreChange) async throws(VaultError) { try await live().apply(change) }
    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try await live().loadProviderSecret(provider)
    }
    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await live().loadPendingRevocations()
    }
}

/// A session store whose writes can be made to fail and which can go away,
/// over an engine (`MemoryEngine`, or the SQLite one on a temporary file);
/// `crash()` gives the store of the next process, which starts from what the
/// engine kept at that instant.
final class FaultyStore: SessionStore, Sendable {
    typealias Contents = StoreSnapshot
    private struct State {
        /// Where calls go: the engine, or after a crash a copy no one reads
        /// (work the dead process still finishes reaches no store).
        var engine: any CrashableStore
        /// Writes that fail from now on, counted down (Int.max: all).
        var failingWrites = 0
        /// Writes to skip before the failures start.
        var writesBeforeFailing = 0
        var writes = 0
        /// The store is gone (or locked): every call fails, reads too, until it returns.
        var outage: StoreProbe?
        /// Calls that reached the store during an outage.
        var callsDuringOutage = 0
        /// `holdRevocationDeletes()`: removals of queued revocations wait here.
        var holdingDeletes = false
        var heldDeletes: [CheckedContinuation<Void, Never>] = []
    }
    private let state: Mutex<State>

    /// From now on a removal of a queued revocation waits, before it reaches
    /// the engine, until `releaseRevocationDeletes()`: the store is slow at
    /// that one call, and the manager goes on meanwhile.
    func holdRevocationDeletes() { state.withLock { $0.holdingDeletes = true } }

    /// Removals of queued revocations waiting so far.
    var heldRevocationDeletes: Int { state.withLock { $0.heldDeletes.count } }

    /// Lets every held removal go on, and no longer holds new ones.
    func releaseRevocationDeletes() {
        let held = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.holdingDeletes = false
            defer { state.heldDeletes = [] }
            return state.heldDeletes
        }
        for continuation in held { continuation.resume() }
    }

    let profile: StoreProfile

    /// A store over the in-memory engine, holding `contents`.
    convenience init(_ contents: Contents = Contents()) { self.init(over: MemoryEngine(contents)) }

    /// A store over `engine`.
    init(over engine: any CrashableStore) {
        state = Mutex(State(engine: engine))
        profile = StoreProfile(location: "faulty store (tests) over \(engine.profile.location)")
    }

    private var engine: any CrashableStore { state.withLock { $0.engine } }

    /// What the in-memory engine holds now (unit tests; `snapshot()` reads any engine).
    var contents: Contents {
        guard let memory = engine as? MemoryEngine else {
            preconditionFailure("FaultyStore.contents reads the memory engine only; use snapshot()")
        }
        return memory.contents
    }

    /// What the engine holds now, read back from it (faults and outages do not apply).
    func snapshot() async throws(VaultError) -> Contents { try await engine.snapshot() }

    /// The process dies: from this instant its calls reach no store (what it
    /// still writes while it stops goes to a copy no one reads), its
    /// connection to the engine is dropped, and the store of the next process
    /// opens what the engine kept, which is returned too. Called when no call
    /// of the store is in flight (the simulation settles first).
    func crash() async throws(VaultError) -> (next: FaultyStore, kept: Contents) {
        let kept: Contents
        if let memory = engine as? MemoryEngine {
            kept = memory.contents
        } else {
            let engine = self.engine
            kept = try await engine.snapshot()
            state.withLock { $0.engine = MemoryEngine(kept) }
            engine.disconnect()
        }
        let next = FaultyStore(over: try await engine.reopen(kept: kept))
        return (next, kept)
    }

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

    /// The engine, when the store is up (a read).
    private func reading(_ what: String) throws(VaultError) -> any CrashableStore {
        if let error = outageError(what) { throw error }
        return engine
    }

    /// The engine a write goes to, or the write's injected failure.
    private func writing(_ what: String) throws(VaultError) -> any CrashableStore {
        if let error = outageError(what) { throw error }
        let engine = state.withLock { state -> (any CrashableStore)? in
            state.writes += 1
            if state.writesBeforeFailing > 0 {
                state.writesBeforeFailing -= 1
            } else if state.failingWrites > 0 {
                if state.failingWrites != Int.max { state.failingWrites -= 1 }
                return nil
            }
            return state.engine
        }
        guard let engine else { throw VaultError(.storeFailed, "\(what) failed (injected fault)") }
        return engine
    }

    /// Every record, in key order whatever the engine's (a fixed order keeps a seed's schedule one schedule).
    func loadAll() async throws(VaultError) -> StoreContents {
        var contents = try await reading("reading sessions").loadAll()
        contents.records.sort { $0.key < $1.key }
        return contents
    }

    /// A removal of a queued revocation waits while they are held (`holdRevocationDeletes()`).
    func apply(_ change: StoreChange) async throws(VaultError) {
        if case .deletePendingRevocation = change, state.withLock({ $0.holdingDeletes }) {
            await withCheckedContinuation { continuation in
                let go = state.withLock { state -> Bool in
                    guard state.holdingDeletes else { return true }
                    state.heldDeletes.append(continuation)
                    return false
                }
                if go { continuation.resume() }
            }
        }
        try await writing(change.summary).apply(change)
    }

    func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        try await reading("reading a client secret").loadProviderSecret(provider)
    }

    /// Every queued revocation, in (session, id) order whatever the engine's.
    func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        try await reading("reading revocations").loadPendingRevocations().sorted {
            ($0.record.key, $0.id) < ($1.record.key, $1.id)
        }
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
    func login(_ account: Account) async -> RefreshOutcome {
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
