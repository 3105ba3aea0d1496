import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// The ways a token endpoint fails in EndpointOutageTests, with what the
/// token server is told and what the error must say.
enum EndpointFailure: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case down, close, reset, hang, error500, error429, error429Bare, truncated, garbage, huge, hugeUnannounced
    case tlsUntrusted, tlsToPlain

    var testDescription: String { rawValue }

    /// The /control/mode request that starts it; nil for the TLS cases, which need none.
    func mode(window: Int) -> JSON? {
        switch self {
        // Down well past the window, so that it is still down when the window is read
        // however late the test sees the listener close.
        case .down: return ["mode": "down", "hang_seconds": .int(Int64(window + 20))]
        case .hang: return ["mode": "hang", "hang_seconds": 60]
        case .error429: return ["mode": "error429", "retry_after": 3]
        case .error429Bare: return ["mode": "error429", "retry_after": .null]
        case .huge: return ["mode": "huge", "body_bytes": .int(64 << 20)]
        case .hugeUnannounced: return ["mode": "huge_unannounced", "body_bytes": .int(64 << 20)]
        case .tlsUntrusted, .tlsToPlain: return nil
        default: return ["mode": .string(rawValue)]
        }
    }

    /// What the refresh's error must say.
    var expected: String {
        switch self {
        case .down: return "refused the connection: nothing listens there"
        case .close, .reset: return "closed the connection without a whole answer"
        case .hang: return "timed out: no whole answer within 1s"
        case .error500: return "the token endpoint answered 500"
        case .error429, .error429Bare: return "the token endpoint answered 429"
        case .truncated: return "answer was cut short"
        case .garbage: return "answered 200 with 10 bytes that are no JSON"
        case .huge, .hugeUnannounced: return "answered with more than 65536 bytes, the most vaultd reads"
        case .tlsUntrusted, .tlsToPlain: return "TLS with 127.0.0.1:"
        }
    }

    /// True when the endpoint comes back in the test (a TLS error needs an administrator).
    var recovers: Bool { self != .tlsUntrusted && self != .tlsToPlain }
}

/// The token server over TLS with a fresh self-signed certificate that is in
/// no trust store: what a client meets at a wrong or intercepted host.
final class TLSTokenServer {
    let process = Process()
    let url: String
    let directory: TemporaryDirectory
    private let output: OutputCollector

