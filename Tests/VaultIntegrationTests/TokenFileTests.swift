import Foundation
import Glibc
import Synchronization
import Testing
import VaultCore
import VaultSystem

/// True when `path` is on tmpfs or ramfs.
private func inMemory(_ path: String) -> Bool {
    (try? Directory(path).isInMemory()) ?? false
}

/// Where the token files of these tests go: `$XDG_RUNTIME_DIR` or
/// `/dev/shm`, whichever is a memory file system (nil: none is).
let memoryParent: String? = {
    let candidates = [ProcessInfo.processInfo.environment["XDG_RUNTIME_DIR"], "/dev/shm"].compactMap { $0 }
    return candidates.first { !$0.isEmpty && inMemory($0) && access($0, W_OK) == 0 }
}()

/// A private directory (0700) for one test's token files (here and in SessionSinkTests), removed at the end.
final class TokenDirectory {
    let path: String

    init() throws {
        path = memoryParent! + "/vaultd-test-\(UUID().uuidString.prefix(8))"
        guard mkdir(path, 0o700) == 0 else { throw HarnessError("mkdir \(path): errno \(errno)") }
    }

    func file(_ name: String) -> String { path + "/" + name }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// The content of `path`, nil while it does not exist.
func content(_ path: String) -> String? { try? String(contentsOfFile: path, encoding: .utf8) }

/// The status of `path`, nil while it does not exist.
private func status(_ path: String) -> stat? {
    var st = stat()
    return lstat(path, &st) == 0 ? st : nil
}

/// Reads a file over and over on a thread of its own, bounded in count and
/// time, and keeps every distinct content it saw, and how often the file
/// was missing or empty: what a program polling a token file would see.
private final class PollingReader: @unchecked Sendable {
    private struct Seen {
        var values: Set<String> = []
        var reads = 0
        var missing = 0
        var empty = 0
        var done = false
    }
    private let seen = Mutex(Seen())
    private let stopFlag = Atomic<Bool>(false)

    init(_ path: String, maximumReads: Int = 2_000_000, seconds: Double = 120) {
        Thread.detachNewThread { [self] in
            let deadline = Date().addingTimeInterval(seconds)
            var buffer = [UInt8](repeating: 0, count: 4096)
            for index in 0..<maximumReads {
                if stopFlag.load(ordering: .relaxed) || (index % 256 == 0 && Date() > deadline) { break }
                let fd = open(path, O_RDONLY | O_CLOEXEC)
                guard fd >= 0 else {
                    seen.withLock { $0.missing += 1 }
                    continue
                }
                var bytes: [UInt8] = []
                while true {
                    let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                    if n <= 0 { break }
                    bytes += buffer[0..<n]
                }
                close(fd)
                let text = String(decoding: bytes, as: UTF8.self)
                seen.withLock {
                    $0.reads += 1
                    if text.isEmpty { $0.empty += 1 } else { $0.values.insert(text) }
                }
            }
            seen.withLock { $0.done = true }
        }
    }

