import Foundation
import Glibc
import Synchronization
import Testing
import VaultCore
import VaultDaemon

/// `TokenFiles` following a real `SessionManager` in process (fake store and
/// provider, manual clock): the file always holds what `GetToken` serves.
@Suite("Token files follow the session table", .timeLimit(.minutes(5)))
struct TokenFileFollowTests {
    /// A manager, token files for alice's session of `oauth u` in a fresh directory, and the file's path.
    func setUp() throws -> (ManagerHarness, TokenFiles, String, () -> Void) {
        let h = try ManagerHarness()
        let directory = NSTemporaryDirectory() + "/vaultd-follow-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        let path = directory + "/u.token"
        let files = TokenFiles(table: h.manager.table, log: Logger(level: .debug, target: .discard))
        h.manager.table.observe { key in files.changed(key) }
        files.update([h.key("u"): TokenFilePlan(settings: TokenFileSettings(path: path, onDisk: true))])
        return (h, files, path, { try? FileManager.default.removeItem(atPath: directory) })
    }

    /// The file's content once every change so far is written (nil: no file).
    func settled(_ files: TokenFiles, _ path: String) -> String? {
        files.waitIdle(seconds: 10)
        return try? String(contentsOfFile: path, encoding: .utf8)
    }

    @Test("Should write the token at login and after a refresh, and remove it at logout")
    func loginRefreshLogout() async throws {
        let (h, files, path, cleanUp) = try setUp()
        defer { cleanUp() }
        #expect(settled(files, path) == nil)
        let record = try await h.login("u")
        #expect(settled(files, path) == record.tokens.accessToken.revealed)
        let refreshed = try await h.manager.refresh(h.key("u"), caller: ManagerHarness.alice)
        #expect(refreshed.tokens.accessToken != record.tokens.accessToken)
        #expect(settled(files, path) == refreshed.tokens.accessToken.revealed)
        try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        #expect(settled(files, path) == nil)
    }

    @Test("Should write the token again when a logout fails and the session is served again")
    func failedLogoutWritesAgain() async throws {
        let (h, files, path, cleanUp) = try setUp()
        defer { cleanUp() }
        let record = try await h.login("u")
        #expect(settled(files, path) == record.tokens.accessToken.revealed)
        h.store.failWrites(1)
        await #expect(throws: VaultError.self) {
            try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        }
        #expect(settled(files, path) == record.tokens.accessToken.revealed, "served again, written again")
    }

    @Test("Should remove the file when the token expires and the session ends")
    func expiryRemoves() async throws {
        let (h, files, path, cleanUp) = try setUp()
        defer { cleanUp() }
        h.provider.state.withLock { $0.mode = .transient }
        try await h.login("u", lifetime: 100)
        #expect(settled(files, path) != nil)
        // Every refresh fails for a while: the token expires and the session ends.
        for _ in 0..<20 { await h.advance(by: 10) }
        #expect(h.kinds("u").last == .tokenExpired, "\(h.kinds("u"))")
        #expect(settled(files, path) == nil)
    }

    @Test("Should report a failed write in the session's view, STATUS= counts and an event, until a reload drops it")
    func failedWriteReported() async throws {
        let h = try ManagerHarness()
        let directory = NSTemporaryDirectory() + "/vaultd-follow-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: false)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let events = Mutex<[VaultEvent]>([])
        let files = TokenFiles(
            table: h.manager.table, log: Logger(level: .debug, target: .discard),
            events: { event in events.withLock { $0.append(event) } })
        h.manager.table.observe { key in files.changed(key) }
        files.update([
            h.key("u"): TokenFilePlan(settings: TokenFileSettings(path: directory + "/u.token", onDisk: true))
        ])
        try await h.login("u")
        #expect(settled(files, directory + "/u.token") != nil)
        #expect(chmod(directory, 0o777) == 0)
        _ = try await h.manager.refresh(h.key("u"), caller: ManagerHarness.alice)
        files.waitIdle(seconds: 10)
        let error = h.manager.table.view(of: h.key("u"))?.tokenFileError
        let shown = URL(fileURLWithPath: directory).standardizedFileURL.path
        #expect(
            error?.hasPrefix("the token file could not be written: \(shown) is writable by others") == true,
            "\(String(describing: error))")
        #expect(h.manager.table.tokenFilesFailing == 1)
        #expect(ServiceNotifier.statusLine(h.manager.table).hasSuffix(", 1 token file failing"))
        let failed = events.withLock { $0 }.filter { $0.kind == .tokenFileFailed }
        #expect(failed.map(\.reason) == ["write"] && failed.first?.ownerUID == h.key("u").owner, "\(failed)")
        // The same failure at the next change is still one failure: no second event.
        _ = try await h.manager.refresh(h.key("u"), caller: nil)
        files.waitIdle(seconds: 10)
        #expect(h.manager.table.tokenFilesFailing == 1)
        let again = events.withLock { $0 }.filter { $0.kind == .tokenFileFailed }
        #expect(again.count == 1, "\(again)")
        files.update([:])
        #expect(h.manager.table.tokenFilesFailing == 0, "a file no longer configured fails no one")
        #expect(h.manager.table.view(of: h.key("u"))?.tokenFileError == nil)
    }

    @Test("Should ignore other sessions and remove the file of a target a reload drops")
    func otherSessionsAndReload() async throws {
        let (h, files, path, cleanUp) = try setUp()
        defer { cleanUp() }
        try await h.login("other")
        #expect(settled(files, path) == nil)
        try await h.login("u")
        #expect(settled(files, path) != nil)
        files.update([:])
        #expect(settled(files, path) == nil, "no longer configured: removed")
    }

    @Test("Should write the file again when a reload changes its mode, and move it when a reload swaps two paths")
    func reloadChangesPlan() async throws {
        let (h, files, path, cleanUp) = try setUp()
        defer { cleanUp() }
        let record = try await h.login("u")
        let token = record.tokens.accessToken.revealed
        #expect(settled(files, path) == token)
        files.update([h.key("u"): TokenFilePlan(settings: TokenFileSettings(path: path, mode: 0o440, onDisk: true))])
        #expect(settled(files, path) == token)
        var st = stat()
        #expect(stat(path, &st) == 0 && st.st_mode & 0o7777 == 0o440, "rewritten with the new mode")

        let other = try await h.login("v")
        let second = path + ".v"
        files.update([
            h.key("u"): TokenFilePlan(settings: TokenFileSettings(path: path, onDisk: true)),
            h.key("v"): TokenFilePlan(settings: TokenFileSettings(path: second, onDisk: true)),
        ])
        #expect(settled(files, second) == other.tokens.accessToken.revealed)
        files.update([
            h.key("u"): TokenFilePlan(settings: TokenFileSettings(path: second, onDisk: true)),
            h.key("v"): TokenFilePlan(settings: TokenFileSettings(path: path, onDisk: true)),
        ])
        #expect(settled(files, path) == other.tokens.accessToken.revealed)
        #expect(settled(files, second) == token)
    }
}
