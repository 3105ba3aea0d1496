import Testing
import VaultCore

@Suite("[Vault] Store= and Database=", .timeLimit(.minutes(5)))
struct StoreConfigTests {
    @Test("Should keep sessions in the Secret Service when Store= is not given")
    func defaultIsSecretService() throws {
        let config = try ConfigParser.parse("[Vault]\nStoreTimeout=5\n", file: "a.conf")
        #expect(config.storeEngine == .secretService)
        #expect(config.databasePath == nil)
    }

    @Test("Should read each engine by its name", arguments: StoreEngine.allCases)
    func readsEngine(_ engine: StoreEngine) throws {
        let config = try ConfigParser.parse("[Vault]\nStore=\(engine.rawValue)\n", file: "a.conf")
        #expect(config.storeEngine == engine)
    }

    @Test("Should refuse an unknown engine, naming the file, the line and the choices")
    func refusesUnknownEngine() throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Vault]\nStore=postgres\n", file: "a.conf")
        }
        #expect(error.code == .invalidConfig)
        #expect(error.message == "a.conf:2: key 'Store': expected secret-service, sqlite or etcd")
    }

    @Test("Should take an absolute Database= path, a later layer winning")
    func readsDatabase() throws {
        let config = try ConfigParser.parse(
            layers: [
                (text: "[Vault]\nStore=sqlite\nDatabase=/srv/a.db\n", file: "a.conf"),
                (text: "[Vault]\nDatabase=/srv/b.db\n", file: "b.conf"),
            ])
        #expect(config.storeEngine == .sqlite)
        #expect(config.databasePath == "/srv/b.db")
    }

    @Test("Should refuse a relative or directory Database= path", arguments: ["sessions.db", "/srv/vaultd/", ""])
    func refusesBadDatabase(_ value: String) throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Vault]\nDatabase=\(value)\n", file: "a.conf")
        }
        #expect(error.message == "a.conf:2: key 'Database': expected an absolute path to a file")
    }
}
