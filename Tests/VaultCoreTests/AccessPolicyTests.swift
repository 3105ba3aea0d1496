import Testing
import Varlink
import VaultCore

@Suite("AccessPolicy", .timeLimit(.minutes(5)))
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

    func key(_ owner: UInt32, _ account: Account) -> SessionKey { SessionKey(owner: owner, account: account) }

    @Test("Should hand a token to its owner and, for a declared account, to exactly whom it names")
    func tokenReaders() {
        let policy = AccessPolicy(
            adminGIDs: [50],
            declared: [alice: DeclaredAccount(owner: 1000, readers: Principals(uids: [1001], gids: [60]))])
        #expect(policy.mayReadToken(caller(uid: 1000), key(1000, alice)))
        #expect(policy.mayReadToken(caller(uid: 1001), key(1000, alice)))
        #expect(policy.mayReadToken(caller(uid: 1002, groups: [60]), key(1000, alice)))
        #expect(!policy.mayReadToken(caller(uid: 1001), key(1000, bob)), "not declared")
        #expect(!policy.mayReadToken(caller(uid: 1001), key(1005, alice)), "readers read the declared owner's only")
        #expect(!policy.mayReadToken(caller(uid: 0), key(1000, bob)), "root is not enough")
        #expect(!policy.mayReadToken(caller(uid: 1003, groups: [50]), key(1000, alice)), "admin is not enough")
    }

    @Test("Should address the caller's own session, the declared owner's, or the one an admin names")
    func owners() throws {
        let policy = AccessPolicy(declared: [alice: DeclaredAccount(owner: 1000)])
        #expect(try policy.owner(of: bob, for: caller(uid: 1001), requested: nil) == 1001)
        #expect(try policy.owner(of: bob, for: caller(uid: 0), requested: 1001) == 1001)
        #expect(try policy.owner(of: alice, for: caller(uid: 1001), requested: nil) == 1000, "squatting is impossible")
        #expect(try policy.owner(of: alice, for: caller(uid: 0), requested: 1000) == 1000)
        #expect(throws: VaultError.self) { try policy.owner(of: alice, for: self.caller(uid: 1001), requested: 1001) }
        // An admin may reach a session held before the account was declared.
        #expect(try policy.owner(of: alice, for: caller(uid: 0), requested: 1001) == 1001)
    }

    @Test("Should let the owner, root and admins manage a session, and nobody else")
    func managing() {
        let policy = AccessPolicy(adminGIDs: [50])
        #expect(policy.mayManage(caller(uid: 1000), key(1000, alice)))
        #expect(policy.mayManage(caller(uid: 0), key(1000, alice)))
        #expect(policy.mayManage(caller(uid: 1001, groups: [50]), key(1000, alice)))
        #expect(!policy.mayManage(caller(uid: 1001), key(1000, alice)))
    }

    @Test("Should let only root, admins, vaultd's uid, the declared owner and MintUsers/MintGroups mint")
    func minting() {
        let policy = AccessPolicy(
            vaultdUID: 900, adminGIDs: [50], declared: [alice: DeclaredAccount(owner: 1000)],
            minters: ["demo": Principals(uids: [1002], gids: [70])])
        #expect(policy.mayMint(caller(uid: 0), bob))
        #expect(policy.mayMint(caller(uid: 900), bob))
        #expect(policy.mayMint(caller(uid: 1003, groups: [50]), bob))
        #expect(policy.mayMint(caller(uid: 1000), alice))
        #expect(!policy.mayMint(caller(uid: 1000), bob), "the owner of one account mints only that one")
        #expect(policy.mayMint(caller(uid: 1002), bob))
        #expect(policy.mayMint(caller(uid: 1004, groups: [70]), bob))
        #expect(!policy.mayMint(caller(uid: 1001), bob))
        #expect(!policy.mayMint(caller(uid: 1002), Account(provider: "other", user: "bob")))
    }
}

