import Synchronization
import Testing
import Varlink
import VaultCore
import VaultDaemon

/// A provider like an exec helper for CometChat: every login and refresh
/// mints a new access token without an expiry, which stays valid until it
/// is revoked. It records what it was asked to revoke.
final class MintingProvider: TokenProvider, Sendable {
    struct State {
        var minted = 0
        /// Access tokens revoked alone (a token a refresh replaced), in order.
        var revokedReplaced: [String] = []
        /// Access tokens of sessions revoked as a whole (logout).
        var revokedSessions: [String] = []
        var revocationsFail = false
        var holdRefreshes = false
    }
    let state = Mutex(State())
    private let held = Mutex<[CheckedContinuation<Void, Never>]>([])

    var heldCount: Int { held.withLock { $0.count } }

    func release() {
        for continuation in held.withLock({ all in
            defer { all = [] }
            return all
        }) { continuation.resume() }
    }

    private func mint() -> TokenSet {
        state.withLock { state in
            state.minted += 1
            return TokenSet(accessToken: Secret("mt-\(state.minted)-" + String(repeating: "m", count: 12)))
        }
    }

    func login(_ account: Account) async -> RefreshOutcome {
        .refreshed(mint(), expiresIn: nil)
    }

    func refresh(_ record: SessionRecord) async -> RefreshOutcome {
        let tokens = mint()
        if state.withLock({ $0.holdRefreshes }) {
            await withCheckedContinuation { continuation in held.withLock { $0.append(continuation) } }
        }
        return .refreshed(tokens, expiresIn: nil)
    }

    func canRefresh(_ record: SessionRecord) -> Bool { true }

    func revokes(_ record: SessionRecord) -> Bool { true }

    func revoke(_ record: SessionRecord) async -> Bool {
        state.withLock { state in
            if state.revocationsFail { return false }
            state.revokedSessions.append(record.tokens.accessToken.revealed)
            return true
        }
    }

    func revokesReplaced(_ old: SessionRecord, by new: TokenSet) -> Bool { old.tokens.accessToken != new.accessToken }

    func revokeReplaced(_ old: SessionRecord) async -> Bool {
        state.withLock { state in
            if state.revocationsFail { return false }
            state.revokedReplaced.append(old.tokens.accessToken.revealed)
            return true
        }
    }
}

/// A session manager whose one provider, `mint`, is a `MintingProvider`.
struct MintingHarness {
    let clock = ManualClock()
    let store = FaultyStore()
    let provider = MintingProvider()
    let manager: SessionManager
    static let alice = Caller(uid: 1000, gid: 1000, pid: 42)
    let key = SessionKey(owner: 1000, account: Account(provider: "mint", user: "alice"))

    /// `autoLogin`: alice's account is declared hers, `AutoLogin=yes`, and
    /// its entry outlives a logout.
    init(autoLogin: Bool = false) throws {
        let provider = self.provider
        let config = try ConfigParser.parse(
            """
            [Vault]
            MinRefreshInterval=0

            [Provider mint]
            Type=exec
            Command=/bin/true
            \(autoLogin ? "\n[Account mint alice]\nOwner=1000\nAutoLogin=yes\n" : "")
            """, file: "test.conf")
        let declared = autoLogin ? [key.account: DeclaredAccount(owner: 1000)] : [:]
        manager = SessionManager(
            store: store, config: config, clock: clock, log: Logger(level: .debug, target: .discard),
            policy: AccessPolicy(vaultdUID: 1000, declared: declared), providers: { _, _, _ in provider },
            random: { 0.5 }, events: { _ in })
    }

    func login() async throws -> SessionRecord {
        try await manager.login(LoginRequest(provider: "mint", user: "alice"), caller: Self.alice).0
    }

    func settle() async {
        for _ in 0..<10_000 {
            if await manager.backgroundWork == 0 { return }
            await Task.yield()
        }
    }

    var current: String? { manager.table.view(of: key)?.record?.tokens.accessToken.revealed }
}

@Suite("Tokens a refresh replaced", .timeLimit(.minutes(5)))
struct ReplacedTokenTests {
    @Test("Should keep a token the client brings to an exec provider instead of minting one")
    func heldTokenKept() async throws {
        let rig = try MintingHarness()
        let held = "cc-held-" + String(repeating: "h", count: 16)
        let request = LoginRequest(provider: "mint", user: "alice", token: held)
        let record = try await rig.manager.login(request, caller: MintingHarness.alice).0
        #expect(record.tokens.accessToken.revealed == held)
        #expect(rig.current == held)
        #expect(rig.provider.state.withLock { $0.minted } == 0, "the helper was asked for a token")
    }

