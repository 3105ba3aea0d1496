import Foundation
import Glibc
import Synchronization
import Testing
import VaultCore

@testable import VaultDaemon
@testable import VaultFleet

/// A fleet of real etcd members (`/usr/bin/etcd`, Debian's `etcd-server`) on
/// loopback: client and peer URLs on free ports of 127.0.0.1, data in a
/// temporary directory, one `--initial-cluster` naming them all. Members can
/// be stopped, killed and restarted; deinit kills every member still running
/// by its PID and removes the directory, so a failing test leaves nothing.
final class EtcdFleet {
    /// How long a test's client call may take when the test waits for an
    /// answer rather than asserts a bound: the call ends as soon as a member
    /// answers, so only a starved machine ever uses the margin.
    static let waitTimeout = 20.0

    /// One member: its name, URLs and the process while it runs.
    struct Member {
        var name: String
        var clientURL: String
        var peerURL: String
        var process: Process?
    }

    static let binary = "/usr/bin/etcd"
    /// Whether etcd is installed (scripts/deps test installs it).
    static var installed: Bool { FileManager.default.isExecutableFile(atPath: binary) }
    /// Whether this test process runs the etcd suites: `VAULTD_TEST_ETCD=1`,
    /// which scripts/test sets in a step of their own (`--filter
    /// 'VaultIntegrationTests\.Etcd'`), after the parallel run. Three members
    /// electing leaders every half second, beside every other suite on two
    /// cores, lose their quorum for seconds at a time; alone they do not.
    static var selected: Bool { ProcessInfo.processInfo.environment["VAULTD_TEST_ETCD"] == "1" }

    let directory: URL
    private(set) var members: [Member] = []
    private let token: String

    /// The members' client URLs, in member order.
    var endpoints: [String] { members.map(\.clientURL) }

    /// The members' TLS files when they serve clients over https (and
    /// require a client certificate); nil for plain http.
    let tls: EtcdTestCertificates?

    /// Starts `size` members and waits (bounded) until the fleet serves;
    /// over https with `tls`.
    init(size: Int = 3, tls: EtcdTestCertificates? = nil) async throws {
        self.tls = tls
        // In memory (tmpfs) where there is one: etcd syncs its log to disk
        // on every write, and on a virtual disk those syncs, not the tests'
        // waits, set how fast leases expire and leaders answer.
        let base =
            access("/dev/shm", W_OK) == 0
            ? URL(fileURLWithPath: "/dev/shm") : FileManager.default.temporaryDirectory
        directory = base.appendingPathComponent("vaultd-etcd-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        token = "vaultd-test-\(UUID().uuidString)"
        let ports = try Self.freePorts(2 * size)
        for index in 0..<size {
            members.append(
                Member(
                    name: "m\(index)", clientURL: "\(tls == nil ? "http" : "https")://127.0.0.1:\(ports[2 * index])",
                    peerURL: "http://127.0.0.1:\(ports[2 * index + 1])", process: nil))
        }
        for index in 0..<size { try start(index) }
        try await waitUntilServing()
    }

    deinit {
        for index in members.indices { kill(index) }
        try? FileManager.default.removeItem(at: directory)
    }

    /// Starts member `index` (again): a restart keeps its data directory.
    func start(_ index: Int) throws {
        precondition(members[index].process == nil, "member \(index) already runs")
        let member = members[index]
        let cluster = members.map { "\($0.name)=\($0.peerURL)" }.joined(separator: ",")
        let process = Process()
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = [
            "--name", member.name,
            "--data-dir", directory.appendingPathComponent(member.name).path,
            "--listen-client-urls", member.clientURL, "--advertise-client-urls", member.clientURL,
            "--listen-peer-urls", member.peerURL, "--initial-advertise-peer-urls", member.peerURL,
            "--initial-cluster", cluster, "--initial-cluster-state", "new", "--initial-cluster-token", token,
            // Elections within about a second, so a lost member is noticed
            // within the tests' waits; not faster, or a member starved by a
            // loaded machine calls elections while the leader is healthy.
            "--heartbeat-interval", "100", "--election-timeout", "1000",
        ]
        if let tls {
            process.arguments! += [
                "--cert-file", tls.serverCert, "--key-file", tls.serverKey, "--client-cert-auth",
                "--trusted-ca-file", tls.caFile,
            ]
        }
        let log = directory.appendingPathComponent("\(member.name).log")
        if !FileManager.default.fileExists(atPath: log.path) {
            _ = FileManager.default.createFile(atPath: log.path, contents: nil)
        }
        let handle = try FileHandle(forWritingTo: log)
        handle.seekToEndOfFile()
        process.standardOutput = handle
        process.standardError = handle
        process.standardInput = FileHandle.nullDevice
        try process.run()
        try? handle.close()
        members[index].process = process
    }

    /// Kills member `index` with SIGKILL and reaps it (nothing when it is not running).
    func kill(_ index: Int) {
        guard let process = members[index].process else { return }
        Glibc.kill(process.processIdentifier, SIGKILL)
        _ = try? reap(process)
        members[index].process = nil
    }

    /// Stops member `index` with SIGTERM, SIGKILL after 5 s, and reaps it.
    func stop(_ index: Int) {
        guard let process = members[index].process else { return }
        Glibc.kill(process.processIdentifier, SIGTERM)
        if (try? reap(process, seconds: 5)) == nil { Glibc.kill(process.processIdentifier, SIGKILL) }
        kill(index)
    }

    /// Waits until the members at `indices` (all by default) each answer a
    /// linearizable read, at most `seconds`: a wait, generous because a
    /// loaded machine starts three etcd processes slowly; a fleet that serves
    /// ends it at once.
    func waitUntilServing(_ indices: [Int]? = nil, seconds: Double = 60) async throws {
        let deadline = Date().addingTimeInterval(seconds)
        for index in indices ?? Array(members.indices) {
            let client = EtcdClient(endpoints: [members[index].clientURL], timeoutSeconds: 3, tls: tls?.clientFiles)
            var lastError = "not asked"
            while true {
                do {
                    _ = try await client.range(Array("health".utf8))
                    break
                } catch {
                    lastError = error.message
                }
                guard Date() < deadline else {
                    throw HarnessError(
                        "etcd member \(index) did not serve within \(Int(seconds))s: \(lastError); log: \(log(index).suffix(2000))"
                    )
                }
                try await Task.sleep(for: .milliseconds(50))
            }
        }
    }

    /// The log of member `index`, for a failure's message.
    func log(_ index: Int) -> String {
        (try? String(contentsOf: directory.appendingPathComponent("\(members[index].name).log"), encoding: .utf8))
            ?? ""
    }

    /// The next port `freePorts` tries, shared by every fleet of the test
    /// process, from a random place so that two test processes rarely meet.
    private static let nextPort = Mutex(Int.random(in: 0..<portRange.count))
    /// Below the kernel's ephemeral ports (32768 and up), which every
    /// `bind(port 0)` of the other suites draws from: a member stopped for a
    /// while must find its ports free when it starts again, and two fleets
    /// started at once must not draw the same ones (a member of another fleet
    /// would answer on this one's URL).
    static let portRange = 20000..<30000

    /// `count` distinct TCP ports of 127.0.0.1 that are free now, each
    /// handed to one fleet of this process only.
    static func freePorts(_ count: Int) throws -> [Int] {
        var ports: [Int] = []
        for _ in 0..<portRange.count where ports.count < count {
            let port = nextPort.withLock { next in
                defer { next = (next + 1) % portRange.count }
                return portRange.lowerBound + next
            }
            if try isFree(port) { ports.append(port) }
        }
        guard ports.count == count else { throw HarnessError("no \(count) free ports in \(portRange)") }
        return ports
    }

    /// Whether 127.0.0.1:`port` can be bound now.
    private static func isFree(_ port: Int) throws -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket failed: errno \(errno)") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = in_port_t(UInt16(port)).bigEndian
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
            }
        }
    }
}

