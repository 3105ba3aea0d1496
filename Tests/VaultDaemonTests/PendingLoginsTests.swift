import Testing
import Varlink
import VaultCore

@testable import VaultDaemon

/// The table of interactive logins waiting for their user, the device
/// flow's and the browser login's alike: ids, the per-uid cap, who may
/// continue a login, expiry, and the one answer for a login that is not there.
@Suite("Pending logins")
struct PendingLoginsTests {
    let now = UnixTime(seconds: 1_000)
    let request = LoginRequest(provider: "oauth", user: "alice")

    func caller(_ uid: UInt32) -> Caller { Caller(uid: uid, gid: uid, pid: 1) }

    func add(_ logins: inout PendingLogins<Int>, uid: UInt32, flow: Int = 0, lifetime: Int64 = 60) throws(VaultError)
        -> String
    {
        try logins.add(request, flow, caller: caller(uid), expiresAt: now.adding(seconds: lifetime), now: now)
    }

    @Test("Should hold 4 pending logins a uid, root excepted, under ids of 128 random bits, refusing by name")
    func perUser() throws {
        var logins = PendingLogins<Int>(kind: "browser")
        var ids: Set<String> = []
        for _ in 0..<4 { ids.insert(try add(&logins, uid: 1000)) }
        #expect(ids.count == 4)
        #expect(ids.allSatisfy { $0.count == 22 && $0.allSatisfy { $0.isLetter || $0.isNumber || "-_".contains($0) } })
        do {
            _ = try add(&logins, uid: 1000)
            Issue.record("a fifth login of one uid was kept")
        } catch {
            #expect(error.code == .invalidParameter)
            #expect(error.message.contains("4 browser logins pending"), "\(error.message)")
        }
        _ = try add(&logins, uid: 1001)
        for _ in 0..<8 { _ = try add(&logins, uid: 0) }
        #expect(logins.logins.count == 13)
    }

    @Test("Should let only the uid that began a login, or root, continue it; to another it is unknown")
    func uidCheck() throws {
        var logins = PendingLogins<Int>(kind: "device")
        let id = try add(&logins, uid: 1000, flow: 7)
        #expect(throws: logins.unknown()) { try logins.login(id, uid: 1001, now: now) }
        #expect(throws: logins.unknown()) { try logins.take(id, uid: 1001, now: now) }
        #expect(logins.logins[id] != nil, "another uid's try leaves the login pending")
        #expect(try logins.login(id, uid: 1000, now: now).flow == 7)
        logins.update(id, 8)
        #expect(try logins.login(id, uid: 0, now: now).flow == 8)
        #expect(try logins.take(id, uid: 1000, now: now).caller.uid == 1000)
        #expect(throws: logins.unknown()) { try logins.take(id, uid: 1000, now: now) }
        logins.update(id, 9)
        #expect(logins.logins[id] == nil, "an update brings no finished login back")
    }

    @Test("Should forget a login at its expiry, and free its place")
    func expiry() throws {
        var logins = PendingLogins<Int>(kind: "device")
        let short = try add(&logins, uid: 1000, lifetime: 1)
        for _ in 0..<3 { _ = try add(&logins, uid: 1000, lifetime: 600) }
        #expect(try logins.login(short, uid: 1000, now: now).request.user == "alice")
        #expect(throws: logins.unknown()) { try logins.login(short, uid: 1000, now: now.adding(seconds: 1)) }
        #expect(logins.logins[short] == nil)
        _ = try logins.add(request, 0, caller: caller(1000), expiresAt: now.adding(seconds: 60), now: now)
        logins.dropExpired(now: now.adding(seconds: 600))
        #expect(logins.logins.isEmpty)
    }

    @Test("Should answer an unknown login LoginExpired, naming the kind", arguments: ["device", "browser"])
    func unknown(kind: String) {
        var logins = PendingLogins<Int>(kind: kind)
        do {
            _ = try logins.take("no-such-id", uid: 0, now: now)
            Issue.record("an unknown id was found")
        } catch {
            #expect(error.code == .loginExpired)
            #expect(error.message.hasPrefix("no \(kind) login of this id is pending for you"), "\(error.message)")
        }
    }

    /// A manager with one oauth2 provider that has a browser login, on `clock`.
    func manager(_ clock: ManualClock) throws -> SessionManager {
        let config = try ConfigParser.parse(
            """
            [Provider oauth]
            Type=oauth2
            TokenURL=http://127.0.0.1:9/token
            AuthorizationURL=http://127.0.0.1:9/authorize
            ClientID=sim
            """, file: "test.conf")
        return SessionManager(
            store: FaultyStore(), config: config, clock: clock, log: Logger(level: .debug, target: .discard),
            policy: AccessPolicy(vaultdUID: 0))
    }

    @Test("Should drop a login nobody continues when the due work runs at its expiry, not before")
    func droppedByDueWork() async throws {
        let clock = ManualClock()
        let manager = try manager(clock)
        _ = try await manager.beginBrowserLogin(request, redirectURI: "http://127.0.0.1:8400/", caller: caller(1000))
        clock.advance(by: Double(BrowserLogin.lifetimeSeconds - 1))
        await manager.runDueWork()
        #expect(await manager.browserLogins.logins.count == 1)
        clock.advance(by: 1)
        await manager.runDueWork()
        #expect(await manager.browserLogins.logins.isEmpty)
        #expect(await manager.pendingLoginsExpire == nil)
    }

    @Test("Should set the manager's one alarm for a login's expiry, the nearest deadline")
    func alarmForTheExpiry() async throws {
        let clock = ManualClock()
        let manager = try manager(clock)
        #expect(await manager.alarmAt == nil, "nothing to wake for")
        _ = try await manager.beginBrowserLogin(request, redirectURI: "http://127.0.0.1:8400/", caller: caller(1000))
        let expiry = clock.now().adding(seconds: BrowserLogin.lifetimeSeconds)
        #expect(await manager.alarmAt == Double(expiry.seconds))
        clock.advance(by: Double(BrowserLogin.lifetimeSeconds))
        await manager.runDueWork()
        #expect(await manager.browserLogins.logins.isEmpty)
        #expect(await manager.alarmAt == nil, "nothing left to wake for")
    }
}
