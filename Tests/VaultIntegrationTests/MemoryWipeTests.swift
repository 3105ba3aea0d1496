import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// Where a needle was found in another process's memory.
struct MemoryHit: CustomStringConvertible {
    var address: UInt64
    /// The `/proc/PID/maps` line of the region that holds it.
    var region: String
    /// The bytes around it, the needle itself shown as `<SECRET>`.
    var context: String

    var description: String { String(format: "0x%llx", address) + " in \(region): \(context)" }
}

/// Reads a live process's writable memory through `/proc/PID/mem`. vaultd sets
/// `PR_SET_DUMPABLE=0`, which makes its `/proc` files root's; reading them
/// still needs ptrace access (root's `CAP_SYS_PTRACE`), so this runs as root.
enum ProcessMemory {
    /// Every place `needle` occurs in the writable mappings of `pid`.
    /// Throws when the memory cannot be read at all (an empty scan proves nothing).
    static func find(_ needle: [UInt8], in pid: pid_t) throws -> [MemoryHit] {
        let maps = try String(contentsOfFile: "/proc/\(pid)/maps", encoding: .utf8)
        let fd = open("/proc/\(pid)/mem", O_RDONLY)
        guard fd >= 0 else { throw HarnessError("open /proc/\(pid)/mem: errno \(errno)") }
        defer { close(fd) }
        var hits: [MemoryHit] = []
        var bytesRead = 0
        for line in maps.split(separator: "\n") {
            let fields = line.split(separator: " ", omittingEmptySubsequences: true)
            guard fields.count >= 5, fields[1].hasPrefix("rw") else { continue }
            let bounds = fields[0].split(separator: "-").compactMap { UInt64($0, radix: 16) }
            guard bounds.count == 2 else { continue }
            let region = try read(fd, from: bounds[0], to: bounds[1])
            bytesRead += region.count
            var start = region.startIndex
            while let found = firstRange(of: needle, in: region, from: start) {
                let before = region[max(region.startIndex, found - 48)..<found]
                let after = region[(found + needle.count)..<min(region.endIndex, found + needle.count + 48)]
                hits.append(
                    MemoryHit(
                        address: bounds[0] + UInt64(found), region: String(line),
                        context: printable(before) + "<SECRET>" + printable(after)))
                start = found + needle.count
            }
        }
        guard bytesRead > 0 else { throw HarnessError("nothing of process \(pid)'s memory could be read") }
        return hits
    }

    /// The bytes of [start, end) of the process behind `fd`; pages that cannot
    /// be read (guard pages) end the region early.
    private static func read(_ fd: Int32, from start: UInt64, to end: UInt64) throws -> [UInt8] {
        var out = [UInt8](repeating: 0, count: Int(end - start))
        var done = 0
        while done < out.count {
            let n = out.withUnsafeMutableBytes { raw in
                pread(fd, raw.baseAddress! + done, raw.count - done, off_t(Int64(bitPattern: start + UInt64(done))))
            }
            if n < 0 && errno == EINTR { continue }
            if n <= 0 { break }
            done += n
        }
        out.removeSubrange(done...)
        return out
    }

    /// The first index at or after `from` where `needle` starts: memchr for
    /// its first byte, memcmp for the rest (a Swift byte loop of the debug
    /// build spent a third of the process-test step's CPU here).
    private static func firstRange(of needle: [UInt8], in haystack: [UInt8], from: Int) -> Int? {
        guard let first = needle.first, from <= haystack.count - needle.count else { return nil }
        return haystack.withUnsafeBytes { hay in
            needle.withUnsafeBytes { pin in
                let base = hay.baseAddress!
                let last = hay.count - pin.count
                var index = from
                while index <= last {
                    guard let hit = memchr(base + index, Int32(first), last - index + 1) else { return nil }
                    let at = base.distance(to: UnsafeRawPointer(hit))
                    if memcmp(base + at, pin.baseAddress!, pin.count) == 0 { return at }
                    index = at + 1
                }
                return nil
            }
        }
    }

    private static func printable(_ bytes: ArraySlice<UInt8>) -> String {
        String(bytes.map { $0 >= 0x20 && $0 < 0x7F ? Character(UnicodeScalar($0)) : "." })
    }
}