extension Trait where Self == ConditionTrait {
    /// The etcd suites: run only where etcd is installed and only in the
    /// etcd step of scripts/test (`VAULTD_TEST_ETCD=1`, see `EtcdFleet.selected`).
    static var etcdStep: Self {
        .enabled(
            if: EtcdFleet.installed && EtcdFleet.selected,
            EtcdFleet.installed
                ? "etcd suites run in their own step: VAULTD_TEST_ETCD=1 swift test --filter 'VaultIntegrationTests\\.Etcd'"
                : "etcd is not installed: run scripts/deps test")
    }
}

/// A test CA, a server certificate for 127.0.0.1 and a client certificate,
/// made with openssl in `directory`.
struct EtcdTestCertificates {
    let directory: String
    var caFile: String { directory + "/ca.pem" }
    var serverCert: String { directory + "/server.pem" }
    var serverKey: String { directory + "/server.key" }
    var clientCert: String { directory + "/client.pem" }
    var clientKey: String { directory + "/client.key" }

    /// What vaultd's client is given: the CA and the client certificate.
    var clientFiles: TLSFiles {
        var settings = EtcdSettings()
        settings.caFile = caFile
        settings.certFile = clientCert
        settings.keyFile = clientKey
        return TLSFiles(settings)!
    }

    init(in directory: String) throws {
        self.directory = directory
        let openssl = URL(fileURLWithPath: "/usr/bin/openssl")
        func run(_ arguments: [String]) throws {
            let result = try runCommand(openssl, arguments)
            guard result.status == 0 else { throw HarnessError("openssl \(arguments.first ?? ""): \(result.stderr)") }
        }
        try run([
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
            "-subj", "/CN=vaultd test CA", "-keyout", directory + "/ca.key", "-out", caFile,
        ])
        for (name, extensions) in [
            // The member's gateway connects to its own gRPC port with the
            // server certificate as its client certificate: it needs both uses.
            ("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
            ("client", "extendedKeyUsage=clientAuth"),
        ] {
            let ext = directory + "/\(name).ext"
            try extensions.write(toFile: ext, atomically: true, encoding: .utf8)
            try run([
                "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj",
                "/CN=\(name)", "-keyout", directory + "/\(name).key", "-out", directory + "/\(name).csr",
            ])
            try run([
                "x509", "-req", "-in", directory + "/\(name).csr", "-CA", caFile, "-CAkey", directory + "/ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", directory + "/\(name).pem",
            ])
        }
    }
}