@Suite("EventFilter", .timeLimit(.minutes(5)))
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
        #expect(
            e.json().text
                == #"{"kind":"kickedOffline","ownerUid":0,"provider":"a","reason":"revoked","time":1,"user":"u"}"#)
    }
}

@Suite("ConfigParser access and layering", .timeLimit(.minutes(5)))
struct ConfigAccessTests {
    @Test("Should read AdminGroup, SocketMode, SingleAccount, Mint lists and [Account] owners and readers")
    func accessKeys() throws {
        let config = try ConfigParser.parse(
            """
            [Vault]
            AdminGroup=wheel
            SocketMode=0666
            [Provider demo]
            Type=static
            SingleAccount=yes
            MintUsers=carol
            MintGroups=bots
            [Account demo alice]
            Owner=alice
            TokenReadUsers=bob 1001
            TokenReadGroups=ops
            [Account demo dave]
            TokenReadUsers=erin
            """, file: "f")
        #expect(config.adminGroup == "wheel")
        #expect(config.socketMode == 0o666)
        #expect(config.providers["demo"]?.singleAccount == true)
        #expect(config.providers["demo"]?.mintUsers == ["carol"])
        #expect(config.providers["demo"]?.mintGroups == ["bots"])
        let declared = try #require(config.accounts[Account(provider: "demo", user: "alice")])
        #expect(declared == AccountSettings(owner: "alice", readUsers: ["bob", "1001"], readGroups: ["ops"]))
        #expect(config.accounts[Account(provider: "demo", user: "dave")]?.owner == nil)
    }

    @Test("Should refuse a bad SocketMode, SingleAccount or [Account] header, naming file and line")
    func badValues() {
        for (text, needle) in [
            ("[Vault]\nSocketMode=0400\n", "f:2: key 'SocketMode'"),
            ("[Provider p]\nType=static\nSingleAccount=maybe\n", "f:3: key 'SingleAccount'"),
            ("[Account demo]\n", "f:1: bad [Account PROVIDER USER] header"),
            ("[Account demo a]\nColour=1\n", "f:2: unknown key 'Colour'"),
            ("[Account demo a]\nOwner=a b\n", "f:2: key 'Owner'"),
            ("[Vault]\nMaxSessionsPerUser=0\n", "f:2: key 'MaxSessionsPerUser'"),
            ("[Vault]\nMaxSessionSize=10\n", "f:2: key 'MaxSessionSize'"),
            ("[Vault]\nMinRefreshInterval=soon\n", "f:2: key 'MinRefreshInterval'"),
            ("[Vault]\nProviderRequestsPerMinute=-1\n", "f:2: key 'ProviderRequestsPerMinute'"),
            ("[Vault]\nProviderRequestBurst=0\n", "f:2: key 'ProviderRequestBurst'"),
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

    @Test("Should read the per-user limits, with defaults when unset")
    func limits() throws {
        #expect(try ConfigParser.parse("", file: "f").limits == UserLimits())
        let limits = try ConfigParser.parse(
            "[Vault]\nMaxSessionsPerUser=3\nMaxSessionSize=2048\nMinRefreshInterval=5min\n", file: "f"
        ).limits
        #expect(limits.sessionsPerUser == 3)
        #expect(limits.sessionBytes == 2048)
        #expect(limits.minRefreshIntervalSeconds == 300)
        #expect(limits.providerRequests == ProviderBudget.Settings(perMinute: 30, burst: 10), "the defaults")
        let budget = try ConfigParser.parse(
            "[Vault]\nProviderRequestsPerMinute=0\nProviderRequestBurst=50\n", file: "f"
        ).limits.providerRequests
        #expect(budget == ProviderBudget.Settings(perMinute: 0, burst: 50))
        #expect(UserLimits().sessionsPerUser == 256)
        #expect(UserLimits().sessionBytes == 32768)
    }
}
