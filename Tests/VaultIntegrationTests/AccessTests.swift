import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// Real local users for the access tests, created once (idempotently):
/// vaultd-test-a, and vaultd-test-b in the group vaultd-test-admins.
enum TestUsers {
    static let a = "vaultd-test-a"
    static let b = "vaultd-test-b"
    static let admins = "vaultd-test-admins"

    /// Held while `ensure()` runs: suites beside each other call it at once,
    /// and a second useradd or usermod while one holds /etc/passwd's lock
    /// fails ("cannot lock /etc/passwd; try again later") before the first
    /// one's user exists.
    private static let creating = NSLock()

    /// Creates the users and the group when missing; throws with the output when that fails.
    static func ensure() throws {
        creating.lock()
        defer { creating.unlock() }
        func run(_ tool: String, _ arguments: [String]) throws -> CommandResult {
            try runCommand(URL(fileURLWithPath: tool), arguments)
        }
        func exists(_ database: String, _ name: String) throws -> Bool {
            try run("/usr/bin/getent", [database, name]).status == 0
        }
        if try !exists("group", admins) {
            let r = try run("/usr/sbin/groupadd", ["--system", admins])
            // A parallel creator may have won: then it exists.
            guard try r.status == 0 || exists("group", admins) else { throw HarnessError("groupadd: \(r.stderr)") }
        }
        for name in [a, b] {
            if try exists("passwd", name) { continue }
            let r = try run(
                "/usr/sbin/useradd", ["--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name])
            guard try r.status == 0 || exists("passwd", name) else { throw HarnessError("useradd: \(r.stderr)") }
        }
        let groups = try run("/usr/bin/id", ["-nG", b]).stdout.split(separator: " ").map {
            $0.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        if !groups.contains(admins) {
            let r = try run("/usr/sbin/usermod", ["-aG", admins, b])
            guard r.status == 0 else { throw HarnessError("usermod: \(r.stderr)") }
        }
    }

    static func uid(_ name: String) -> uid_t? { getpwnam(name).map { $0.pointee.pw_uid } }
    static func gid(_ name: String) -> gid_t? { getpwnam(name).map { $0.pointee.pw_gid } }
}

/// Sends `calls` (method names of io.vaultd.Vault and their parameters) over
/// one connection as the local user `name` (Tests/python/varlink_calls.py):
/// each reply, with its error or its parameters.
func varlinkCalls(as name: String, _ socket: String, _ calls: [(String, JSON)]) throws -> [JSON] {
    guard let uid = TestUsers.uid(name), let gid = TestUsers.gid(name) else { throw HarnessError("no \(name)") }
    let script = Binaries.packageRoot.appendingPathComponent("Tests/python/varlink_calls.py").path
    let input = calls.map { method, parameters in
        JSON.object(["method": .string("io.vaultd.Vault.\(method)"), "parameters": parameters]).text
    }.joined(separator: "\n")
    let r = try runCommand(
        URL(fileURLWithPath: "/usr/bin/setpriv"),
        ["--reuid=\(uid)", "--regid=\(gid)", "--init-groups", "/usr/bin/python3", script, socket], input: input)
    guard r.status == 0 else { throw HarnessError("varlink_calls.py: \(r.stderr)") }
    return try r.stdout.split(separator: "\n").map { try JSON.parse(String($0))["reply"] ?? .null }
}

/// Runs vaultctl against `socket` as the local user `name` (setpriv, with its groups).
func vaultctl(as name: String, _ socket: String, _ arguments: [String], input: String? = nil) throws -> CommandResult {
    guard let uid = TestUsers.uid(name), let gid = TestUsers.gid(name) else { throw HarnessError("no user \(name)") }
    return try runCommand(
        URL(fileURLWithPath: "/usr/bin/setpriv"),
        ["--reuid=\(uid)", "--regid=\(gid)", "--init-groups", Binaries.vaultctl.path, "--socket", socket] + arguments,
        input: input)
}

/// One `audit` line of vaultd's log, split into its fields.
struct AuditLine {
    var text: String
    var keys: [String]
    var fields: [String: String]

    init?(_ line: Substring) {
        guard let range = line.range(of: "vaultd: notice: audit ") else { return nil }
        text = String(line)
        keys = []
        fields = [:]
        for pair in line[range.upperBound...].split(separator: " ") {
            guard let eq = pair.firstIndex(of: "=") else { continue }
            let key = String(pair[..<eq])
            keys.append(key)
            fields[key] = String(pair[pair.index(after: eq)...])
        }
    }

    static func all(in output: String) -> [AuditLine] {
        output.split(separator: "\n").compactMap { AuditLine($0) }
    }
}

/// Per-uid access to sessions (SO_PEERCRED), the admin group, the per-account
/// token allow list and the audit trail, with real second and third users.
@Suite(
    "Access control between local users", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root to create users"))
struct AccessTests {
    static let token = "tok_access_p0o9i8u7y6t5r4e3w2q1"
    static let open = "[Vault]\nSocketMode=0666\n\n[Provider demo]\nType=static\n"

    init() throws { try TestUsers.ensure() }

    func loginAsRoot(_ d: ConfiguredDaemon, _ user: String) throws {
        try expectSuccess(vaultctl(d.socketPath, ["login", "demo", user], input: AccessTests.token))
    }

    @Test("Should keep the socket 0600 unless SocketMode says 0666")
    func socketMode() throws {
        let closed = try ConfiguredDaemon(config: "[Provider demo]\nType=static\n")
        var st = stat()
        #expect(stat(closed.socketPath, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o600)
        let denied = try vaultctl(as: TestUsers.a, closed.socketPath, ["list"])
        #expect(denied.status == 3, "\(denied.stderr)")

        let open = try ConfiguredDaemon(config: AccessTests.open)
        #expect(stat(open.socketPath, &st) == 0)
        #expect(st.st_mode & 0o777 == 0o666)
        try expectSuccess(vaultctl(as: TestUsers.a, open.socketPath, ["list"]))
    }

    @Test("Should not show or hand out root's session to another uid: its own is meant, root's is AccessDenied")
    func otherUidIsDenied() throws {
        let d = try ConfiguredDaemon(config: AccessTests.open)
        let user = uniqueName("root")
        try loginAsRoot(d, user)

        let list = try expectSuccess(vaultctl(as: TestUsers.a, d.socketPath, ["--json", "list"]))
        let sessions = try JSON.parse(list.stdout)["sessions"]?.arrayValue ?? []
        #expect(!sessions.contains { $0["user"]?.stringValue == user }, "\(list.stdout)")
        for arguments in [
            ["status", "demo", user], ["token", "demo", user], ["logout", "demo", user], ["kick", "demo", user],
            ["refresh", "demo", user],
        ] {
            // Without --owner a call means the caller's own session, which does not exist.
            let own = try vaultctl(as: TestUsers.a, d.socketPath, arguments)
            #expect(own.status == 1, "\(arguments): \(own.stdout) \(own.stderr)")
            #expect(own.stderr.contains("ERR_NOT_LOGGED_IN"), "\(arguments): \(own.stderr)")
            // Naming root's session is refused.
            let r = try vaultctl(as: TestUsers.a, d.socketPath, ["--owner", "0"] + arguments)
            #expect(r.status == 1, "\(arguments): \(r.stdout) \(r.stderr)")
            #expect(r.stderr.contains("ERR_ACCESS_DENIED"), "\(arguments): \(r.stderr)")
            #expect(!r.stdout.contains(AccessTests.token))
        }
        // The same over the protocol: the error's name and code.
        let raw = try runCommand(
            URL(fileURLWithPath: "/usr/bin/setpriv"),
            [
                "--reuid=\(TestUsers.uid(TestUsers.a)!)", "--regid=\(TestUsers.gid(TestUsers.a)!)", "--init-groups",
                Binaries.vaultctl.path, "--json", "--socket", d.socketPath, "--owner", "0", "token", "demo", user,
            ])
        let error = try JSON.parse(raw.stderr.trimmingCharacters(in: .whitespacesAndNewlines))
        #expect(error["error"]?.stringValue == "io.vaultd.Vault.AccessDenied", "\(raw.stderr)")
        #expect(error["code"]?.stringValue == "ERR_ACCESS_DENIED")

        // Still there and untouched for root.
        let token = try vaultctl(d.socketPath, ["token", "demo", user])
        #expect(token.stdout == AccessTests.token + "\n")
        #expect(try vaultctl(d.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should refuse a user other than root a subscription past 64, and take one again once one closed")
    func subscriptionsPerUser() throws {
        let d = try ConfiguredDaemon(config: AccessTests.open)
        // As another uid: open 65 subscriptions, report the answer of each, close
        // one, and subscribe once more.
        let script = d.directory.path("subscribe.py")
        try #"""
        import json, socket, sys
        def subscribe():
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(10)
            s.connect(sys.argv[1])
            s.sendall(b'{"method":"io.vaultd.Vault.Subscribe","more":true,"parameters":{}}\0')
            buf = b""
            while not buf.endswith(b"\0"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            return s, json.loads(buf[:-1]) if buf else {}
        held, answers = [], []
        for _ in range(65):
            s, reply = subscribe()
            held.append(s)
            answers.append(reply.get("error", "ok"))
        held[0].close()
        again = "unknown"
        for _ in range(50):
            s, reply = subscribe()
            again = reply.get("error", "ok")
            if again == "ok":
                break
        print(json.dumps({"answers": answers, "again": again}))
        """#.write(toFile: script, atomically: true, encoding: .utf8)
        let result = try runCommand(
            URL(fileURLWithPath: "/usr/bin/setpriv"),
            [
                "--reuid=\(TestUsers.uid(TestUsers.a)!)", "--regid=\(TestUsers.gid(TestUsers.a)!)", "--init-groups",
                "/usr/bin/python3", script, d.socketPath,
            ])
        let report = try JSON.parse(result.stdout.trimmingCharacters(in: .whitespacesAndNewlines))
        let answers = report["answers"]?.arrayValue?.compactMap(\.stringValue) ?? []
        #expect(answers.count == 65, "\(result.stdout) \(result.stderr)")
        #expect(answers.prefix(64).allSatisfy { $0 == "ok" })
        #expect(answers.last == "io.vaultd.Vault.TooManySubscriptions")
        #expect(report["again"]?.stringValue == "ok", "a closed subscription frees its place")
    }

    @Test("Should stream to another uid only the events of its own sessions")
    func otherUidSubscribeSeesOnlyItsOwn() throws {
        let d = try ConfiguredDaemon(config: AccessTests.open)
        let rootUser = uniqueName("rootev")
        let mine = uniqueName("aev")
        try loginAsRoot(d, rootUser)

        let uid = TestUsers.uid(TestUsers.a)!
        let gid = TestUsers.gid(TestUsers.a)!
        let (watch, lines, errors) = try startInterruptible(
            "/usr/bin/setpriv",
            [
                "--reuid=\(uid)", "--regid=\(gid)", "--init-groups", Binaries.vaultctl.path, "--socket", d.socketPath,
                "--json", "watch",
            ])
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        #expect(lines.wait(for: "{\"sessions\":"), "\(lines.text) \(errors.text)")

        // Root's changes first, then one of the watcher's own: only that one arrives.
        #expect(try vaultctl(d.socketPath, ["kick", "demo", rootUser]).status == 0)
        try loginAsRoot(d, rootUser)
        try expectSuccess(vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", mine], input: AccessTests.token))
        #expect(lines.wait(for: mine), "\(lines.text) \(errors.text)")
        #expect(
            !lines.text.contains(rootUser), "root's session is neither in the snapshot nor in events: \(lines.text)")
        kill(watch.processIdentifier, SIGINT)
        #expect(lines.waitForEnd(seconds: 10))
        _ = try reap(watch)

        #expect(try vaultctl(as: TestUsers.a, d.socketPath, ["logout", "demo", mine]).status == 0)
        #expect(try vaultctl(d.socketPath, ["logout", "demo", rootUser]).status == 0)
    }

    @Test("Should let a uid see and read its own session, and root see every session with its owner")
    func ownSessionsAndRootSeesAll() async throws {
        let d = try ConfiguredDaemon(config: AccessTests.open)
        let rootUser = uniqueName("root")
        let mine = uniqueName("own")
        let uidA = TestUsers.uid(TestUsers.a)!
        try loginAsRoot(d, rootUser)
        try expectSuccess(vaultctl(as: TestUsers.a, d.socketPath, ["login", "demo", mine], input: AccessTests.token))

        let list = try vaultctl(as: TestUsers.a, d.socketPath, ["--json", "list"])
        let listed = try JSON.parse(list.stdout)["sessions"]?.arrayValue ?? []
        #expect(listed.contains { $0["user"]?.stringValue == mine && $0["ownerUid"]?.integerValue == Int64(uidA) })
        #expect(!listed.contains { $0["user"]?.stringValue == rootUser })
        #expect(try vaultctl(as: TestUsers.a, d.socketPath, ["status", "demo", mine]).status == 0)
        let token = try vaultctl(as: TestUsers.a, d.socketPath, ["token", "demo", mine])
        #expect(token.stdout == AccessTests.token + "\n", "\(token.stderr)")

        let all = try vaultctl(d.socketPath, ["--json", "list"])
        let everything = try JSON.parse(all.stdout)["sessions"]?.arrayValue ?? []
        #expect(everything.contains { $0["user"]?.stringValue == mine && $0["ownerUid"]?.integerValue == Int64(uidA) })
        #expect(everything.contains { $0["user"]?.stringValue == rootUser && $0["ownerUid"]?.integerValue == 0 })
        // The owner is what the store says too (and the keyring item's attribute).
        #expect(try await d.store.records(provider: "demo", user: mine).map(\.ownerUID) == [uidA])
        if TestStore.engine == .secretService {
            #expect(try secretToolSearch(provider: "demo", user: mine).contains("owner_uid = \(uidA)"))
        }

        #expect(try vaultctl(as: TestUsers.a, d.socketPath, ["logout", "demo", mine]).status == 0)
        #expect(try vaultctl(d.socketPath, ["logout", "demo", rootUser]).status == 0)
    }

    @Test(
        "Should refuse another uid's GetToken, sent again on one connection, once a reload takes it off the allow list")
    func repeatedReadAfterReloadAsOtherUid() throws {
        let user = uniqueName("rereload")
        let allowed = AccessTests.open + "\n[Account demo \(user)]\nTokenReadUsers=\(TestUsers.a)\n"
        let d = try ConfiguredDaemon(config: allowed)
        try loginAsRoot(d, user)
        // As vaultd-test-a: the same GetToken bytes twice on one connection, then
        // (once the test writes to the FIFO, after the reload) once more.
        let fifo = d.directory.path("go")
        #expect(mkfifo(fifo, 0o666) == 0)
        chmod(fifo, 0o666)
        let script = d.directory.path("repeat.py")
        try #"""
        import socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(sys.argv[1])
        call = b'{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"%s","ownerUid":0}}\0' % sys.argv[3].encode()
        def ask():
            s.sendall(call)
            buf = b""
            while not buf.endswith(b"\0"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
            print(buf[:-1].decode(), flush=True)
        ask()
        ask()
        print("asked", flush=True)
        with open(sys.argv[2]) as go:
            go.read(1)
        ask()
        """#.write(toFile: script, atomically: true, encoding: .utf8)
        let (reader, lines, errors) = try startInterruptible(
            "/usr/bin/setpriv",
            [
                "--reuid=\(TestUsers.uid(TestUsers.a)!)", "--regid=\(TestUsers.gid(TestUsers.a)!)", "--init-groups",
                "/usr/bin/python3", script, d.socketPath, fifo, user,
            ])
        defer { if reader.isRunning { kill(reader.processIdentifier, SIGKILL) } }
        #expect(lines.wait(for: "asked"), "\(lines.text) \(errors.text)")
        #expect(
            lines.text.components(separatedBy: AccessTests.token).count == 3,
            "both calls before the reload are answered with the token: \(lines.text)")

        try AccessTests.open.appending("\n[Account demo \(user)]\n").write(
            toFile: d.configPath, atomically: true, encoding: .utf8)
        kill(d.daemon.process.processIdentifier, SIGHUP)
        #expect(d.daemon.output.wait(for: "configuration reloaded"))
        // Non-blocking, and tried a bounded number of times: a reader that
        // died before opening its end must fail the test, not hang it.
        var go: Int32 = -1
        for _ in 0..<200 where go < 0 {
            go = Glibc.open(fifo, O_WRONLY | O_NONBLOCK)
            if go < 0 { usleep(50_000) }
        }
        #expect(go >= 0, "the reader never opened its end: \(lines.text) \(errors.text)")
        _ = Glibc.write(go, "g", 1)
        Glibc.close(go)
        #expect(lines.waitForEnd(seconds: 30), "\(lines.text) \(errors.text)")
        _ = try reap(reader)
        let answers = lines.text.split(separator: "\n").filter { $0 != "asked" }
        #expect(answers.count == 3, "\(lines.text) \(errors.text)")
        #expect(answers.last?.contains("io.vaultd.Vault.AccessDenied") == true, "\(lines.text)")
        #expect(answers.last?.contains(AccessTests.token) == false, "\(lines.text)")
        #expect(try vaultctl(d.socketPath, ["logout", "demo", user]).status == 0)
    }

    @Test("Should grant a token exactly to the users and groups an account's allow list names")
    func allowListGrantsExactlyWhatItNames() throws {
        let byUser = uniqueName("allow")
        let byGroup = uniqueName("grp")
        let unlisted = uniqueName("deny")
        let config =
            AccessTests.open + "\n[Account demo \(byUser)]\nTokenReadUsers=\(TestUsers.a)\n"
            + "\n[Account demo \(byGroup)]\nTokenReadGroups=\(TestUsers.admins)\n"
        let d = try ConfiguredDaemon(config: config)
        for user in [byUser, byGroup, unlisted] { try loginAsRoot(d, user) }

        let granted = try expectSuccess(vaultctl(as: TestUsers.a, d.socketPath, ["token", "demo", byUser]))
        #expect(granted.stdout == AccessTests.token + "\n")
        for (name, user) in [
            (TestUsers.a, unlisted), (TestUsers.a, byGroup), (TestUsers.b, byUser), (TestUsers.b, unlisted),
        ] {
            // The declared accounts are root's (vaultd's uid) without --owner; unlisted must be named.
            let r = try vaultctl(as: name, d.socketPath, ["--owner", "0", "token", "demo", user])
            #expect(r.status == 1, "\(name) \(user): \(r.stdout)")
            #expect(r.stderr.contains("ERR_ACCESS_DENIED"), "\(name) \(user): \(r.stderr)")
        }
        let group = try expectSuccess(vaultctl(as: TestUsers.b, d.socketPath, ["token", "demo", byGroup]))
        #expect(group.stdout == AccessTests.token + "\n")
        // Reading the token is all it grants: no logout, no kick.
        for arguments in [["logout", "demo", byUser], ["kick", "demo", byUser]] {
            let r = try vaultctl(as: TestUsers.a, d.socketPath, arguments)
            #expect(r.status == 1 && r.stderr.contains("ERR_ACCESS_DENIED"), "\(arguments): \(r.stderr)")
        }
        for user in [byUser, byGroup, unlisted] {
            #expect(try vaultctl(d.socketPath, ["logout", "demo", user]).status == 0)
        }
    }

    @Test("Should let an AdminGroup member list every session and kick one, but not read its token")
    func adminGroup() async throws {
        let d = try ConfiguredDaemon(
            config: "[Vault]\nSocketMode=0666\nAdminGroup=\(TestUsers.admins)\n\n[Provider demo]\nType=static\n")
        let user = uniqueName("adm")
        try loginAsRoot(d, user)

        let list = try expectSuccess(vaultctl(as: TestUsers.b, d.socketPath, ["--json", "list"]))
        let sessions = try JSON.parse(list.stdout)["sessions"]?.arrayValue ?? []
        #expect(sessions.contains { $0["user"]?.stringValue == user }, "\(list.stdout)")
        #expect(!list.stdout.contains(AccessTests.token))

        try expectFailure(
            vaultctl(as: TestUsers.b, d.socketPath, ["--owner", "0", "token", "demo", user]),
            saying: "ERR_ACCESS_DENIED")
        // Not a member: no kick.
        try expectFailure(
            vaultctl(as: TestUsers.a, d.socketPath, ["--owner", "0", "kick", "demo", user]), saying: "ERR_ACCESS_DENIED"
        )

        try expectSuccess(vaultctl(as: TestUsers.b, d.socketPath, ["kick", "demo", user, "--reason", "admin"]))
        try expectFailure(vaultctl(d.socketPath, ["token", "demo", user]), saying: "ERR_NOT_LOGGED_IN")
        #expect(try await d.store.holds(provider: "demo", user: user) == false)
    }

    @Test("Should write one audit line per login, token handout, denial, logout and kick, without the token")
    func auditTrail() throws {
        let d = try ConfiguredDaemon(
            config: "[Vault]\nSocketMode=0666\nAdminGroup=\(TestUsers.admins)\n\n[Provider demo]\nType=static\n")
        let user = uniqueName("audit")
        let kicked = uniqueName("auditk")
        let uidA = String(TestUsers.uid(TestUsers.a)!)
        let uidB = String(TestUsers.uid(TestUsers.b)!)
        try loginAsRoot(d, user)
        #expect(try vaultctl(d.socketPath, ["token", "demo", user]).status == 0)
        #expect(try vaultctl(as: TestUsers.a, d.socketPath, ["--owner", "0", "token", "demo", user]).status == 1)
        #expect(try vaultctl(d.socketPath, ["logout", "demo", user]).status == 0)
        try loginAsRoot(d, kicked)
        #expect(try vaultctl(as: TestUsers.b, d.socketPath, ["kick", "demo", kicked]).status == 0)
        // Stopping flushes everything vaultd wrote.
        #expect(d.daemon.stop() == 0)
        let output = d.daemon.allOutput
        #expect(!output.contains(AccessTests.token), "no token in vaultd's output")

        let lines = AuditLine.all(in: output)
        let exe = Binaries.vaultctl.resolvingSymlinksInPath().path
        func find(_ action: String, _ account: String, uid: String, result: String) -> AuditLine? {
            lines.first {
                $0.fields["action"] == action && $0.fields["user"] == account && $0.fields["uid"] == uid
                    && $0.fields["result"] == result
            }
        }
        let expected: [(String, String, String, String)] = [
            ("Login", user, "0", "ok"),
            ("GetToken", user, "0", "ok"),
            ("GetToken", user, uidA, "ERR_ACCESS_DENIED"),
            ("Logout", user, "0", "ok"),
            ("Login", kicked, "0", "ok"),
            ("ForceLogout", kicked, uidB, "ok"),
        ]
        for (action, account, uid, result) in expected {
            let line = find(action, account, uid: uid, result: result)
            #expect(
                line != nil,
                "no audit line action=\(action) user=\(account) uid=\(uid) result=\(result) in:\n\(lines.map(\.text).joined(separator: "\n"))"
            )
            guard let line else { continue }
            #expect(line.fields["provider"] == "demo")
            #expect(line.fields["exe"] == exe, "\(line.text)")
            #expect(Int(line.fields["pid"] ?? "") ?? 0 > 0, "\(line.text)")
            #expect(line.keys == line.keys.sorted(), "fields sorted by key: \(line.text)")
        }
        // One line each: the token was handed out once to root.
        #expect(lines.filter { $0.fields["action"] == "GetToken" && $0.fields["user"] == user }.count == 2)
    }
}