    /// Stops the reader and waits (bounded) for it; returns what it saw.
    func stop() async throws -> (values: Set<String>, reads: Int, missing: Int, empty: Int) {
        stopFlag.store(true, ordering: .relaxed)
        _ = try await eventually({ self.seen.withLock { $0.done } }, until: { $0 })
        return seen.withLock { ($0.values, $0.reads, $0.missing, $0.empty) }
    }
}

/// `[Account PROVIDER USER] TokenFile=` against the real daemon, keyring and
/// token server: the file follows the session (login, refresh, logout,
/// kick, a refused refresh, expiry, restart, reload), is replaced
/// atomically, and the configuration check refuses a disk path.
@Suite("Token files", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct TokenFileTests {
    /// A daemon with the oauth2 provider `oauth` at `server`, the static
    /// provider `demo`, and `accounts` (account header → extra lines).
    func start(_ server: TokenServer, _ accounts: [(String, String)]) throws -> DaemonFixture {
        let fixture = try DaemonFixture(oauthServer: server)
        var text = try String(contentsOfFile: fixture.configPath, encoding: .utf8)
        text += "\n\n[Provider demo]\nType=static\n"
        for (header, lines) in accounts { text += "\n[Account \(header)]\n\(lines)\n" }
        try fixture.configure(text)
        try fixture.start()
        return fixture
    }

    /// Waits (bounded) until the file at `path` holds `expected` (nil: is gone).
    func fileBecomes(_ path: String, _ expected: String?) async throws -> String? {
        try await eventually({ content(path) }, until: { $0 == expected })
    }

    /// Should write the token with mode 0600 at login, replace it atomically
    /// on every refresh and on a replacement (a reader polling all along never
    /// sees it missing, empty or partial), and remove it at logout and at a kick.
    @Test(.enabled(if: memoryParent != nil, "no tmpfs at $XDG_RUNTIME_DIR or /dev/shm"))
    func followsTheSession() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let directory = try TokenDirectory()
        let user = uniqueName("tokenfile")
        let path = directory.file("\(user).token")
        let fixture = try start(server, [("oauth \(user)", "TokenFile=\(path)")])
        #expect(content(path) == nil)

        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        var expected = try fixture.token("oauth", user)
        #expect(!expected.isEmpty)
        #expect(try await fileBecomes(path, expected) == expected, "\(fixture.daemon!.output.text)")
        let st = try #require(status(path))
        #expect(st.st_mode & 0o7777 == 0o600 && st.st_mode & S_IFMT == S_IFREG)
        #expect(st.st_uid == getuid())

        let reader = PollingReader(path)
        var issued: Set<String> = [expected]
        for _ in 0..<15 {
            #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
            let next = try fixture.token("oauth", user)
            #expect(next != expected, "the refresh gave a new token")
            expected = next
            issued.insert(next)
            #expect(try await fileBecomes(path, expected) == expected)
        }
        // A replacement by hand (login --replace) is a change like a refresh.
        try expectSuccess(
            vaultctl(fixture.socketPath, ["login", "--replace", "oauth", user], input: try await server.grant()))
        let replaced = try fixture.token("oauth", user)
        #expect(replaced != expected)
        issued.insert(replaced)
        expected = replaced
        #expect(try await fileBecomes(path, expected) == expected, "written after a replacement")
        let seen = try await reader.stop()
        #expect(seen.reads > 100, "the reader read the file \(seen.reads) times")
        #expect(seen.missing == 0 && seen.empty == 0, "missing \(seen.missing)×, empty \(seen.empty)×")
        #expect(seen.values.isSubset(of: issued), "every content read is a whole token vaultd served")
        #expect(seen.values.count > 1, "the reader saw the file change")
        #expect(status(path).map { $0.st_mode & 0o7777 } == 0o600)
        let leftovers = try FileManager.default.contentsOfDirectory(atPath: directory.path)
        #expect(leftovers == ["\(user).token"], "no temporary file is left: \(leftovers)")

        #expect(try vaultctl(fixture.socketPath, ["logout", "oauth", user]).status == 0)
        #expect(try await fileBecomes(path, nil) == nil, "removed at logout")

        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let again = try fixture.token("oauth", user)
        #expect(try await fileBecomes(path, again) == again)
        #expect(try vaultctl(fixture.socketPath, ["kick", "oauth", user]).status == 0)
        #expect(try await fileBecomes(path, nil) == nil, "removed at a kick")
        #expect(!fixture.daemon!.output.text.contains(again), "the token is never logged")
    }

    /// Should remove the file when a refresh is refused (tokenInvalid) and
    /// when a static token expires (tokenExpired).
    @Test(.enabled(if: memoryParent != nil, "no tmpfs at $XDG_RUNTIME_DIR or /dev/shm"))
    func removedWhenTheTokenEnds() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let directory = try TokenDirectory()
        let user = uniqueName("tokenfile")
        let refused = directory.file("refused.token")
        let expiring = directory.file("expiring.token")
        let fixture = try start(
            server, [("oauth \(user)", "TokenFile=\(refused)"), ("demo \(user)", "TokenFile=\(expiring)")])
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let expiresAt = Int(Date().timeIntervalSince1970) + 3
        #expect(
            try vaultctl(
                fixture.socketPath, ["login", "demo", user, "--expires-at", String(expiresAt)],
                input: "static-\(UUID().uuidString)"
            ).status == 0)
        _ = try await eventually({ (content(refused), content(expiring)) }, until: { $0.0 != nil && $0.1 != nil })
        #expect(content(expiring)?.hasPrefix("static-") == true)

