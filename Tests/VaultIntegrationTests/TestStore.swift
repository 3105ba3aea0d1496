import Foundation
import Glibc
import Testing
import VaultCore
import VaultDaemon

/// The store engine the integration tests start vaultd on: the Secret
/// Service (gnome-keyring) by default, the SQLite engine when the test
/// process has `VAULTD_TEST_STORE=sqlite` (scripts/test runs the suite a
/// second time so). Suites about one engine name it themselves.
enum TestStore {
    /// The engine of this run.
    static let engine: StoreEngine = {
        switch ProcessInfo.processInfo.environment["VAULTD_TEST_STORE"] {
        case "sqlite": return .sqlite
        case nil, "", "secret-service": return .secretService
        case let other?:
            // A typo must not quietly run the default engine twice.
            fatalError("VAULTD_TEST_STORE=\(other): use sqlite or secret-service")
        }
    }()

    /// The engines a crash test takes as its argument: both in the ordinary
    /// run, so that `scripts/test` kills vaultd on SQLite too without the
    /// variable; the SQLite run's own one only.
    static let crashEngines: [StoreEngine] = engine == .sqlite ? [.sqlite] : localEngines

    /// The engines of one host, which the crash tests kill vaultd on (etcd
    /// has suites of its own, in scripts/test's etcd step).
    static let localEngines: [StoreEngine] = [.secretService, .sqlite]

    /// Why a test is skipped in the SQLite run.
    static let secretServiceOnlyReason: Comment =
        "about the Secret Service engine itself (its items, gnome-keyring, the bus): not run with VAULTD_TEST_STORE=sqlite"
}

extension Trait where Self == ConditionTrait {
    /// Runs the test or suite only in the Secret Service run: it inspects,
    /// seeds, kills or locks the keyring that holds the sessions, which the
    /// SQLite engine does not use. Each use says why beside it.
    static var secretServiceOnly: Self {
        .enabled(if: TestStore.engine == .secretService, TestStore.secretServiceOnlyReason)
    }
}

extension Trait where Self == ConditionTrait {
    /// For suites whose tests take the engine as an argument and run against
    /// both in the ordinary run (the crash tests): the SQLite run skips them
    /// rather than run both engines a second time.
    static var bothEnginesInOrdinaryRun: Self {
        .enabled(
            if: TestStore.engine == .secretService,
            "runs against both engines (an argument) in the ordinary run: not again with VAULTD_TEST_STORE=sqlite")
    }
}

/// Where the SQLite engine's data key comes from for a test's daemon.
enum TestDataKey: Sendable {
    /// `$CREDENTIALS_DIRECTORY/data-key`, 32 random bytes made once per
    /// fixture: no D-Bus needed for the key.
    case credential
    /// The `io.vaultd.DataKey` item in the private keyring, in the fixture's scope.
    case secretService
}

/// The SQLite files of the daemons started on one socket: the database and
/// the credential directory holding its data key, in
/// `<the socket's directory>/sqlite-<scope>/`, so every restart on that
/// socket finds the same database and key, and the test's temporary
/// directory takes them away.
struct SQLiteFiles {
    let directory: String
    let scope: String

    init(socketPath: String) {
        let socketDirectory = (socketPath as NSString).deletingLastPathComponent
        scope = RunningDaemon.scope(for: socketPath)
        directory = socketDirectory + "/sqlite-" + scope
    }

    /// The database file (`VAULTD_DATABASE`).
    var database: String { directory + "/sessions.db" }
    /// `CREDENTIALS_DIRECTORY`.
    var credentials: String { directory + "/credentials" }

    /// Creates the directories (0700) and, for `.credential`, the key when
    /// missing; returns the environment that starts vaultd on them.
    func prepare(_ dataKey: TestDataKey) throws -> [String: String] {
        for path in [(directory as NSString).deletingLastPathComponent, directory, credentials] {
            if mkdir(path, 0o700) != 0 && errno != EEXIST {
                throw HarnessError("cannot create \(path): \(String(cString: strerror(errno)))")
            }
        }
        var environment = ["VAULTD_STORE": "sqlite", "VAULTD_DATABASE": database]
        switch dataKey {
        case .credential:
            let key = credentials + "/" + CredentialDataKeys.name
            if !FileManager.default.fileExists(atPath: key) {
                // The system generator: getrandom(2), as `head -c 32 /dev/urandom` would.
                let bytes = (0..<DataKey.byteCount).map { _ in UInt8.random(in: 0...255) }
                guard
                    FileManager.default.createFile(
                        atPath: key, contents: Data(bytes), attributes: [.posixPermissions: 0o600])
                else { throw HarnessError("cannot write \(key)") }
            }
            environment["CREDENTIALS_DIRECTORY"] = credentials
        case .secretService:
            // The key item lives beside the fixture's sessions, in its scope.
            environment["CREDENTIALS_DIRECTORY"] = ""
        }
        return environment
    }
}

