import Foundation
import Glibc
import Synchronization
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// What one driver thread saw.
struct LoadTally {
    var calls = 0
    var tokenCalls = 0
    var latenciesMicros: [Int] = []
    var errors: [String] = []
}

/// Resident memory and open descriptors of a process.
struct ProcessFootprint: CustomStringConvertible {
    var rssKiB: Int
    var fds: Int

    static func of(_ pid: pid_t) -> ProcessFootprint {
        let status = (try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)) ?? ""
        let rss =
            status.split(separator: "\n").first { $0.hasPrefix("VmRSS:") }
            .flatMap { Int($0.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") } ?? -1
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
        return ProcessFootprint(rssKiB: rss, fds: fds)
    }

    var description: String { "RSS \(rssKiB / 1024) MiB, \(fds) fds" }
}

/// Many clients at once against the real daemon while its sessions refresh
/// underneath: nothing fails, latency is reported, memory and descriptors
/// come back to where they were.
@Suite("Load", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct LoadTests {
    /// The monotonic clock in nanoseconds.
    static func now() -> UInt64 {
        var ts = timespec()
        clock_gettime(CLOCK_MONOTONIC, &ts)
        return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
    }

    /// Should answer 1,000 concurrent clients doing GetToken and GetSession
    /// (10 s; 60 s under --soak) with zero errors while 20 sessions refresh
    /// every few seconds, and give back its descriptors afterwards.
    @Test func thousandClientsWhileRefreshing() async throws {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < 4096 {
            limit.rlim_cur = min(4096, limit.rlim_max)
            setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        }
        let clients = 1000
        let seconds = Soak.size(short: 10.0, long: 60.0)
        // Tokens that live 10 s are refreshed every few seconds (3 s lifetimes expired
        // under a load average of 18, before their refresh came round).
        let server = try TokenServer(["--lifetime", "10"])
        let fixture = try DaemonFixture(oauthServer: server)
        let daemon = try fixture.start()
        let pid = daemon.process.processIdentifier
        let vault = try VaultConnection(path: fixture.socketPath, timeoutSeconds: 60)
        let users = (0..<20).map { "load-\($0)-" + uniqueName("u") }
        for user in users {
            let grant = try JSON.parse(try await server.grant())
            try vault.login(provider: "oauth", user: user, tokenResponse: grant)
        }
        let refreshesBefore = try await server.stats()["refresh_requests"]?.integerValue ?? 0
        let before = ProcessFootprint.of(pid)

        // Eight driver threads, each keeping 125 connections busy: one call
        // outstanding per connection, the next sent as soon as its reply came.
        let threads = 8
        let socketPath = fixture.socketPath
        let tallies = Mutex<[LoadTally]>([])
        let deadline = Date().addingTimeInterval(seconds)
        let peak = Mutex(ProcessFootprint(rssKiB: 0, fds: 0))
        let group = DispatchGroup()
        for t in 0..<threads {
            group.enter()
            Thread.detachNewThread {
                defer { group.leave() }
                var tally = LoadTally()
                var connections: [VarlinkClient] = []
                for _ in 0..<(clients / threads) {
                    do { connections.append(try VarlinkClient(path: socketPath, timeoutSeconds: 30)) } catch {
                        tally.errors.append("connect: \(error)")
                    }
                }
                var sentAt = [UInt64](repeating: 0, count: connections.count)
                var askedToken = [Bool](repeating: false, count: connections.count)
                var sequence = t
                func send(_ i: Int) {
                    sequence += 1
                    let user = users[sequence % users.count]
                    let method = sequence % 4 == 0 ? VaultMethod.getSession : VaultMethod.getToken
                    do {
                        try connections[i].send(
                            VarlinkCall(
                                method: method.rawValue,
                                parameters: ["provider": "oauth", "user": .string(user)]))
                        sentAt[i] = LoadTests.now()
                        askedToken[i] = method == .getToken
                    } catch {
                        tally.errors.append("send: \(error)")
                    }
                }
                for i in connections.indices { send(i) }
                var polls = connections.map { pollfd(fd: $0.fileDescriptor, events: Int16(POLLIN), revents: 0) }
                while Date() < deadline, tally.errors.count < 10 {
                    guard poll(&polls, nfds_t(polls.count), 1000) > 0 else { continue }
                    for i in polls.indices where polls[i].revents != 0 {
                        polls[i].revents = 0
                        do {
                            let reply = try connections[i].receive()
                            tally.latenciesMicros.append(Int((LoadTests.now() - sentAt[i]) / 1000))
                            tally.calls += 1
                            if askedToken[i] && reply.error == nil { tally.tokenCalls += 1 }
                            if let error = reply.error { tally.errors.append("\(error): \(reply.parameters)") }
                        } catch {
                            tally.errors.append("receive: \(error)")
                            continue
                        }
                        send(i)
                    }
                    if t == 0 {
                        let now = ProcessFootprint.of(pid)
                        peak.withLock { if now.rssKiB > $0.rssKiB { $0 = now } }
                    }
                }
                // The last replies, then every connection closes.
                for (i, connection) in connections.enumerated() where sentAt[i] != 0 {
                    if let reply = try? connection.receive(), reply.error == nil, askedToken[i] {
                        tally.tokenCalls += 1
                    }
                }
                connections.removeAll()
                tallies.withLock { $0.append(tally) }
            }
        }
        let finished = group.wait(timeout: .now() + seconds + 90)
        #expect(finished == .success, "the drivers ended")
        let all = tallies.withLock { $0 }
        let calls = all.reduce(0) { $0 + $1.calls }
        let errors = all.flatMap(\.errors)
        let latencies = all.flatMap(\.latenciesMicros).sorted()
        func percentile(_ p: Double) -> Double {
            latencies.isEmpty ? 0 : Double(latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))]) / 1000
        }
        let refreshes = (try await server.stats()["refresh_requests"]?.integerValue ?? 0) - refreshesBefore
        // Descriptors come back once the clients closed (vaultd sees the closes on its next turn).
        let after = try await eventually({ ProcessFootprint.of(pid) }, until: { $0.fds <= before.fds })
        let highest = peak.withLock { $0 }
        print(
            "load: \(clients) clients, \(seconds) s: \(calls) calls (\(Int(Double(calls) / seconds))/s), "
                + "\(errors.count) errors, p50 \(percentile(0.5)) ms, p99 \(percentile(0.99)) ms, "
                + "max \(percentile(1)) ms; \(refreshes) refreshes underneath; vaultd before \(before), "
                + "peak RSS \(highest.rssKiB / 1024) MiB, after \(after)")
        #expect(errors.isEmpty, "\(errors.prefix(5))")
        #expect(calls > clients, "every client was answered, more than once")
        #expect(refreshes >= Int64(users.count / 2), "sessions refreshed underneath: \(refreshes)")
        #expect(after.fds <= before.fds, "descriptors leaked: before \(before), after \(after)")
        // The stated bound: the load costs vaultd at most 64 MiB more than idle, and it is given back.
        #expect(highest.rssKiB - before.rssKiB < 64 * 1024, "peak \(highest), before \(before)")
        #expect(after.rssKiB - before.rssKiB < 64 * 1024, "after \(after), before \(before)")
        // Every session still serves its current token.
        for user in users { #expect(!(try vault.token(provider: "oauth", user: user).value.isEmpty)) }

        // Audit volume: every handout is accounted for, in far fewer lines
        // (repeats of one kind are counted per interval; SIGTERM writes the rest).
        #expect(daemon.stop() == 0)
        let audit = daemon.allOutput.split(separator: "\n").filter { $0.contains("audit action=GetToken") }
        let accounted = audit.reduce(0) { sum, line in
            let count = line.split(separator: " ").first { $0.hasPrefix("count=") }.flatMap { Int($0.dropFirst(6)) }
            return sum + (count ?? 1)
        }
        let handouts = all.reduce(0) { $0 + $1.tokenCalls } + users.count
        print("load: audit: \(handouts) token handouts in \(audit.count) audit lines")
        #expect(accounted == handouts, "audit lines account for \(accounted) handouts of \(handouts)")
        #expect(audit.count * 100 < handouts, "\(audit.count) audit lines for \(handouts) handouts")
    }
}