/// The finding "copies of a token survive logout": after a session is logged
/// out, none of its tokens is left anywhere in vaultd's memory.
@Suite("Secrets wiped from memory", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct MemoryWipeTests {
    /// A token of 40 random characters, far past Swift's 15-byte small strings,
    /// so that it lives in heap storage like a real one.
    static func randomToken(_ prefix: String) -> String {
        let alphabet = Array("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        return prefix + String((0..<(40 - prefix.count)).map { _ in alphabet.randomElement()! })
    }

    /// The sockets vaultd has open (listener and connections, D-Bus too).
    static func openSockets(_ pid: pid_t) -> Int {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")) ?? []
        return entries.filter {
            (try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)"))?
                .hasPrefix("socket:") == true
        }.count
    }

    @Test(
        "Should leave no copy of a session's tokens in vaultd's memory once it is logged out",
        .enabled(if: geteuid() == 0, "reading vaultd's memory needs root (CAP_SYS_PTRACE)"),
        arguments: ["memory", "keyring"])
    func noCopySurvivesLogout(store: String) async throws {
        let fixture = try DaemonFixture(start: false)
        let daemon = try RunningDaemon(
            socketPath: fixture.socketPath, configPath: fixture.configPath,
            extraArguments: store == "memory" ? ["--memory-store"] : [])
        fixture.daemon = daemon
        let pid = daemon.process.processIdentifier
        let idleSockets = Self.openSockets(pid)

        // One session logged in with a token, one with an OAuth 2.0 token response.
        let plain = (user: uniqueName("wipe"), token: Self.randomToken("wipeA"))
        let oauth = (user: uniqueName("wipe"), token: Self.randomToken("wipeB"), refresh: Self.randomToken("wipeR"))
        let secrets = [plain.token, oauth.token, oauth.refresh]
        // Kept open through the scan: what a connection still in use holds counts too.
        let open = try fixture.client()
        do {
            let client = try fixture.client()
            try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60).login(
                provider: "demo", user: plain.user, token: plain.token)
            let response: JSON = .object([
                "access_token": .string(oauth.token), "refresh_token": .string(oauth.refresh),
                "token_type": "Bearer", "expires_in": 3600,
            ])
            let login = try client.call(
                VaultMethod.login.rawValue,
                ["provider": "demo", "user": .string(oauth.user), "tokenResponse": response])
            #expect(login.error == nil, "\(login)")
            // The hot path: GetToken, several times, on both connections.
            for _ in 0..<3 {
                for (user, token) in [(plain.user, plain.token), (oauth.user, oauth.token)] {
                    for c in [client, open] {
                        let reply = try c.call(
                            VaultMethod.getToken.rawValue, ["provider": "demo", "user": .string(user)])
                        #expect(reply.parameters["token"]?.stringValue == token)
                    }
                }
            }
            // The scan finds a live session's token: it reads what it must.
            let live = try ProcessMemory.find(Array(plain.token.utf8), in: pid)
            #expect(!live.isEmpty, "the scan did not find a logged-in session's token")

            try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60).logout(provider: "demo", user: plain.user)
            try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60).logout(provider: "demo", user: oauth.user)
        }
        // Logged out: GetSession says so, and the closed connection is gone from vaultd.
        for user in [plain.user, oauth.user] {
            let reply = try await eventually(
                { try open.call(VaultMethod.getSession.rawValue, ["provider": "demo", "user": .string(user)]) },
                until: { $0.error == "io.vaultd.Vault.NotLoggedIn" })
            #expect(reply.error == "io.vaultd.Vault.NotLoggedIn")
        }
        let sockets = try await eventually({ Self.openSockets(pid) }, until: { $0 <= idleSockets + 1 })
        #expect(sockets <= idleSockets + 1, "vaultd still holds the closed connection")

        var report: [String] = []
        for (name, secret) in zip(["token", "oauth access token", "refresh token"], secrets) {
            for hit in try ProcessMemory.find(Array(secret.utf8), in: pid) { report.append("\(name) at \(hit)") }
        }
        let list = report.joined(separator: "\n")
        #expect(report.isEmpty, "\(report.count) copies survive logout (\(store) store):\n\(list)")
    }
}