/// What the store of the daemons on one socket holds, read the way its
/// engine keeps it: with vaultd's own store code (`LibsecretStore` over the
/// fixture's scope, or `SQLiteStore` on the fixture's database and key),
/// opened for each look and let go after it.
struct StoreReader {
    let engine: StoreEngine
    let socketPath: String
    let dataKey: TestDataKey

    init(socketPath: String, engine: StoreEngine = TestStore.engine, dataKey: TestDataKey = .credential) {
        self.socketPath = socketPath
        self.engine = engine
        self.dataKey = dataKey
    }

    init(_ fixture: DaemonFixture) {
        self.init(socketPath: fixture.socketPath, engine: fixture.engine, dataKey: fixture.dataKey)
    }

    var scope: String { RunningDaemon.scope(for: socketPath) }

    /// The store, opened now: to read beside a running vaultd (an SQLite
    /// database read-only, without its lock), or `forWriting` before vaultd
    /// starts (taking the lock, as vaultd does).
    func open(forWriting: Bool = false) async throws -> any SessionStore {
        switch engine {
        case .secretService:
            return try LibsecretStore.open(timeoutSeconds: 10, scope: scope)
        case .sqlite:
            let files = SQLiteFiles(socketPath: socketPath)
            _ = try files.prepare(dataKey)
            let keys: any DataKeySource
            switch dataKey {
            case .credential: keys = CredentialDataKeys(directory: files.credentials)
            case .secretService:
                keys = SecretServiceDataKeys(store: try LibsecretStore.open(timeoutSeconds: 10, scope: scope))
            }
            guard forWriting else {
                return try await SQLiteStore.openForReading(path: files.database, keys: keys, timeoutSeconds: 10)
            }
            return try await SQLiteStore.open(
                path: files.database, keys: keys, timeoutSeconds: 10, log: Logger(level: .error, target: .discard))
        case .etcd: throw HarnessError("the etcd suites read etcd with EtcdStore, not through StoreReader")
        }
    }

    /// Every stored record of `provider USER`.
    func records(provider: String, user: String) async throws -> [SessionRecord] {
        try await open().loadAll().records.filter { $0.account == Account(provider: provider, user: user) }
    }

    /// Whether anything is stored for `provider USER`: on the Secret Service
    /// any item of the account (secret-tool, in any scope), read or not.
    func holds(provider: String, user: String) async throws -> Bool {
        switch engine {
        case .secretService: return try secretToolSearch(provider: provider, user: user).contains("label =")
        case .sqlite: return try await !records(provider: provider, user: user).isEmpty
        case .etcd: throw HarnessError("the etcd suites read etcd with EtcdStore, not through StoreReader")
        }
    }

    /// How many revocations of `user`'s sessions wait in the store: on the
    /// Secret Service every item (secret-tool), read or not.
    func queuedRevocations(user: String) async throws -> Int {
        switch engine {
        case .secretService:
            let search = try runCommand(
                URL(fileURLWithPath: "/usr/bin/secret-tool"),
                ["search", "--all", "xdg:schema", "io.vaultd.PendingRevocation", "user", user])
            return (search.stdout + search.stderr).components(separatedBy: "label =").count - 1
        case .sqlite:
            return try await open().loadPendingRevocations().filter { $0.record.account.user == user }.count
        case .etcd: throw HarnessError("the etcd suites read etcd with EtcdStore, not through StoreReader")
        }
    }

    /// Writes `record` as vaultd would, before vaultd starts: for tests of
    /// what vaultd finds at start-up. On the Secret Service with secret-tool
    /// (not vaultd's code), on SQLite with vaultd's `SQLiteStore` (sealing
    /// needs the engine's own code).
    func seed(_ record: SessionRecord) async throws {
        switch engine {
        case .secretService:
            let result = try storeRecordWithSecretTool(record, scope: scope)
            guard result.status == 0 else { throw HarnessError("secret-tool store failed: \(result.stderr)") }
        case .sqlite:
            // The store of a seed before this one lets its lock go with its
            // last reference, which the store thread that ran its last call
            // may hold a moment after that call returned here: wait for it.
            for _ in 0..<500 {
                do {
                    return try await open(forWriting: true).apply(.save(record))
                } catch let error as VaultError where error.message.contains("is in use") {
                    try await Task.sleep(for: .milliseconds(10))
                }
            }
            try await open(forWriting: true).apply(.save(record))
        case .etcd: throw HarnessError("the etcd suites read etcd with EtcdStore, not through StoreReader")
        }
    }
}
