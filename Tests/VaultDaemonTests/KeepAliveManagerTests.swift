import Testing
import Varlink
import VaultCore
import VaultDaemon

/// An `AutoLogin=yes` account whose provider mints tokens without a refresh
/// token (client credentials), on a manual clock: its next token is minted
/// ahead of expiry through the refresh's single flight (`Renewal.mint`).
@Suite("SessionManager: kept-alive accounts, in process", .timeLimit(.minutes(5)))
struct KeepAliveManagerTests {
    static let bot = SessionKey(owner: 1000, account: Account(provider: "oauth", user: "bot"))
    static let owner = Caller(uid: 1000, gid: 1000, pid: 7)

    let clock = ManualClock()
    let provider: FakeProvider
    let events = EventLog()
    let manager: SessionManager

    /// A manager whose `oauth bot` is declared for uid 1000, `AutoLogin=yes`
    /// when `autoLogin`, and whose provider's logins issue `lifetime` s tokens.
    init(autoLogin: Bool = true, lifetime: Int64 = 3) throws {
        let provider = FakeProvider(clock: clock)
        provider.state.withLock {
            $0.loginMode = .normal
            $0.loginLifetime = lifetime
        }
        self.provider = provider
        let events = self.events
        let config = try TestConfig.make("[Account oauth bot]\nOwner=1000\nAutoLogin=\(autoLogin ? "yes" : "no")\n")
        manager = SessionManager(
            store: FaultyStore(), config: config, clock: clock, log: Logger(level: .debug, target: .discard),
            policy: AccessPolicy(vaultdUID: 0, declared: [Self.bot.account: DeclaredAccount(owner: 1000)]),
            providers: { settings, _, _ in settings.type == .oauth2 ? provider : nil }, random: { 0.5 },
            events: { event in events.append(event) })
    }

    func kinds() -> [EventKind] { events.all.filter { $0.account == Self.bot.account }.map(\.kind) }

    /// Moves the clock, does what is due, and lets background work settle (bounded).
    func advance(by seconds: Double) async {
        clock.advance(by: seconds)
        await manager.runDueWork()
        for _ in 0..<10_000 {
            if await manager.backgroundWork == 0 { return }
            await Task.yield()
        }
    }

    @Test("Should mint each 3 s token ahead of its expiry for a minute: always a token, never tokenExpired")
    func mintsAheadForAMinute() async throws {
        await manager.startAutoLogins()
        await advance(by: 0)
        let first = try await manager.freshToken(Self.bot, minValidSeconds: 0, caller: Self.owner)
        #expect(first.tokens.refreshToken == nil, "client credentials: nothing to refresh with")
        var tokens: Set<String> = [first.accessToken.revealed]
        // A minute in quarter seconds, reading the token at each step.
        for _ in 0..<240 {
            await advance(by: 0.25)
            let record = try await manager.freshToken(Self.bot, minValidSeconds: 0, caller: Self.owner)
            #expect(!record.isExpired(at: clock.now()))
            tokens.insert(record.accessToken.revealed)
        }
        let kinds = kinds()
        #expect(!kinds.contains(.tokenExpired), "\(kinds)")
        #expect(kinds.filter { $0 == .loginSuccess }.count == 1, "\(kinds)")
        #expect(kinds.filter { $0 == .tokenRefreshed }.count >= 20, "\(kinds)")
        #expect(tokens.count >= 21)
        let state = provider.state.withLock { $0 }
        #expect(state.refreshCalls == 0, "minted, not refreshed")
        #expect(state.mostLoginsInFlight == 1, "one mint at a time")
    }

    @Test("Should expire the session only when minting fails through the expiry, then log in again")
    func failedMintExpires() async throws {
        await manager.startAutoLogins()
        await advance(by: 0)
        _ = try await manager.freshToken(Self.bot, minValidSeconds: 0, caller: Self.owner)
        provider.state.withLock { $0.loginMode = .transient }
        // Bounded: the 3 s token, the mint at 2 s and its retries, all failing.
        for _ in 0..<20 where !kinds().contains(.tokenExpired) { await advance(by: 0.5) }
        #expect(kinds().contains(.tokenExpired), "\(kinds())")
        provider.state.withLock { $0.loginMode = .normal }
        for _ in 0..<40 where kinds().filter({ $0 == .loginSuccess }).count < 2 { await advance(by: 1) }
        #expect(kinds().filter { $0 == .loginSuccess }.count == 2, "\(kinds())")
    }

    @Test("Should not mint for an account vaultd does not keep alive: a token without refresh token expires")
    func notKeptAliveExpires() async throws {
        let manager = try KeepAliveManagerTests(autoLogin: false)
        let request = LoginRequest(
            provider: "oauth", user: "bot",
            tokenResponse: .object(["access_token": .string("at-own-token-0123456789"), "expires_in": .int(3)]))
        _ = try await manager.manager.login(request, caller: Self.owner)
        for _ in 0..<10 where !manager.kinds().contains(.tokenExpired) { await manager.advance(by: 0.5) }
        #expect(manager.kinds() == [.loginSuccess, .tokenExpired])
        #expect(manager.provider.state.withLock { $0.loginAttempts.isEmpty })
    }
}
