import Testing
import VaultCore

@testable import VaultDaemon

/// The session table's running counts, which STATUS= reads after every change.
@Suite("Session table", .ownThreads, .timeLimit(.minutes(5)))
struct SessionTableTests {
    /// A view in `state`, with a refresh `connection` when given.
    static func view(_ state: LoginState, _ connection: ConnectionState? = nil) -> SessionView {
        var refresh: RefreshStatus?
        if let connection {
            refresh = RefreshStatus()
            refresh?.connection = connection
        }
        let record = SessionRecord(
            account: Account(provider: "p", user: "u"), user: UserProfile(uid: "u"),
            tokens: TokenSet(accessToken: Secret("t")), createdAt: UnixTime(seconds: 0), expiresAt: nil,
            ownerUID: 0)
        return SessionView(state: state, record: state == .logging ? nil : record, refresh: refresh)
    }

    /// The counts found by looking at every view, as STATUS= once did.
    static func scanned(_ table: SessionTable) -> SessionTable.Counts {
        var counts = SessionTable.Counts()
        for (_, view) in table.all() { counts.count(view, 1) }
        return counts
    }

    @Test("Should keep its counts equal to a scan of every view through adds, changes and removals")
    func countsFollowEveryChange() {
        let table = SessionTable()
        let a = Account(provider: "p", user: "a")
        let b = Account(provider: "p", user: "b")
        let c = Account(provider: "p", user: "c")
        let steps: [(Account, SessionView?)] = [
            (a, Self.view(.logging)), (b, Self.view(.logging)), (a, Self.view(.logged)),
            (b, Self.view(.logged, .connecting)), (c, Self.view(.logged, .connectFailed)),
            (b, Self.view(.logged, .connected)), (c, Self.view(.logout)), (a, nil), (a, nil),
            (c, nil), (b, Self.view(.logged, .connecting)),
        ]
        for (account, view) in steps {
            table.publish(SessionKey(owner: 1000, account: account), view)
            #expect(table.counts == Self.scanned(table))
        }
        #expect(table.counts.sessions == 1)
        #expect(table.counts.refreshing == 1)
        #expect(ServiceNotifier.statusLine(table) == "1 session, 0 logging in, 1 refreshing, 0 failing to refresh")
    }

    static func keyOf(_ user: String) -> SessionKey {
        SessionKey(owner: 1000, account: Account(provider: "p", user: user))
    }

    @Test("Should spell out each count in the STATUS= line")
    func statusLine() {
        let table = SessionTable()
        table.publish(Self.keyOf("a"), Self.view(.logging))
        table.publish(Self.keyOf("b"), Self.view(.logged, .connectFailed))
        table.publish(Self.keyOf("c"), Self.view(.logged, .connecting))
        table.publish(Self.keyOf("d"), Self.view(.logged))
        #expect(ServiceNotifier.statusLine(table) == "3 sessions, 1 logging in, 1 refreshing, 1 failing to refresh")
    }

    @Test("Should read GetToken's facts of a view in place: none, logging in, logged in with its last refresh")
    func tokenFacts() {
        let table = SessionTable()
        #expect(table.tokenFacts(of: Self.keyOf("a")) == nil)
        table.publish(Self.keyOf("a"), Self.view(.logging))
        let logging = table.tokenFacts(of: Self.keyOf("a"))
        #expect(logging != nil && logging?.record == nil)
        var logged = Self.view(.logged, .connected)
        logged.refresh?.lastRefreshAt = UnixTime(seconds: 42)
        table.publish(Self.keyOf("b"), logged)
        let facts = table.tokenFacts(of: Self.keyOf("b"))
        #expect(facts?.record == logged.record)
        #expect(facts?.lastRefreshAt == UnixTime(seconds: 42))
        table.publish(Self.keyOf("b"), nil)
        #expect(table.tokenFacts(of: Self.keyOf("b")) == nil)
    }
}