    @Test("Should queue the replaced token's revocation in the store before the attempt, and revoke it alone")
    func replacedToken_queuedThenRevoked() async throws {
        let rig = try MintingHarness()
        let old = try await rig.login().tokens.accessToken.revealed
        rig.provider.state.withLock { $0.revocationsFail = true }
        _ = try await rig.manager.refresh(rig.key, caller: MintingHarness.alice, clientAsked: true)
        await rig.settle()
        let queued = rig.store.contents.pending.values
        #expect(queued.count == 1)
        #expect(queued.first?.replaced == true)
        #expect(queued.first?.record.tokens.accessToken.revealed == old)
        #expect(rig.current != old && rig.current != nil)
        #expect(rig.manager.table.view(of: rig.key)?.record?.expiresAt == nil, "no expiry after the refresh")
        #expect(rig.manager.table.view(of: rig.key)?.refresh?.refreshAt == nil, "no refresh deadline")

        rig.provider.state.withLock { $0.revocationsFail = false }
        rig.clock.advance(by: 10)
        await rig.manager.runDueWork()
        await rig.settle()
        #expect(rig.provider.state.withLock { $0.revokedReplaced } == [old])
        #expect(rig.provider.state.withLock { $0.revokedSessions }.isEmpty, "the session goes on")
        #expect(rig.store.contents.pending.isEmpty, "accepted, so no longer queued")
    }

    @Test("Should revoke a replaced token only once the store holds the token that replaced it")
    func replacedToken_waitsForTheWrite() async throws {
        let rig = try MintingHarness()
        let old = try await rig.login().tokens.accessToken.revealed
        rig.store.failWrites(1)
        _ = try await rig.manager.refresh(rig.key, caller: MintingHarness.alice, clientAsked: true)
        await rig.settle()
        #expect(rig.manager.table.view(of: rig.key)?.refresh?.unsaved == true)
        #expect(rig.store.contents.records[rig.key]?.tokens.accessToken.revealed == old)
        #expect(rig.provider.state.withLock { $0.revokedReplaced }.isEmpty, "the store still holds the old token")
        #expect(rig.store.contents.pending.isEmpty)

        rig.clock.advance(by: Double(SessionTimers.saveRetrySeconds))
        await rig.manager.runDueWork()
        await rig.settle()
        #expect(rig.store.contents.records[rig.key]?.tokens.accessToken.revealed == rig.current)
        #expect(rig.provider.state.withLock { $0.revokedReplaced } == [old])
    }

    @Test("Should revoke a replaced token once, even where the account's entry outlives the logout")
    func replacedToken_revokedOnceAcrossSessions() async throws {
        let rig = try MintingHarness(autoLogin: true)
        let first = try await rig.login().tokens.accessToken.revealed
        // The refreshed tokens' write fails: the first token waits for it, and the logout takes it along.
        rig.store.failWrites(1)
        _ = try await rig.manager.refresh(rig.key, caller: MintingHarness.alice, clientAsked: true)
        await rig.settle()
        try await rig.manager.logout(rig.key, caller: MintingHarness.alice)
        await rig.settle()
        // A new session in the entry the automatic account kept, refreshed and saved.
        _ = try await rig.login()
        _ = try await rig.manager.refresh(rig.key, caller: MintingHarness.alice, clientAsked: true)
        await rig.settle()
        for _ in 0..<6 {
            rig.clock.advance(by: RevocationQueue.spacingSeconds)
            await rig.manager.runDueWork()
            await rig.settle()
        }
        let revoked = rig.provider.state.withLock { $0.revokedReplaced }
        #expect(revoked.filter { $0 == first }.count == 1, "\(revoked)")
        #expect(revoked.count == 2, "the first token and the second session's replaced one: \(revoked)")
    }

    @Test("Should revoke alone the token a refresh minted for a session that ended meanwhile")
    func orphanedMintedToken_revoked() async throws {
        let rig = try MintingHarness()
        let first = try await rig.login().tokens.accessToken.revealed
        rig.provider.state.withLock { $0.holdRefreshes = true }
        let manager = rig.manager
        let key = rig.key
        let refresh = Task { _ = try? await manager.refresh(key, caller: MintingHarness.alice, clientAsked: true) }
        await yieldUntil { rig.provider.heldCount > 0 }
        #expect(rig.provider.heldCount == 1)
        try await rig.manager.logout(rig.key, caller: MintingHarness.alice)
        rig.provider.release()
        await refresh.value
        await rig.settle()
        // The queue sends one revocation per RevocationQueue.spacingSeconds.
        rig.clock.advance(by: RevocationQueue.spacingSeconds)
        await rig.manager.runDueWork()
        await rig.settle()
        let state = rig.provider.state.withLock { $0 }
        #expect(state.revokedSessions == [first], "the logout revoked the session's token")
        #expect(state.revokedReplaced == ["mt-2-" + String(repeating: "m", count: 12)], "and the orphan alone")
        #expect(rig.store.contents.pending.isEmpty && rig.store.contents.records.isEmpty)
    }
}
