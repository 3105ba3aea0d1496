import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// vaultd on a 0666 socket with the in-memory store and the given `[Vault]`
/// lines: what another uid can make of the serving limits.
final class LimitedDaemon {
    let directory: TemporaryDirectory
    let socketPath: String
    let daemon: RunningDaemon

    init(_ vault: String) throws {
        directory = try TemporaryDirectory()
        chmod(directory.url.path, 0o755)
        socketPath = directory.path("vaultd.sock")
        let configPath = directory.path("vaultd.conf")
        try ("[Vault]\nSocketMode=0666\n" + vault + "\n[Provider demo]\nType=static\n").write(
            toFile: configPath, atomically: true, encoding: .utf8)
        daemon = try RunningDaemon(socketPath: socketPath, configPath: configPath, extraArguments: ["--memory-store"])
    }

    func client() throws -> VarlinkClient { try VarlinkClient(path: socketPath, timeoutSeconds: 60) }

    /// Logs in `count` sessions `prefix-NNNN` as root, each with a status message of `padding` bytes.
    func login(_ prefix: String, count: Int, padding: Int = 0) throws {
        let c = try client()
        for i in 0..<count {
            let user = "\(prefix)-\(String(format: "%04d", i))"
            var profile: [String: JSON] = ["uid": .string(user)]
            if padding > 0 { profile["statusMessage"] = .string(String(repeating: "x", count: padding)) }
            let reply = try c.call(
                VaultMethod.login.rawValue,
                [
                    "provider": .string("demo"), "user": .string(user), "token": .string("tok_limits_\(i)"),
                    "profile": .object(profile),
                ])
            #expect(reply.error == nil, "\(reply)")
        }
    }

    /// vaultd's resident memory now, in KiB (VmRSS of /proc/PID/status).
    var residentKiB: Int {
        let status = (try? String(contentsOfFile: "/proc/\(daemon.process.processIdentifier)/status", encoding: .utf8))
        let line = status?.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
        return line.flatMap { Int($0.split(separator: " ").dropFirst().first ?? "") } ?? 0
    }

    deinit { daemon.stop() }
}

/// A local identity a forked helper takes before it connects.
struct Identity {
    var name: String
    var uid: UInt32
    var gid: UInt32
    var groups: [UInt32]

    static let root = Identity(name: "root", uid: 0, gid: 0, groups: [])
    /// A uid that is neither root nor in any group vaultd knows.
    static let nobody = Identity(name: "nobody", uid: 65534, gid: 65534, groups: [])

    static func testUser(_ name: String, groups: [String] = []) -> Identity {
        Identity(
            name: name, uid: TestUsers.uid(name)!, gid: TestUsers.gid(name)!,
            groups: groups.compactMap { getgrnam($0)?.pointee.gr_gid })
    }

    var json: JSON {
        .object([
            "name": .string(name), "uid": .int(Int64(uid)), "gid": .int(Int64(gid)),
            "groups": .array(groups.map { .int(Int64($0)) }),
        ])
    }
}

/// What `holdConnections` saw: each held connection's answer (the first
/// holder's, then each further holder's), and each probe's.
struct HoldReport {
    var held: [String]
    var moreHeld: [[String]]
    var probes: [String: String]
}

