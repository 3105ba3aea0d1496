import Foundation
import Testing
import VaultClient
import VaultCore

/// vaultd's serving loops (`ServingThreads=`), against the running daemon:
/// connections spread over the loops are each answered, and an event
/// reaches every subscriber once, whichever loop serves it.
@Suite("Serving loops of the running daemon", .ownThreads, .timeLimit(.minutes(5)))
struct ServingLoopsTests {
    static let token = "tok_loops_abcdefghijklmnop"

    @Test("Should serve from 16 loops unless ServingThreads= says otherwise, and say so when ready")
    func loopCount() throws {
        let defaulted = try DaemonFixture()
        #expect(defaulted.daemon?.output.text.contains("servingThreads=16") == true)
        let configured = try DaemonFixture(start: false)
        try "[Vault]\nServingThreads=3\n\n[Provider demo]\nType=static\n".write(
            toFile: configured.configPath, atomically: true, encoding: .utf8)
        let daemon = try configured.start()
        #expect(daemon.output.text.contains("servingThreads=3"), "\(daemon.output.text)")
    }

    @Test("Should answer every connection and give every subscriber each event once, across three loops")
    func acrossLoops() throws {
        let fixture = try DaemonFixture(start: false)
        try "[Vault]\nServingThreads=3\n\n[Provider demo]\nType=static\n".write(
            toFile: fixture.configPath, atomically: true, encoding: .utf8)
        try fixture.start()
        let user = uniqueName("loops")
        // Opened one after the other: two on each loop.
        let subscribers = try (0..<6).map { _ in
            try RecordedStream(fixture.socketPath, provider: "demo", user: user, timeoutSeconds: 30)
        }
        let readers = try (0..<6).map { _ in try VaultConnection(path: fixture.socketPath, timeoutSeconds: 30) }
        try readers[0].login(provider: "demo", user: user, token: ServingLoopsTests.token)
        for (n, reader) in readers.enumerated() {
            #expect(
                try reader.token(provider: "demo", user: user).value.revealed == ServingLoopsTests.token, "reader \(n)")
        }
        try readers[1].forceLogout(provider: "demo", user: user, reason: "revoked")
        for (n, subscriber) in subscribers.enumerated() {
            #expect(describeEvent(try subscriber.event()) == "loginSuccess demo/\(user)", "subscriber \(n)")
            #expect(
                describeEvent(try subscriber.event()) == "kickedOffline demo/\(user)",
                "subscriber \(n), once each, in order")
        }
        let gone = replyError { try readers[5].token(provider: "demo", user: user) }
        #expect(gone?.code == "ERR_NOT_LOGGED_IN")
    }
}
