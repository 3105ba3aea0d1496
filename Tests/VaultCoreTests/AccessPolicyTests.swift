import Testing
import VaultCore

@Suite("AccessPolicy")
struct AccessPolicyTests {
    let alice = Account(provider: "demo", user: "alice")
    let bob = Account(provider: "demo", user: "bob")

    func caller(uid: UInt32, gid: UInt32 = 100, groups: [UInt32] = []) -> Caller {
        Caller(uid: uid, gid: gid, pid: 1, groups: groups)
    }

    @Test("Should let the owner, root and admin-group members see a session, and nobody else")
    func seeing() {
        let policy = AccessPolicy(adminGIDs: [50])
        #expect(policy.maySee(caller(uid: 1000), ownerUID: 1000))
        #expect(policy.maySee(caller(uid: 0), ownerUID: 1000))
        #expect(policy.maySee(caller(uid: 1001, groups: [7, 50]), ownerUID: 1000))
        #expect(policy.maySee(caller(uid: 1001, gid: 50), ownerUID: 1000))
        #expect(!policy.maySee(caller(uid: 1001, groups: [7]), ownerUID: 1000))
    }

    @Test("Should hand a token to its owner and to exactly whom the account's allow list names")
    func tokenReaders() {
        let policy = AccessPolicy(adminGIDs: [50], tokenReaders: [alice: (uids: [1001], gids: [60])])
        #expect(policy.mayReadToken(caller(uid: 1000), account: alice, ownerUID: 1000))
        #expect(policy.mayReadToken(caller(uid: 1001), account: alice, ownerUID: 1000))
        #expect(policy.mayReadToken(caller(uid: 1002, groups: [60]), account: alice, ownerUID: 1000))
        #expect(!policy.mayReadToken(caller(uid: 1001), account: bob, ownerUID: 1000))
        #expect(!policy.mayReadToken(caller(uid: 0), account: bob, ownerUID: 1000), "root is not enough")
        #expect(
            !policy.mayReadToken(caller(uid: 1003, groups: [50]), account: alice, ownerUID: 1000), "admin is not enough"
        )
    }
}

@Suite("EventFilter")
struct EventFilterTests {
    func event(_ kind: EventKind, _ provider: String, _ user: String) -> VaultEvent {
        VaultEvent(
            kind: kind, account: Account(provider: provider, user: user), ownerUID: 0, time: UnixTime(seconds: 1))
    }

    @Test("Should pass events by provider, user and kind, any when unset")
    func matching() {
        #expect(EventFilter().matches(event(.loginSuccess, "a", "u")))
        let filter = EventFilter(provider: "a", user: "u", kinds: [.kickedOffline])
        #expect(filter.matches(event(.kickedOffline, "a", "u")))
        #expect(!filter.matches(event(.loginSuccess, "a", "u")))
        #expect(!filter.matches(event(.kickedOffline, "b", "u")))
        #expect(!filter.matches(event(.kickedOffline, "a", "v")))
    }

    @Test("Should describe an event without any secret-bearing field")
    func json() {
        var e = event(.kickedOffline, "a", "u")
        e.reason = "revoked"
        #expect(e.json().text == #"{"kind":"kickedOffline","provider":"a","reason":"revoked","time":1,"user":"u"}"#)
    }
}

@Suite("ConfigParser access and layering")
struct ConfigAccessTests {
    @Test("Should read AdminGroup, SocketMode, SingleAccount and [Account] allow lists")
    func accessKeys() throws {
        let config = try ConfigParser.parse(
            """
            [Vault]
            AdminGroup=wheel
            SocketMode=0666
            [Provider demo]
            Type=static
            SingleAccount=yes
            [Account demo alice]
            TokenReadUsers=bob 1001
            TokenReadGroups=ops
            """, file: "f")
        #expect(config.adminGroup == "wheel")
        #expect(config.socketMode == 0o666)
        #expect(config.providers["demo"]?.singleAccount == true)
        let readers = try #require(config.tokenReaders[Account(provider: "demo", user: "alice")])
        #expect(readers.users == ["bob", "1001"])
        #expect(readers.groups == ["ops"])
    }

    @Test("Should refuse a bad SocketMode, SingleAccount or [Account] header, naming file and line")
    func badValues() {
        for (text, needle) in [
            ("[Vault]\nSocketMode=0400\n", "f:2: key 'SocketMode'"),
            ("[Provider p]\nType=static\nSingleAccount=maybe\n", "f:3: key 'SingleAccount'"),
            ("[Account demo]\n", "f:1: bad [Account PROVIDER USER] header"),
            ("[Account demo a]\nColour=1\n", "f:2: unknown key 'Colour'"),
        ] {
            #expect(throws: VaultError.self) { try ConfigParser.parse(text, file: "f") }
            do {
                _ = try ConfigParser.parse(text, file: "f")
            } catch {
                #expect(error.message.contains(needle), "\(error.message)")
            }
        }
    }

    @Test("Should let a later layer override an earlier one's keys and add providers")
    func layers() throws {
        let config = try ConfigParser.parse(layers: [
            ("[Vault]\nStoreTimeout=5s\n[Provider a]\nType=static\nDescription=first\n", "main"),
            ("[Provider a]\nDescription=second\n[Provider b]\nType=static\n", "10.conf"),
            ("[Vault]\nStoreTimeout=9s\n", "20.conf"),
        ])
        #expect(config.storeTimeoutSeconds == 9)
        #expect(config.providers["a"]?.description == "second")
        #expect(config.providers["a"]?.type == .static)
        #expect(config.providers.keys.sorted() == ["a", "b"])
    }

    @Test("Should let an admin log out another uid's session, and nobody else")
    func adminLogout() {
        let record = SessionRecord(
            account: Account(provider: "p", user: "u"), user: UserProfile(uid: "u"),
            tokens: TokenSet(accessToken: Secret("t")), createdAt: UnixTime(seconds: 1), expiresAt: nil, ownerUID: 1000)
        var machine = AccountStateMachine(account: record.account, state: .loggedIn(record))
        let other = Caller(uid: 1001, gid: 1001, pid: 1)
        #expect(machine.logoutRequested(by: other) == .fail(VaultError(.accessDenied, "")))
        #expect(machine.logoutRequested(by: other, isAdmin: true) == .startLogout(record))
    }
}
