import Testing
import Varlink
import VaultCore

@testable import VaultCLI
@testable import VaultClient

/// What `watch`, `list` and `status` print in their columns.
@Suite("vaultctl columns", .timeLimit(.minutes(5)))
struct ColumnsTests {
    @Test("Should keep watch's columns for every kind of event")
    func watchColumns() {
        let ctl = VaultCtl()
        let lines = EventKind.allCases.map { kind in
            ctl.describeEvent(
                .object([
                    "kind": .string(kind.rawValue), "time": .int(1_800_000_000), "provider": "demo", "user": "alice",
                ]))
        }
        let columns = Set(lines.map { $0.distance(from: $0.startIndex, to: $0.range(of: "alice @ demo")!.lowerBound) })
        #expect(columns.count == 1, "\(lines.joined(separator: "\n"))")
        for line in lines { #expect(line.contains("  alice @ demo"), "two spaces at least: \(line)") }
    }

    @Test("Should name an owner by the user's name from the password file, or by the uid when no user has it")
    func ownerNames() {
        let passwd = """
            root:x:0:0:root:/root:/bin/bash
            alice:x:1000:1000:Alice,,,:/home/alice:/bin/bash
            broken:x:notanumber:1::/:/bin/false
            alias:x:1000:1000::/:/bin/false
            """
        #expect(UserLookup.name(uid: 0, inPasswd: passwd) == "root")
        #expect(UserLookup.name(uid: 1000, inPasswd: passwd) == "alice", "the first line with the uid")
        #expect(UserLookup.name(uid: 1001, inPasswd: passwd) == nil)
        // This machine's password file has root; no user has uid 4000000000.
        #expect(VaultCtl().ownerName(0) == "root")
        #expect(VaultCtl().ownerName(4_000_000_000) == "4000000000")
    }
}
