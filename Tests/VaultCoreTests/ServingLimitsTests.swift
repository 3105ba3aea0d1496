import Testing
import Varlink
import VaultCore

@Suite("ServingLimits", .timeLimit(.minutes(5)))
struct ServingLimitsTests {
    func parse(_ vault: String) throws(VaultError) -> ServingLimits {
        try ConfigParser.parse("[Vault]\n" + vault, file: "test.conf").serving
    }

    @Test("Should default to 8192 connections, 128 per user, 5 min idle, 30 s per request, 4 MiB of output")
    func defaults() throws {
        let limits = try parse("")
        #expect(limits == ServingLimits())
        #expect(limits.maxConnections == 8192)
        #expect(limits.reservedConnections == 64)
        #expect(limits.rootReservedConnections == 16)
        #expect(limits.maxConnectionsPerUser == 128)
        #expect(limits.idleTimeoutSeconds == 300)
        #expect(limits.requestTimeoutSeconds == 30)
        #expect(limits.maxOutputPerConnection == 4 << 20)
        #expect(limits.outputHighWater == 1 << 20)
    }

    @Test("Should read every key of [Vault]")
    func keys() throws {
        let limits = try parse(
            "MaxConnections=200\nMaxConnectionsPerUser=10\nIdleTimeout=2min\nRequestTimeout=5s\n"
                + "MaxOutputPerConnection=64K\n")
        #expect(limits.maxConnections == 200)
        #expect(limits.maxConnectionsPerUser == 10)
        #expect(limits.idleTimeoutSeconds == 120)
        #expect(limits.requestTimeoutSeconds == 5)
        #expect(limits.maxOutputPerConnection == 65536)
        #expect(limits.outputHighWater == 32768)
    }

    @Test(
        "Should refuse a bad value naming file, line and key, but not quoting the value",
        arguments: [
            "MaxConnections=64", "MaxConnections=lots", "MaxConnectionsPerUser=0", "IdleTimeout=00",
            "IdleTimeout=forever", "RequestTimeout=2d", "MaxOutputPerConnection=1K", "MaxOutputPerConnection=4X",
            "MaxConnections=100\nMaxConnectionsPerUser=50",
        ])
    func badValues(line: String) throws {
        let error = #expect(throws: VaultError.self) { try parse(line) }
        let key = String(line.split(separator: "\n").last!.split(separator: "=")[0])
        let value = String(line.split(separator: "\n").last!.split(separator: "=")[1])
        #expect(error?.code == .invalidConfig)
        #expect(error?.message.hasPrefix("test.conf:\(line.split(separator: "\n").count + 1): key '\(key)'") == true)
        #expect(error?.message.contains(value) == false, "\(error?.message ?? "")")
    }

    @Test("Should keep the default per-user limit under the share of a small MaxConnections")
    func perUserFitsTheShare() throws {
        #expect(try parse("MaxConnections=80").maxConnectionsPerUser == 16)
    }

    @Test("Should parse sizes in powers of 1024")
    func sizes() {
        #expect(ByteSizeParser.bytes("65536") == 65536)
        #expect(ByteSizeParser.bytes("64K") == 65536)
        #expect(ByteSizeParser.bytes("4M") == 4 << 20)
        #expect(ByteSizeParser.bytes("4MiB") == 4 << 20)
        #expect(ByteSizeParser.bytes("1G") == 1 << 30)
        #expect(ByteSizeParser.bytes("") == nil)
        #expect(ByteSizeParser.bytes("M") == nil)
        #expect(ByteSizeParser.bytes("4 M") == nil)
        #expect(ByteSizeParser.bytes("99999999999999999999G") == nil)
    }

    @Test("Should admit up to the per-user limit, keep a reserve for root and admins and one for root alone")
    func admission() {
        var limits = ServingLimits()
        limits.maxConnections = 100
        limits.maxConnectionsPerUser = 10
        func decide(root: Bool = false, admin: Bool = false, open: Int, shared: Int, mine: Int)
            -> ServingLimits.Admission
        {
            limits.admission(
                isRoot: root, privileged: root || admin, open: open, openUnprivileged: shared, openForUser: mine)
        }
        #expect(decide(open: 0, shared: 0, mine: 0) == .admit)
        #expect(decide(open: 9, shared: 9, mine: 9) == .admit)
        #expect(decide(open: 10, shared: 10, mine: 10) == .perUserLimit)
        #expect(decide(admin: true, open: 10, shared: 0, mine: 10) == .perUserLimit)
        #expect(decide(root: true, open: 50, shared: 0, mine: 50) == .admit)
        // Others hold the whole share (100 - 64): a user with none left is refused, root and admins are not.
        #expect(decide(open: 36, shared: 36, mine: 0) == .sharedLimit)
        #expect(decide(admin: true, open: 36, shared: 36, mine: 0) == .admit)
        #expect(decide(root: true, open: 99, shared: 36, mine: 63) == .admit)
        #expect(decide(root: true, open: 100, shared: 36, mine: 64) == .full)
        // The last 16 are root's alone: an admin who finds only those left is refused, root is not.
        #expect(decide(admin: true, open: 83, shared: 36, mine: 9) == .admit)
        #expect(decide(admin: true, open: 84, shared: 36, mine: 9) == .keptForRoot)
        #expect(decide(open: 84, shared: 20, mine: 0) == .keptForRoot)
        #expect(decide(root: true, open: 84, shared: 36, mine: 0) == .admit)
        for admission in [ServingLimits.Admission.perUserLimit, .sharedLimit, .full, .keptForRoot] {
            let error = limits.refusal(admission, uid: 1234)
            #expect(error.code == .tooManyConnections)
            #expect(error.code.seedCode == "ERR_TOO_MANY_CONNECTIONS")
            #expect(error.code.varlinkErrorName == "TooManyConnections")
        }
        #expect(limits.refusal(.perUserLimit, uid: 1234).message.contains("uid 1234"))
        #expect(limits.refusal(.keptForRoot, uid: 1234).message.contains("keeps for root"))
    }

    @Test("Should time out an idle connection, an unfinished message sooner, never a subscription or a call in flight")
    func deadlines() {
        var limits = ServingLimits()
        limits.idleTimeoutSeconds = 300
        limits.requestTimeoutSeconds = 30
        let idle = limits.deadline(streaming: false, busy: false, lastActivity: 1000, partialSince: nil)
        #expect(idle?.at == 301_000)
        #expect(idle?.reason == .idle)
        let partial = limits.deadline(streaming: false, busy: false, lastActivity: 5000, partialSince: 2000)
        #expect(partial?.at == 32_000)
        #expect(partial?.reason == .unfinishedMessage)
        #expect(limits.deadline(streaming: true, busy: true, lastActivity: 0, partialSince: nil) == nil)
        #expect(limits.deadline(streaming: false, busy: true, lastActivity: 0, partialSince: 10) == nil)
    }

    @Test("Should keep monotonic-millisecond deadlines per connection in one heap, nearest first")
    func deadlineHeap() {
        var heap = DeadlineHeap<UInt64, UInt64>()
        heap.schedule(16, at: 300_000)
        heap.schedule(17, at: 30_000)
        heap.schedule(18, at: 5000)
        #expect(heap.next?.key == 18)
        // Activity moves a deadline later; a partial message brings one nearer.
        heap.schedule(18, at: 400_000)
        heap.schedule(16, at: 1000)
        #expect(heap.next?.key == 16)
        heap.cancel(16)
        #expect(heap.popDue(at: 30_000) == [17])
        #expect(heap.next?.deadline == 400_000)
        #expect(heap.count == 1)
    }
}