    init() throws {
        directory = try TemporaryDirectory()
        let cert = directory.path("cert.pem")
        let key = directory.path("key.pem")
        let made = try runCommand(
            URL(fileURLWithPath: "/usr/bin/openssl"),
            [
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj",
                "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            ])
        guard made.status == 0 else { throw HarnessError("openssl req failed: \(made.stderr)") }
        let script = Binaries.packageRoot.appendingPathComponent("Tests/servers/token_server.py").path
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [script, "--port", "0", "--tls-cert", cert, "--tls-key", key]
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        output = OutputCollector(out)
        try process.run()
        guard output.wait(for: "LISTENING https://127.0.0.1:", seconds: 20),
            let line = output.text.split(separator: "\n").first(where: { $0.hasPrefix("LISTENING ") })
        else { throw HarnessError("the TLS token server did not start: \(output.text)") }
        url = String(line.dropFirst("LISTENING ".count))
    }

    /// The server's counters, read with curl -k (the certificate is trusted nowhere).
    func stats() throws -> JSON {
        let result = try runCommand(URL(fileURLWithPath: "/usr/bin/curl"), ["-sk", url + "/control/stats"])
        return try JSON.parse(Array(result.stdout.utf8))
    }

    deinit {
        kill(process.processIdentifier, SIGKILL)
        _ = try? reap(process)
    }
}

/// Issue 13, "Token endpoint": every way a token endpoint fails, against the
/// real daemon and the real token server on loopback. Each is classified
/// transient with an error that names it, retried with jittered backoff
/// without a storm (the server counts what it saw over a fixed window),
/// while the still-valid token is served from memory; once the endpoint is
/// back the session recovers by itself.
@Suite("Token endpoint outages", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct EndpointOutageTests {
    /// How long each outage lasts.
    static let window = Soak.size(short: 6, long: 30)
    /// Outage-and-recovery cycles per kind of failure.
    static let cycles = Soak.size(short: 1, long: 2)

    /// True when something accepts TCP connections on 127.0.0.1:`port`.
    static func accepts(port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }

    /// The daemon's peak resident memory (VmHWM), in KiB.
    func peakMemory(_ daemon: RunningDaemon) throws -> Int {
        let status = try String(contentsOfFile: "/proc/\(daemon.process.processIdentifier)/status", encoding: .utf8)
        let line = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") } ?? ""
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? -1
    }

    // The cases run side by side, as many at once as the run's
    // parallelization width allows (scripts/test sets it): each case mostly
    // waits out its outage window and its backoff.

    @Test(
        "Should classify a refused, closed, reset or unanswered connection, back off, serve the token, recover",
        arguments: [EndpointFailure.down, .close, .reset, .hang])
    func connectionFailures(_ failure: EndpointFailure) async throws { try await outage(failure) }

    @Test(
        "Should classify a 5xx, a 429, a truncated or a non-JSON answer, back off, serve the token, recover",
        arguments: [EndpointFailure.error500, .error429, .error429Bare, .truncated, .garbage])
    func badAnswers(_ failure: EndpointFailure) async throws { try await outage(failure) }

    @Test(
        "Should cut a huge answer at 64 KiB and classify TLS failures, back off and serve the token",
        arguments: [EndpointFailure.huge, .hugeUnannounced, .tlsUntrusted, .tlsToPlain])
    func hugeAnswersAndTLS(_ failure: EndpointFailure) async throws { try await outage(failure) }

    /// One failure's outage cycles: classified, backed off without a storm,
    /// the token served throughout, recovered by itself.
    func outage(_ failure: EndpointFailure) async throws {
        let server = try TokenServer(["--lifetime", "600"])
        let tls = failure == .tlsUntrusted ? try TLSTokenServer() : nil
        var tokenURL = server.url + "/token"
        if let tls { tokenURL = tls.url + "/token" }
        if failure == .tlsToPlain { tokenURL = "https://" + server.url.dropFirst("http://".count) + "/token" }
        let fixture = try DaemonFixture(start: false)
        let timeout = failure == .hang ? "Timeout=1s\n" : ""
        try
            "[Vault]\nMinRefreshInterval=0\n\n[Provider oauth]\nType=oauth2\nTokenURL=\(tokenURL)\nClientID=vaultd-test\n\(timeout)"
            .write(toFile: fixture.configPath, atomically: true, encoding: .utf8)
        let daemon = try fixture.start()
        let user = uniqueName(failure.rawValue)
        // Over TLS the endpoint never works: the session starts from a token response of the test's own.
        let grant =
            failure.recovers
            ? try await server.grant()
            : #"{"access_token":"at_tls_abcdefghijklmnopqrstuvwxyz","refresh_token":"rt_tls_abcdefghijklmnop","expires_in":600}"#
        #expect(try vaultctl(fixture.socketPath, ["login", "oauth", user], input: grant).status == 0)
        if failure.recovers {
            // A refresh that works first, so that libcurl is loaded before memory is measured.
            try expectSuccess(vaultctl(fixture.socketPath, ["refresh", "oauth", user]))
        }
        let client = try fixture.client()
        func token() throws -> (String?, Double) {
            let asked = Date()
            let reply = try client.call(VaultMethod.getToken.rawValue, ["provider": "oauth", "user": .string(user)])
            return (reply.parameters["token"]?.stringValue, Date().timeIntervalSince(asked))
        }
        func session() throws -> JSON? {
            try client.call(VaultMethod.getSession.rawValue, ["provider": "oauth", "user": .string(user)])
                .parameters["session"]
        }
        for cycle in 0..<EndpointOutageTests.cycles {
            // The token of this cycle (the last one's recovery refreshed it).
            let served = try #require(try token().0)
            let memoryBefore = try peakMemory(daemon)
            try await server.post("/control/reset")
            if let mode = failure.mode(window: EndpointOutageTests.window) {
                try await server.post("/control/mode", json: mode)
            }
            let outageStarted = Date()
            if failure == .down {
                // The listener is closed once the control answer is out: wait, bounded, until it is.
                // A blocking poll, not `eventually`: under the parallel suites a task's wake-up
                // from Task.sleep waits for a free pool thread, and a CI run slept past the
                // whole closed window (6 s) that way.
                let port = try #require(UInt16(server.url.split(separator: ":").last ?? ""))
                var closed = false
                for _ in 0..<2_000 where !closed && Date().timeIntervalSince(outageStarted) < 10 {
                    closed = !EndpointOutageTests.accepts(port: port)
                    if !closed { usleep(5_000) }
                }
                try #require(
                    closed,
                    "the token server did not close its listener (\(Date().timeIntervalSince(outageStarted)) s after the outage began)"
                )
            }
            let failed = try vaultctl(fixture.socketPath, ["refresh", "oauth", user])
            #expect(failed.status == 1, "\(failure)")
            #expect(failed.stderr.contains("ERR_NETWORK_ERROR"), "\(failure): \(failed.stderr)")
            #expect(failed.stderr.contains(failure.expected), "\(failure): \(failed.stderr)")
            // Right after the failure (later, a loaded machine may already be past the outage):
            // not connected while a retry is due, and the error says what happened.
            let early = try #require(try session())
            #expect(early["connection"]?.stringValue != "connected", "\(failure): \(early)")
            #expect(early["lastError"]?.stringValue?.contains(failure.expected) == true, "\(failure): \(early)")
            // The window: the token is served from memory all along, however
            // often it is asked for, and the endpoint sees only the retries.
            var answers = 0
            var slowest = 0.0
            let end = outageStarted.addingTimeInterval(Double(EndpointOutageTests.window))
            // `down` ends by itself (its listener opens again): past that, a loaded
            // machine's reads may come after a retry that refreshed, legitimately.
            let endpointBackAt =
                failure == .down ? outageStarted.addingTimeInterval(Double(EndpointOutageTests.window + 20)) : nil
            // At least three reads, even when a loaded machine spent the window on the refresh above.
            for round in 0..<100_000 where round < 3 || Date() < end {
                let (current, seconds) = try token()
                let endpointBack = endpointBackAt.map { Date() > $0 } ?? false
                #expect(current == served || endpointBack, "\(failure): the still-valid token is served")
                answers += 1
                slowest = max(slowest, seconds)
                try await Task.sleep(for: .milliseconds(100))
            }
            let status = try #require(try session())
            // What reached the server: HTTP requests; over TLS, refused handshakes
            // (the TLS server's, or connections to the plain one less this read's own).
            let seen: Int64
            if let tls {
                seen = try tls.stats()["tls_failures"]?.integerValue ?? -1
            } else if failure == .tlsToPlain {
                seen = (try await server.stats()["connections"]?.integerValue ?? 0) - 1
            } else {
                let stats = try await eventually(
                    tries: 400, interval: .milliseconds(100), { try? await server.stats() }, until: { $0 != nil })
                seen = try #require(stats)["token_requests"]?.integerValue ?? -1
            }
            let failures = status["consecutiveFailures"]?.integerValue ?? 0
            // Every wait is at least 1 s (3 s after Retry-After: 3): at most that many tries fit
            // in the time from the outage to the count (the window, or more on a loaded machine).
            let counted = Int(Date().timeIntervalSince(outageStarted).rounded(.up))
            let most = Int64(failure == .error429 ? counted / 3 + 2 : counted + 2)
            #expect(seen <= most, "\(failure): the endpoint saw \(seen) requests in \(counted) s")
            #expect(answers >= 2, "\(failure): GetToken answered \(answers) times")
            // What the endpoint sent never filled vaultd's memory.
            let grown = try peakMemory(daemon) - memoryBefore
            #expect(grown < 16 * 1024, "\(failure): vaultd's peak memory grew by \(grown) KiB")
            var recovery = "-"
            var scheduled = "-"
            if failure.recovers {
                var healthy = Date()
                if failure != .down { try await server.post("/control/mode", json: ["mode": "normal"]) }
                if failure == .down {
                    // A fresh connection of its own, made until the listener is back.
                    let port = try #require(UInt16(server.url.split(separator: ":").last ?? ""))
                    let back = try await eventually(
                        tries: 600, interval: .milliseconds(100), { EndpointOutageTests.accepts(port: port) },
                        until: { $0 })
                    try #require(back, "the token server did not listen again")
                    healthy = Date()
                }
                // Back by itself at the next scheduled retry, which was set before the endpoint came back.
                let pending = try session()
                // The retry last scheduled before the recovery: a retry that
                // reached the endpoint just before it came back fails after
                // this read and schedules the next one, seconds later, at
                // which the session recovers as it should.
                var retryAt: Int64 = pending?["nextRetryAt"]?.integerValue ?? 0
                let after = try await eventually(
                    tries: 1200, interval: .milliseconds(100),
                    { () throws -> JSON? in
                        let now = try session()
                        if let next = now?["nextRetryAt"]?.integerValue, now?["consecutiveFailures"]?.integerValue != 0
                        {
                            retryAt = max(retryAt, next)
                        }
                        return now
                    },
                    until: { $0?["consecutiveFailures"]?.integerValue == 0 })
                #expect(
                    after?["consecutiveFailures"]?.integerValue == 0,
                    "\(failure) did not recover: \(String(describing: after))")
                #expect(after?["connection"]?.stringValue == "connected")
                // vaultd's own record of when it refreshed, not when this test looked.
                let refreshedAt = after?["lastRefreshAt"]?.integerValue ?? 0
                if pending?["connection"]?.stringValue == "connectFailed" {
                    #expect(
                        refreshedAt <= retryAt + 5,
                        "\(failure): refreshed at \(refreshedAt), later than the retry scheduled for \(retryAt)")
                }
                if retryAt > 0 { scheduled = String(format: "%.1fs", Double(retryAt) - healthy.timeIntervalSince1970) }
                recovery = String(format: "%.1fs", max(0, Double(refreshedAt) - healthy.timeIntervalSince1970))
                #expect(try await server.stats()["reused_refresh_tokens"]?.integerValue == 0)
            }
            if cycle == 0 {
                let message = failed.stderr.trimmingCharacters(in: .whitespacesAndNewlines)
                print(
                    "OUTAGE endpoint=\(failure.rawValue) window=\(EndpointOutageTests.window)s seen=\(seen) failures=\(failures) getToken=\(answers) slowest=\(String(format: "%.4f", slowest))s peakGrowth=\(grown)KiB recovery=\(recovery) retryWasDueIn=\(scheduled) error=\(message)"
                )
            }
        }
        _ = try vaultctl(fixture.socketPath, ["logout", "oauth", user])
    }

