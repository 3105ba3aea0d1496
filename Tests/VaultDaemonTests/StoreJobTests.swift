import Foundation
import Glibc
import Testing
import VaultCore
import VaultDaemon

/// The database lock vaultd, `--rotate-key` and `--migrate-store` share, and
/// the command line of the two jobs.
@Suite("Store jobs", .timeLimit(.minutes(5)))
struct StoreJobTests {
    /// A scratch directory holding a credential `data-key`.
    final class Scratch {
        let path: String

        init() throws {
            path = NSTemporaryDirectory() + "vaultd-storejob-\(UUID().uuidString.prefix(8))"
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: false)
            try Data((0..<32).map { _ in UInt8.random(in: 0...255) }).write(
                to: URL(fileURLWithPath: path + "/data-key"))
        }

        var keys: CredentialDataKeys { CredentialDataKeys(directory: path) }

        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    @Test("Should let one holder at a time take a database's lock, and free it with its holder")
    func oneHolder() throws {
        let scratch = try Scratch()
        let database = scratch.path + "/sessions.db"
        var first: DatabaseLock? = try DatabaseLock.acquire(for: database)
        #expect(first?.path == database + ".lock")
        #expect(throws: VaultError.self) { try DatabaseLock.acquire(for: database) }
        do {
            _ = try DatabaseLock.acquire(for: database)
        } catch {
            #expect(error.message.contains("is in use") && error.message.contains(database + ".lock"))
        }
        var st = stat()
        #expect(stat(database + ".lock", &st) == 0 && st.st_mode & 0o777 == 0o600)
        first = nil
        #expect(first == nil)
        let second = try DatabaseLock.acquire(for: database)
        #expect(second.path == database + ".lock")
    }

    @Test("Should refuse to open a SQLite store another store holds open, and open it once that one is gone")
    func storeHoldsTheLock() async throws {
        let scratch = try Scratch()
        let database = scratch.path + "/sessions.db"
        let log = Logger(level: .error, target: .discard)
        var first: SQLiteStore? = try await SQLiteStore.open(
            path: database, keys: scratch.keys, timeoutSeconds: 5, log: log)
        do {
            _ = try await SQLiteStore.open(path: database, keys: scratch.keys, timeoutSeconds: 5, log: log)
            Issue.record("a second store opened the database the first one holds")
        } catch {
            #expect(error.message.contains("is in use"), "\(error.message)")
        }
        #expect(first != nil)
        first = nil
        _ = try await SQLiteStore.open(path: database, keys: scratch.keys, timeoutSeconds: 5, log: log)
    }

    @Test("Should read --rotate-key and --migrate-store FROM TO, and name a bad engine")
    func commandLine() throws {
        guard case .run(let rotate) = try DaemonOptions.parse(["--rotate-key"]) else {
            Issue.record("--rotate-key is a run")
            return
        }
        #expect(rotate.storeJob == .rotateKey)
        guard case .run(let migrate) = try DaemonOptions.parse(["--migrate-store", "secret-service", "sqlite"]) else {
            Issue.record("--migrate-store is a run")
            return
        }
        #expect(migrate.storeJob == .migrateStore(from: .secretService, to: .sqlite))
        do {
            _ = try DaemonOptions.parse(["--migrate-store", "keyring", "sqlite"])
            Issue.record("an unknown engine was accepted")
        } catch {
            #expect(error.message.contains("unknown store engine 'keyring'"), "\(error.message)")
        }
        #expect(throws: VaultError.self) { try DaemonOptions.parse(["--migrate-store", "sqlite"]) }
    }
}