/// Forks a helper that becomes `holder`, opens `count` connections and asks
/// GetInfo on each (or, with `pipelined`, sends that many calls on each
/// without reading), then does the same for each of `more` in turn, keeps
/// them all open while each probe identity connects once and asks GetInfo,
/// then, after `whileHeld` ran, closes them. Every answer is "ok", a Varlink
/// error name, or "closed".
func holdConnections(
    _ socket: String, directory: TemporaryDirectory, holder: Identity, count: Int,
    more: [(holder: Identity, count: Int)] = [], probes: [Identity], pipelined: Int = 0,
    whileHeld: () throws -> Void = {}
) throws -> HoldReport {
    let script = directory.path("hold.py")
    try #"""
    import json, os, socket, sys
    path, spec = sys.argv[1], json.loads(sys.argv[2])
    # A group of its own, so that the test can end the holders with it.
    os.setpgid(0, 0)
    # The write ends that release earlier holders: a holder forked later must
    # not keep one, or that earlier holder would never see its release.
    releases = []

    def read_reply(s):
        buf = b""
        try:
            while not buf.endswith(b"\0"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        except OSError:
            pass
        return json.loads(buf[:-1]).get("error", "ok") if buf.endswith(b"\0") else "closed"

    def connect(pipelined):
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(path)
        if pipelined:
            calls = (b'{"method":"io.vaultd.Vault.ListSessions"}\0'
                     + b'{"method":"org.varlink.service.GetInfo"}\0') * (pipelined // 2)
            try:
                s.sendall(calls)
            except OSError:
                pass
            # The start of the first reply, left unread: the refusal (an error
            # name comes first in vaultd's replies), or the first ListSessions.
            try:
                first = s.recv(64, socket.MSG_PEEK)
                if not first:
                    answer = "closed"
                elif first.startswith(b'{"error":"'):
                    answer = first[len(b'{"error":"'):].split(b'"')[0].decode()
                else:
                    answer = "ok"
            except OSError:
                answer = "closed"
            return s, answer
        try:
            s.sendall(b'{"method":"org.varlink.service.GetInfo"}\0')
        except OSError:
            pass
        return s, read_reply(s)

    def run_as(who, count, pipelined, hold):
        report_r, report_w = os.pipe()
        release_r, release_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(report_r)
            os.close(release_w)
            for earlier in releases:
                os.close(earlier)
            os.setgroups(who["groups"])
            os.setresgid(who["gid"], who["gid"], who["gid"])
            os.setresuid(who["uid"], who["uid"], who["uid"])
            held = [connect(pipelined) for _ in range(count)]
            os.write(report_w, (json.dumps([a for _, a in held]) + "\n").encode())
            if hold:
                os.read(release_r, 1)
            os._exit(0)
        os.close(report_w)
        os.close(release_r)
        releases.append(release_w)
        data = b""
        while not data.endswith(b"\n"):
            chunk = os.read(report_r, 1 << 20)
            if not chunk:
                break
            data += chunk
        return pid, release_w, json.loads(data)

    holders = [(spec["holder"], spec["count"])] + [(h["holder"], h["count"]) for h in spec["more"]]
    runs = [run_as(who, count, spec["pipelined"], True) for who, count in holders]
    probes = {}
    for probe in spec["probes"]:
        probe_pid, _, answers = run_as(probe, 1, 0, False)
        os.waitpid(probe_pid, 0)
        probes[probe["name"]] = answers[0]
    print(json.dumps({"held": [held for _, _, held in runs], "probes": probes}), flush=True)
    sys.stdin.readline()
    for _, release, _ in runs:
        os.close(release)
    for pid, _, _ in runs:
        os.waitpid(pid, 0)
    """#.write(toFile: script, atomically: true, encoding: .utf8)
    let spec = JSON.object([
        "holder": holder.json, "count": .int(Int64(count)), "pipelined": .int(Int64(pipelined)),
        "more": .array(more.map { .object(["holder": $0.holder.json, "count": .int(Int64($0.count))]) }),
        "probes": .array(probes.map(\.json)),
    ])
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
    process.arguments = [script, socket, spec.text]
    let input = Pipe()
    let output = Pipe()
    let errors = Pipe()
    process.standardInput = input
    process.standardOutput = output
    // Not the test process's stderr: a holder left behind would keep swift
    // test from ever seeing that stream's end.
    process.standardError = errors
    let collector = OutputCollector(output)
    let errorText = OutputCollector(errors)
    try process.run()
    defer {
        try? input.fileHandleForWriting.close()
        if (try? reap(process)) == nil {
            // Whatever still holds on (hold.py and its holders) goes with its group.
            kill(-process.processIdentifier, SIGKILL)
            _ = try? reap(process)
            Issue.record("hold.py did not finish once released: \(errorText.text)")
        }
    }
    guard collector.wait(for: "\n", seconds: 60) else {
        throw HarnessError("hold.py: \(collector.text) \(errorText.text)")
    }
    let report = try JSON.parse(collector.text.trimmingCharacters(in: .whitespacesAndNewlines))
    try whileHeld()
    let held = (report["held"]?.arrayValue ?? []).map { $0.arrayValue?.compactMap(\.stringValue) ?? [] }
    return HoldReport(
        held: held.first ?? [], moreHeld: Array(held.dropFirst()),
        probes: report["probes"]?.objectValue?.compactMapValues(\.stringValue) ?? [:])
}

/// The limits of issue 10, each against a real vaultd with real other uids:
/// connections per uid and the reserve for root and admins, idle and request
/// timeouts, the output bound per connection, and ListSessions pages.
@Suite(
    "Serving limits per user", .ownThreads, .timeLimit(.minutes(5)), .serialized,
    .enabled(if: getuid() == 0, "needs root to switch uids"))
struct ServingLimitsIntegrationTests {
    static let tooMany = "io.vaultd.Vault.TooManyConnections"

    init() throws { try TestUsers.ensure() }

    @Test("Should refuse a uid its connection past MaxConnectionsPerUser, with a final error, and no one else")
    func perUserLimit() throws {
        let d = try LimitedDaemon("MaxConnectionsPerUser=16\n")
        let report = try holdConnections(
            d.socketPath, directory: d.directory, holder: .testUser(TestUsers.a), count: 17,
            probes: [.root, .testUser(TestUsers.b), .nobody],
            whileHeld: {
                // What vaultctl makes of the refusal: the error's code, exit status 1.
                let r = try vaultctl(as: TestUsers.a, d.socketPath, ["list"])
                #expect(r.status == 1, "\(r.stdout) \(r.stderr)")
                #expect(r.stderr.contains("ERR_TOO_MANY_CONNECTIONS"), "\(r.stderr)")
            })
        #expect(report.held.count == 17)
        #expect(report.held.prefix(16).allSatisfy { $0 == "ok" }, "\(report.held)")
        #expect(report.held.last == Self.tooMany, "\(report.held)")
        #expect(report.probes == ["root": "ok", TestUsers.b: "ok", "nobody": "ok"])
        // Once the holder is gone its places are free again (vaultd sees the
        // hang-ups soon after: a bounded retry).
        var again = try vaultctl(as: TestUsers.a, d.socketPath, ["list"])
        for _ in 0..<50 where again.status != 0 {
            var none = pollfd()
            _ = poll(&none, 0, 100)
            again = try vaultctl(as: TestUsers.a, d.socketPath, ["list"])
        }
        #expect(again.status == 0, "\(again.stderr)")
    }

    @Test("Should keep connections for root and the admin group when other users hold their whole share")
    func reserveForRootAndAdmins() throws {
        // 80 in all, 64 kept: the users outside root and the admin group share 16.
        let d = try LimitedDaemon("MaxConnections=80\nAdminGroup=\(TestUsers.admins)\n")
        let report = try holdConnections(
            d.socketPath, directory: d.directory, holder: .testUser(TestUsers.a), count: 17,
            probes: [.root, .testUser(TestUsers.b, groups: [TestUsers.admins]), .nobody])
        #expect(report.held.prefix(16).allSatisfy { $0 == "ok" }, "\(report.held)")
        #expect(report.held.last == Self.tooMany)
        #expect(report.probes["root"] == "ok")
        #expect(report.probes[TestUsers.b] == "ok", "an admin uses the reserve")
        #expect(report.probes["nobody"] == Self.tooMany, "the share of the others is used up")
    }

    @Test("Should keep root's own reserve when an admin holds every connection the others leave")
    func reserveForRootAlone() throws {
        // 128 in all, 64 kept from the users outside root and the admin group,
        // 16 of them for root alone: a (no admin) holds the others' share of
        // 64, b (an admin, 64 a user) asks for the rest.
        let d = try LimitedDaemon(
            "MaxConnections=128\nMaxConnectionsPerUser=64\nAdminGroup=\(TestUsers.admins)\n")
        let admin = Identity.testUser(TestUsers.b, groups: [TestUsers.admins])
        let report = try holdConnections(
            d.socketPath, directory: d.directory, holder: .testUser(TestUsers.a), count: 64,
            more: [(admin, 64)], probes: [.root, admin])
        #expect(report.held.count == 64 && report.held.allSatisfy { $0 == "ok" }, "\(report.held)")
        let adminHeld = report.moreHeld.first ?? []
        #expect(adminHeld.prefix(48).allSatisfy { $0 == "ok" } && adminHeld.count == 64, "\(adminHeld)")
        #expect(
            adminHeld.dropFirst(48).allSatisfy { $0 == Self.tooMany }, "root's 16 are not the admin's: \(adminHeld)")
        #expect(report.probes["root"] == "ok", "root connects while the admin holds every other place")
        #expect(report.probes[TestUsers.b] == Self.tooMany)
    }

    @Test("Should close an idle connection and a half-sent one after their timeouts, and keep a subscription")
    func timeouts() throws {
        let d = try LimitedDaemon("IdleTimeout=2s\nRequestTimeout=1s\n")
        let subscriber = try VarlinkClient.raw(d.socketPath)
        try subscriber.send(#"{"method":"io.vaultd.Vault.Subscribe","more":true,"parameters":{}}"#)
        #expect(try subscriber.nextReply()?.parameters["sessions"] != nil)
        let idle = try VarlinkClient.raw(d.socketPath)
        try idle.send(#"{"method":"org.varlink.service.GetInfo"}"#)
        #expect(try idle.nextReply()?.error == nil)
        let halfSent = try VarlinkClient.raw(d.socketPath)
        try halfSent.send(#"{"method":"org.varlink.service.GetInfo""#, terminated: false)
        // Sends a byte of its unfinished message every 200 ms: busy, but never done.
        let trickle = try VarlinkClient.raw(d.socketPath)
        try trickle.send(#"{"method":"org.varlink.service.GetInfo","parameters":{"#, terminated: false)

        let start = Date()
        var closedAt: [Int32: Double] = [:]
        let watched = [idle.fileDescriptor, halfSent.fileDescriptor, trickle.fileDescriptor]
        while closedAt.count < watched.count, Date().timeIntervalSince(start) < 15 {
            var fds = watched.filter { closedAt[$0] == nil }.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            _ = poll(&fds, nfds_t(fds.count), 200)
            for entry in fds where entry.revents != 0 {
                var byte: UInt8 = 0
                if recv(entry.fd, &byte, 1, Int32(MSG_DONTWAIT)) <= 0 {
                    closedAt[entry.fd] = Date().timeIntervalSince(start)
                }
            }
            if closedAt[trickle.fileDescriptor] == nil {
                _ = Glibc.send(trickle.fileDescriptor, " ", 1, Int32(MSG_NOSIGNAL))
            }
        }
        let idleClosed = try #require(closedAt[idle.fileDescriptor], "the idle connection stayed open")
        let halfClosed = try #require(closedAt[halfSent.fileDescriptor], "the half-sent connection stayed open")
        let trickleClosed = try #require(closedAt[trickle.fileDescriptor], "the trickling connection stayed open")
        #expect(idleClosed >= 1.5, "idle for 2 s")
        #expect(halfClosed >= 0.7 && halfClosed < idleClosed, "1 s to finish a message: \(halfClosed) \(idleClosed)")
        #expect(trickleClosed >= 0.7 && trickleClosed < idleClosed, "\(trickleClosed) \(idleClosed)")

        // The subscription is open and still gets events.
        var byte: UInt8 = 0
        #expect(recv(subscriber.fileDescriptor, &byte, 1, Int32(MSG_DONTWAIT) | Int32(MSG_PEEK)) < 0 && errno == EAGAIN)
        try d.login(uniqueName("timeouts"), count: 1)
        let event = try #require(try subscriber.nextReply())
        #expect(event.parameters["event"]?["kind"]?.stringValue == "loginSuccess", "\(event)")
        // Log lines go out through a writer queue: wait (bounded) for them.
        #expect(d.daemon.output.wait(for: "connection closed: idle past its timeout"))
        #expect(d.daemon.output.wait(for: "connection closed: unfinished message past its timeout"))
    }

    @Test("Should answer a reply past MaxOutputPerConnection with ReplyTooLarge, and a smaller page normally")
    func replyTooLarge() throws {
        let d = try LimitedDaemon("MaxOutputPerConnection=64K\n")
        try d.login("big", count: 40, padding: 2000)
        let c = try VarlinkClient.raw(d.socketPath)
        try c.send(#"{"method":"io.vaultd.Vault.ListSessions"}"#)
        let refused = try #require(try c.nextReply())
        #expect(refused.error == "io.vaultd.Vault.ReplyTooLarge")
        #expect(refused.parameters["code"]?.stringValue == "ERR_REPLY_TOO_LARGE")
        #expect(refused.parameters["message"]?.stringValue?.contains("a smaller limit") == true)
        try c.send(#"{"method":"io.vaultd.Vault.ListSessions","parameters":{"limit":10}}"#)
        let page = try #require(try c.nextReply())
        #expect(page.error == nil)
        #expect(page.parameters["sessions"]?.arrayValue?.count == 10)
        #expect(page.parameters["next"]?.stringValue != nil)
        // vaultctl asks for smaller pages and lists all 40.
        let list = try expectSuccess(vaultctl(d.socketPath, ["--json", "list"]))
        #expect(try JSON.parse(list.stdout)["sessions"]?.arrayValue?.count == 40)
    }

    @Test("Should keep vaultd's memory bounded while a uid pipelines calls on all its connections without reading")
    func memoryUnderPipelining() throws {
        let d = try LimitedDaemon("MaxConnectionsPerUser=32\nMaxOutputPerConnection=128K\n")
        // 100 sessions of about 1 KiB: each ListSessions reply is about 130 KB.
        try d.login("rss", count: 100, padding: 1000)
        let before = d.residentKiB
        var peak = before
        let report = try holdConnections(
            d.socketPath, directory: d.directory, holder: .testUser(TestUsers.a), count: 33, probes: [.root],
            pipelined: 400,
            whileHeld: {
                // Sample for 3 s while everything is held: a measurement, not a wait.
                for _ in 0..<30 {
                    peak = max(peak, d.residentKiB)
                    var none = pollfd()
                    _ = poll(&none, 0, 100)
                }
            })
        #expect(report.held.prefix(32).allSatisfy { $0 == "ok" }, "\(report.held)")
        #expect(report.held.last == Self.tooMany)
        #expect(report.probes["root"] == "ok", "vaultd still answers")
        // 32 connections × (128 KiB of output + 64 KiB of input) is 6 MiB; before
        // the bound, each could hold a 1 MiB high-water mark plus a whole reply.
        let grown = peak - before
        #expect(grown < 16 * 1024, "vaultd grew by \(grown) KiB, from \(before) KiB")
    }

    @Test("Should return every session exactly once across ListSessions pages, and vaultctl list all of them")
    func paging() throws {
        let d = try LimitedDaemon("")
        try d.login("page", count: 250)
        let c = try d.client()
        let first = try c.call(VaultMethod.listSessions.rawValue)
        #expect(first.parameters["sessions"]?.arrayValue?.count == 100, "the first page by default")
        #expect(first.parameters["next"]?.stringValue != nil)

        var seen: [String] = []
        var after: JSON = .null
        var pages = 0
        repeat {
            let reply = try c.call(VaultMethod.listSessions.rawValue, ["limit": .int(7), "after": after])
            #expect(reply.error == nil, "\(reply)")
            let sessions = reply.parameters["sessions"]?.arrayValue ?? []
            #expect(sessions.count <= 7)
            seen += sessions.compactMap { $0["user"]?.stringValue }
            after = reply.parameters["next"] ?? .null
            pages += 1
        } while after != .null && pages < 100
        #expect(pages == 36)
        #expect(seen.count == 250)
        #expect(seen == (0..<250).map { "page-\(String(format: "%04d", $0))" })

        let list = try vaultctl(d.socketPath, ["--json", "list"])
        #expect(try JSON.parse(list.stdout)["sessions"]?.arrayValue?.count == 250, "\(list.stderr)")
        let table = try vaultctl(d.socketPath, ["list"])
        #expect(table.stdout.split(separator: "\n").count == 251)
    }
}