    @Test("Should refuse, in --check-config, a non-loopback http:// token URL, naming file, line, key and the fix")
    func insecureURLRefused() throws {
        let directory = try TemporaryDirectory()
        let config = directory.path("vaultd.conf")
        try "[Provider web]\nType=oauth2\nClientID=c\nTokenURL=http://login.example.com/token\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let refused = try runCommand(Binaries.vaultd, ["--check-config", "--config", config])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("\(config):4: key 'TokenURL'"), "\(refused.stderr)")
        #expect(refused.stderr.contains("AllowInsecureHTTP=yes"), "\(refused.stderr)")
        #expect(refused.stderr.contains("ERR_INVALID_CONFIG"), "\(refused.stderr)")
        try "[Provider web]\nType=oauth2\nClientID=c\nTokenURL=http://login.example.com/token\nAllowInsecureHTTP=yes\n"
            .write(toFile: config, atomically: true, encoding: .utf8)
        #expect(try runCommand(Binaries.vaultd, ["--check-config", "--config", config]).status == 0)
        // The shipped configuration and examples pass the rule (their helpers installed).
        let root = Binaries.packageRoot.appendingPathComponent("config")
        let examples = try FileManager.default.contentsOfDirectory(atPath: root.appendingPathComponent("examples").path)
            .filter { $0.hasSuffix(".conf") }.map { "examples/" + $0 }
        for (index, file) in (["vaultd.conf"] + examples).enumerated() {
            let installed = directory.path("shipped-\(index).conf")
            try Data(try ConfigFuzzTests.installed("config/" + file)).write(to: URL(fileURLWithPath: installed))
            let check = try runCommand(Binaries.vaultd, ["--check-config", "--config", installed])
            #expect(check.status == 0, "\(file): \(check.stderr)")
        }
    }
}
