import Foundation
import Glibc
import Testing
import VaultCore

/// Where sd_journal_sendv writes.
let journalSocketPath = "/run/systemd/journal/socket"

/// Logging to journald through its native protocol. Machines of this kind run
/// no journald, so the test plays journald: it binds the journal's socket and
/// reads the datagrams sd_journal_sendv writes. Where a real journald owns the
/// socket the test does not run.
@Suite(
    "vaultd logging to the journal", .requiresKeyring, .serialized, .ownThreads, .timeLimit(.minutes(5)),
    .enabled(if: !FileManager.default.fileExists(atPath: journalSocketPath)))
struct JournalTests {
    static let socketPath = journalSocketPath

    @Test("Should send structured fields to the journal when stderr is the journal, and never a token")
    func structuredFields() throws {
        let directory = "/run/systemd/journal"
        let createdDirectory = !FileManager.default.fileExists(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let journal = try NotifyListener(path: JournalTests.socketPath)
        defer {
            unlink(JournalTests.socketPath)
            if createdDirectory { rmdir(directory) }
        }
        let dir = try TemporaryDirectory()
        let config = dir.path("vaultd.conf")
        try "[Provider demo]\nType=static\n".write(toFile: config, atomically: true, encoding: .utf8)
        let socket = dir.path("s")
        // JOURNAL_STREAM tells a service that systemd connected its stderr to the journal.
        let daemon = try RunningDaemon(
            socketPath: socket, configPath: config, environment: ["JOURNAL_STREAM": "8:12345"], waitForReady: false)
        defer { daemon.stop() }
        let ready = try #require(journal.wait(for: "MESSAGE=ready"))
        #expect(ready.contains("SYSLOG_IDENTIFIER=vaultd"))
        #expect(ready.contains("PRIORITY=5"))

        let user = uniqueName("journal")
        #expect(try vaultctl(socket, ["login", "demo", user], input: DaemonTests.token).status == 0)
        let login = try #require(journal.wait(for: "VAULTD_EVENT=loginSuccess"))
        #expect(login.contains("MESSAGE=logged in"))
        #expect(login.contains("VAULTD_PROVIDER=demo"))
        #expect(login.contains("VAULTD_USER=\(user)"))
        #expect(login.contains("PRIORITY=6"))
        let audit = try #require(journal.wait(for: "MESSAGE=audit"))
        #expect(audit.contains("VAULTD_ACTION=Login"))
        #expect(audit.contains("VAULTD_RESULT=ok"))

        try expectFailure(vaultctl(socket, ["logout", "demo", uniqueName("nobody")]))
        let refused = try #require(journal.wait(for: "VAULTD_ACTION=Logout"))
        #expect(refused.contains("VAULTD_RESULT=ERR_NOT_LOGGED_IN"))

        #expect(try vaultctl(socket, ["logout", "demo", user]).status == 0)
        #expect(journal.wait(for: "VAULTD_EVENT=logoutSuccess") != nil)
        #expect(!journal.messages.joined().contains(DaemonTests.token))
        #expect(!daemon.output.text.contains("logged in"), "nothing on stderr when the journal takes the lines")
    }
}
