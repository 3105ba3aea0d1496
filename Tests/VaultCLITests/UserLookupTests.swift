import Foundation
import Glibc
import Testing

@testable import VaultClient

/// User names resolved without glibc's NSS (vaultctl is a static executable):
/// the password file first, then systemd's user database over Varlink.
@Suite("User lookup without NSS", .timeLimit(.minutes(5)))
struct UserLookupTests {
    static let passwd = """
        root:x:0:0:root:/root:/bin/bash
        daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin
        alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash
        broken:x:notanumber:1::/:/bin/false
        +nis-entry::::::
        """

    /// A directory of its own under /tmp, removed when the test ends.
    static func withDirectory<T>(_ body: (String) throws -> T) throws -> T {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("userlookup-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: path) }
        return try body(path)
    }

    /// A directory as `withDirectory`'s, holding `passwd` (the password
    /// file) and an empty `userdb` (systemd's user database) directory.
    static func withUserDatabase<T>(_ body: (_ passwd: String, _ userdb: String) throws -> T) throws -> T {
        try withDirectory { dir in
            try Self.passwd.write(toFile: dir + "/passwd", atomically: true, encoding: .utf8)
            try FileManager.default.createDirectory(atPath: dir + "/userdb", withIntermediateDirectories: true)
            return try body(dir + "/passwd", dir + "/userdb")
        }
    }

    @Test("Should read a uid from the password file by exact name")
    func passwdFile() {
        #expect(UserLookup.uid(named: "root", inPasswd: Self.passwd) == 0)
        #expect(UserLookup.uid(named: "alice", inPasswd: Self.passwd) == 1000)
        #expect(UserLookup.uid(named: "ali", inPasswd: Self.passwd) == nil)
        #expect(UserLookup.uid(named: "broken", inPasswd: Self.passwd) == nil)
        #expect(UserLookup.uid(named: "nobody-here", inPasswd: Self.passwd) == nil)
    }

    @Test("Should refuse names that cannot be in the password file, without looking")
    func oddNames() throws {
        try Self.withDirectory { dir in
            try Self.passwd.write(toFile: dir + "/passwd", atomically: true, encoding: .utf8)
            for name in ["", "alice:x", "root\n", "x:x:0"] {
                #expect(UserLookup.uid(named: name, passwd: dir + "/passwd", userDatabase: dir + "/none") == nil)
            }
            #expect(UserLookup.uid(named: "alice", passwd: dir + "/passwd", userDatabase: dir + "/none") == 1000)
        }
    }

    @Test("Should ask systemd's user database for a user the password file lacks (a DynamicUser)")
    func userDatabase() throws {
        try Self.withUserDatabase { passwd, userdb in
            let server = try FakeUserDatabase(
                path: userdb + "/io.systemd.DynamicUser", records: ["vaultd": 61234], connections: 2)
            #expect(UserLookup.uid(named: "vaultd", passwd: passwd, userDatabase: userdb) == 61234)
            #expect(UserLookup.uid(named: "nosuchuser", passwd: passwd, userDatabase: userdb) == nil)
            let calls = server.finish()
            #expect(calls.count == 2)
            #expect(calls.first?.contains("\"method\":\"io.systemd.UserDatabase.GetUserRecord\"") == true, "\(calls)")
            #expect(calls.first?.contains("\"service\":\"io.systemd.DynamicUser\"") == true, "\(calls)")
            #expect(calls.first?.contains("\"userName\":\"vaultd\"") == true, "\(calls)")
            // Found in the password file: the user database is not asked.
            #expect(UserLookup.uid(named: "alice", passwd: passwd, userDatabase: userdb) == 1000)
        }
    }

    @Test("Should name a uid from the password file, else from systemd's user database (a DynamicUser)")
    func nameOfUID() throws {
        try Self.withUserDatabase { passwd, userdb in
            let server = try FakeUserDatabase(
                path: userdb + "/io.systemd.DynamicUser", records: ["vaultd": 61234], connections: 2)
            #expect(UserLookup.name(uid: 1000, passwd: passwd, userDatabase: userdb) == "alice")
            #expect(UserLookup.name(uid: 61234, passwd: passwd, userDatabase: userdb) == "vaultd")
            #expect(UserLookup.name(uid: 4321, passwd: passwd, userDatabase: userdb) == nil)
            let calls = server.finish()
            #expect(calls.count == 2, "the password file answered for 1000: \(calls)")
            #expect(calls.first?.contains("\"uid\":61234") == true, "\(calls)")
        }
    }

    @Test("Should ask only the multiplexer when systemd-userdbd runs")
    func multiplexerFirst() throws {
        try Self.withUserDatabase { _, userdb in
            // A service that would answer wrongly; the multiplexer answers right.
            let other = try FakeUserDatabase(
                path: userdb + "/io.systemd.DynamicUser", records: ["carol": 1], connections: 0)
            let multiplexer = try FakeUserDatabase(
                path: userdb + "/io.systemd.Multiplexer", records: ["carol": 4242], connections: 1)
            #expect(UserLookup.uid(named: "carol", passwd: userdb + "/no-passwd", userDatabase: userdb) == 4242)
            #expect(multiplexer.finish().count == 1)
            #expect(other.finish().isEmpty)
        }
    }
}

/// A user-record service on a Unix socket that answers `connections`
/// connections of one GetUserRecord call each, from `records`, on a thread
/// of its own (bounded: it stops waiting after 10 s).
final class FakeUserDatabase: @unchecked Sendable {
    private let fd: Int32
    private let done = DispatchSemaphore(value: 0)
    private let lock = NSLock()
    private var calls: [String] = []

    init(path: String, records: [String: Int], connections: Int) throws {
        fd = try listeningSocket(at: path, backlog: 8)
        var limit = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, socklen_t(MemoryLayout<timeval>.size))
        let listener = fd
        Thread.detachNewThread { [self] in
            for _ in 0..<connections {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { break }
                var wait = timeval(tv_sec: 10, tv_usec: 0)
                setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &wait, socklen_t(MemoryLayout<timeval>.size))
                var message: [UInt8] = []
                var byte: UInt8 = 0
                while recv(client, &byte, 1, 0) == 1, byte != 0, message.count < 65536 { message.append(byte) }
                let text = String(decoding: message, as: UTF8.self)
                lock.withLock { calls.append(text) }
                let reply: String
                if let (name, uid) = records.first(where: {
                    text.contains("\"userName\":\"\($0.key)\"") || text.contains("\"uid\":\($0.value)")
                }) {
                    reply =
                        "{\"parameters\":{\"record\":{\"userName\":\"\(name)\",\"uid\":\(uid),\"gid\":\(uid)},\"incomplete\":false}}"
                } else {
                    reply = "{\"error\":\"io.systemd.UserDatabase.NoRecordFound\",\"parameters\":{}}"
                }
                let bytes = Array(reply.utf8) + [0]
                _ = bytes.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                close(client)
            }
            done.signal()
        }
    }

    /// The calls received; waits (at most 10 s) for the expected connections.
    func finish() -> [String] {
        _ = done.wait(timeout: .now() + 10)
        shutdown(fd, Int32(SHUT_RDWR))
        return lock.withLock { calls }
    }

    deinit { close(fd) }
}