        try await server.post("/control/mode", json: ["mode": "invalid_grant", "count": 1])
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 1)
        #expect(try await fileBecomes(refused, nil) == nil, "removed at tokenInvalid")
        #expect(
            try await eventually(tries: 500, { content(expiring) }, until: { $0 == nil }) == nil,
            "removed at tokenExpired: \(fixture.daemon!.output.text)")
    }

    /// Should rewrite the file of a session already logged in when vaultd
    /// starts, remove a stale file of an account that has none, and move
    /// the file when a reload changes TokenFile=.
    @Test(.enabled(if: memoryParent != nil, "no tmpfs at $XDG_RUNTIME_DIR or /dev/shm"))
    func startAndReload() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let directory = try TokenDirectory()
        let user = uniqueName("tokenfile")
        let path = directory.file("live.token")
        let stale = directory.file("stale.token")
        let fixture = try start(
            server, [("oauth \(user)", "TokenFile=\(path)"), ("oauth nobody-\(user)", "TokenFile=\(stale)")])
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let live = try fixture.token("oauth", user)
        #expect(try await fileBecomes(path, live) == live)

        #expect(fixture.daemon!.stop() == 0)
        #expect(content(path) == live, "kept while vaultd is stopped: the session is still logged in")
        #expect(unlink(path) == 0)
        try "an old token".write(toFile: stale, atomically: false, encoding: .utf8)
        try fixture.start()
        #expect(try await fileBecomes(path, live) == live, "written at start for a session logged in")
        #expect(try await fileBecomes(stale, nil) == nil, "a file of an account without a session is removed")

        let moved = directory.file("moved.token")
        var text = try String(contentsOfFile: fixture.configPath, encoding: .utf8)
        text = text.replacingOccurrences(of: "TokenFile=\(path)", with: "TokenFile=\(moved)")
        try fixture.configure(text)
        kill(fixture.daemon!.process.processIdentifier, SIGHUP)
        _ = try await eventually({ (content(path), content(moved)) }, until: { $0.0 == nil && $0.1 == live })
        #expect(content(path) == nil && content(moved) == live, "\(fixture.daemon!.output.text)")
    }

    /// Should log a failed write without the token, serve the token all the
    /// same, and write the file at the session's next change.
    @Test(.enabled(if: memoryParent != nil, "no tmpfs at $XDG_RUNTIME_DIR or /dev/shm"))
    func failedWriteIsRetried() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let directory = try TokenDirectory()
        let user = uniqueName("tokenfile")
        let path = directory.file("t.token")
        let fixture = try start(server, [("oauth \(user)", "TokenFile=\(path)")])
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let first = try fixture.token("oauth", user)
        #expect(try await fileBecomes(path, first) == first)

        // A directory others may write is refused before each write, as at the check.
        #expect(chmod(directory.path, 0o777) == 0)
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let second = try fixture.token("oauth", user)
        let output = fixture.daemon!.output
        #expect(output.wait(for: "error: the token file could not be written"), "\(output.text)")
        #expect(content(path) == first, "the failed write left the old file as it was")
        #expect(!output.text.contains(second) && !output.text.contains(first), "no token in the log")

        #expect(chmod(directory.path, 0o700) == 0)
        #expect(try vaultctl(fixture.socketPath, ["refresh", "oauth", user]).status == 0)
        let third = try fixture.token("oauth", user)
        #expect(try await fileBecomes(path, third) == third, "written at the next change")
    }

    /// Should make a failed write an error the session's owner sees, a second
    /// real uid here: a tokenFileFailed event on the owner's own `vaultctl
    /// watch`, the session's `vaultctl status`, systemd's STATUS= and the log
    /// at error priority, none with the token; the status clears at the next
    /// write that succeeds.
    @Test(.enabled(if: memoryParent != nil && getuid() == 0, "needs root, a second user and a tmpfs"))
    func failedWriteReachesTheOwner() async throws {
        try TestUsers.ensure()
        let (uid, gid) = (try #require(TestUsers.uid(TestUsers.a)), try #require(TestUsers.gid(TestUsers.a)))
        let directory = try TokenDirectory()
        let user = uniqueName("tokenfile")
        let path = directory.file("t.token")
        let fixture = try DaemonFixture(start: false)
        #expect(chmod(fixture.directory.url.path, 0o755) == 0)
        try fixture.configure(
            """
            [Vault]
            SocketMode=0666

            [Provider demo]
            Type=static

            [Account demo \(user)]
            Owner=\(TestUsers.a)
            TokenFile=\(path)
            """)
        let notify = try NotifyListener(path: fixture.directory.path("notify"))
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath, environment: ["NOTIFY_SOCKET": notify.path])
        defer { daemon.stop() }
        func asOwner(_ arguments: [String], input: String? = nil) throws -> CommandResult {
            try vaultctl(as: TestUsers.a, fixture.socketPath, arguments, input: input)
        }
        let first = "tok_file_first_\(UUID().uuidString)"
        #expect(try asOwner(["login", "demo", user], input: first).status == 0)
        #expect(try await fileBecomes(path, first) == first)

        let (watch, lines, errors) = try startInterruptible(
            "/usr/bin/setpriv",
            [
                "--reuid=\(uid)", "--regid=\(gid)", "--init-groups", Binaries.vaultctl.path, "--socket",
                fixture.socketPath, "--json", "watch", "demo", user,
            ])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(lines.wait(for: "{\"sessions\":"), "\(lines.text) \(errors.text)")

        // A directory others may write: refused before the write, as at the check.
        #expect(chmod(directory.path, 0o777) == 0)
        let second = "tok_file_second_\(UUID().uuidString)"
        #expect(try asOwner(["login", "--replace", "demo", user], input: second).status == 0)
        #expect(lines.wait(for: "\"tokenFileFailed\""), "the owner's watch gets the event: \(lines.text)")
        #expect(
            lines.text.contains("could not be written")
                && lines.text.contains("\(directory.path) is writable by others"))
        #expect(daemon.output.wait(for: "error: the token file could not be written"), "\(daemon.output.text)")
        let status = try asOwner(["status", "demo", user])
        #expect(
            status.stdout.contains("Token file:") && status.stdout.contains("could not be written"), "\(status.stdout)")
        #expect(notify.wait(for: "1 token file failing") != nil, "STATUS=: \(notify.messages)")
        #expect(content(path) == first, "the failed write left the old file as it was")
        for text in [lines.text, daemon.output.text, status.stdout, notify.messages.joined()] {
            #expect(!text.contains(second) && !text.contains(first), "no token in what the owner sees")
        }

        #expect(chmod(directory.path, 0o700) == 0)
        let third = "tok_file_third_\(UUID().uuidString)"
        #expect(try asOwner(["login", "--replace", "demo", user], input: third).status == 0)
        #expect(try await fileBecomes(path, third) == third, "written at the next change")
        let cleared = try await eventually(
            tries: 100, { try asOwner(["status", "demo", user]).stdout }, until: { !$0.contains("Token file:") })
        #expect(!cleared.contains("Token file:") && cleared.contains("State:"), "\(cleared)")
        kill(watch.processIdentifier, SIGINT)
        #expect(lines.waitForEnd(seconds: 10))
        _ = try reap(watch)
    }

    /// Should give the file to TokenFileOwner= with TokenFileMode= when vaultd runs as root.
    @Test(.enabled(if: memoryParent != nil && getuid() == 0, "needs root and a tmpfs"))
    func ownerAndMode() async throws {
        let server = try TokenServer(["--lifetime", "3600"])
        let directory = try TokenDirectory()
        let user = uniqueName("tokenfile")
        let path = directory.file("t.token")
        let fixture = try start(
            server, [("oauth \(user)", "TokenFile=\(path)\nTokenFileOwner=65534\nTokenFileMode=0640")])
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "oauth", user], input: try await server.grant()))
        let live = try fixture.token("oauth", user)
        #expect(try await fileBecomes(path, live) == live)
        let st = try #require(status(path))
        #expect(st.st_uid == 65534 && st.st_mode & 0o7777 == 0o640)
    }

    /// Should leave no copy of the token in vaultd's memory once the session
    /// is logged out and its file removed: the write went from the session's
    /// wiped storage straight to the file.
    @Test(.enabled(if: memoryParent != nil && geteuid() == 0, "needs root (to read vaultd's memory) and a tmpfs"))
    func noCopyInMemoryAfterLogout() async throws {
        let directory = try TokenDirectory()
        let fixture = try DaemonFixture(start: false)
        let user = uniqueName("tokenfile")
        let path = directory.file("t.token")
        try fixture.configure("[Provider demo]\nType=static\n\n[Account demo \(user)]\nTokenFile=\(path)\n")
        let daemon = try fixture.start()
        let secret = MemoryWipeTests.randomToken("tokfile")
        #expect(try vaultctl(fixture.socketPath, ["login", "demo", user], input: secret).status == 0)
        #expect(try await fileBecomes(path, secret) == secret)
        let live = try ProcessMemory.find(Array(secret.utf8), in: daemon.process.processIdentifier)
        #expect(!live.isEmpty, "the scan finds the token of a live session")

        #expect(try vaultctl(fixture.socketPath, ["logout", "demo", user]).status == 0)
        #expect(try await fileBecomes(path, nil) == nil)
        let hits = try ProcessMemory.find(Array(secret.utf8), in: daemon.process.processIdentifier)
        #expect(hits.isEmpty, "\(hits.count) copies survive: \(hits.map(\.description).joined(separator: "\n"))")
    }

    /// Should refuse, at --check-config, a token file in /dev/shm (sticky and
    /// world-writable: another user could create the file first, and vaultd's
    /// rename could not replace it) and one reached through another user's
    /// symlink (they could point it elsewhere), and accept the same path
    /// through root's symlink.
    @Test(.enabled(if: getuid() == 0 && inMemory("/dev/shm"), "needs root, a second user and /dev/shm on tmpfs"))
    func checkConfigRefusesOthersDirectories() throws {
        try TestUsers.ensure()
        let uid = try #require(TestUsers.uid(TestUsers.a))
        let directory = try TemporaryDirectory()
        let config = directory.path("vaultd.conf")
        func check(_ tokenFile: String) throws -> CommandResult {
            return try checkConfigText(
                "[Provider demo]\nType=static\n\n[Account demo alice]\nTokenFile=\(tokenFile)\n", at: config)
        }
        let shared = try check("/dev/shm/\(uniqueName("alice")).token")
        #expect(shared.status == 1, "\(shared.stdout)")
        #expect(
            shared.stderr.contains("\(config):5: key 'TokenFile': /dev/shm is writable by others (mode 1777)"),
            "\(shared.stderr)")

        let tokens = try TokenDirectory()
        #expect(mkdir(tokens.file("real"), 0o700) == 0)
        #expect(symlink(tokens.file("real"), tokens.file("via")) == 0)
        #expect(lchown(tokens.file("via"), uid, TestUsers.gid(TestUsers.a)!) == 0)
        let theirs = try check(tokens.file("via/alice.token"))
        #expect(theirs.status == 1, "\(theirs.stdout)")
        #expect(
            theirs.stderr.contains("\(tokens.file("via")) is a symlink of uid \(uid), who could point it elsewhere"),
            "\(theirs.stderr)")
        #expect(lchown(tokens.file("via"), 0, 0) == 0)
        let roots = try check(tokens.file("via/alice.token"))
        #expect(roots.status == 0, "root's symlink is followed: \(roots.stderr)")
    }

    /// Should refuse a token file on a disk file system at --check-config,
    /// naming the file, the line and the key, and accept it with TokenFileOnDisk=yes.
    @Test(.enabled(if: !inMemory(NSTemporaryDirectory()), "the temporary directory is not on a disk file system"))
    func checkConfigRefusesDisk() throws {
        let directory = try TemporaryDirectory()
        let config = directory.path("vaultd.conf")
        let tokenPath = directory.path("alice.token")
        let refused = try checkConfigText(
            "[Provider demo]\nType=static\n\n[Account demo alice]\nTokenFile=\(tokenPath)\n", at: config)
        #expect(refused.status == 1, "\(refused.stdout)\(refused.stderr)")
        #expect(refused.stderr.contains("\(config):5: key 'TokenFile': \(directory.url.path) is on a disk file system"))
        #expect(refused.stderr.contains("TokenFileOnDisk=yes"), "\(refused.stderr)")

        try expectSuccess(
            checkConfigText(
                "[Provider demo]\nType=static\n\n[Account demo alice]\nTokenFile=\(tokenPath)\nTokenFileOnDisk=yes\n",
                at: config))
        #expect(status(tokenPath) == nil, "the check writes nothing")
    }
}
