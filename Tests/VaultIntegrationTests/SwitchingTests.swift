import Foundation
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// OpenIM's account switching: a provider with SingleAccount=yes keeps one
/// logged-in user, and a login of another waits for the old logout.
@Suite("Account switching", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct SwitchingTests {
    @Test("Should log the old account out, then the new one in, with SingleAccount=yes")
    func singleAccountSwitches() async throws {
        let dir = try TemporaryDirectory()
        let config = dir.path("vaultd.conf")
        try "[Provider chat]\nType=static\nSingleAccount=yes\n[Provider other]\nType=static\n".write(
            toFile: config, atomically: true, encoding: .utf8)
        let socket = dir.path("s")
        let daemon = try RunningDaemon(socketPath: socket, configPath: config)
        defer { daemon.stop() }
        let first = uniqueName("first")
        let second = uniqueName("second")
        let bystander = uniqueName("by")

        let watcher = try VarlinkClient.raw(socket)
        try watcher.send(
            JSON.object(["method": .string(VaultMethod.subscribe.rawValue), "more": true]).text)
        #expect(try watcher.nextReply()?.parameters["sessions"] != nil)

        #expect(try vaultctl(socket, ["login", "chat", first], input: DaemonTests.token).status == 0)
        #expect(try vaultctl(socket, ["login", "other", bystander], input: DaemonTests.token).status == 0)
        #expect(try vaultctl(socket, ["login", "chat", second], input: DaemonTests.token).status == 0)

        var kinds: [String] = []
        for _ in 0..<4 {
            guard let event = try watcher.nextReply()?.parameters["event"] else { break }
            kinds.append(
                "\(event["kind"]?.stringValue ?? "") \(event["user"]?.stringValue ?? "") \(event["reason"]?.stringValue ?? "")"
            )
        }
        #expect(
            kinds == [
                "loginSuccess \(first) ", "loginSuccess \(bystander) ", "kickedOffline \(first) switched",
                "loginSuccess \(second) ",
            ])
        #expect(try vaultctl(socket, ["status", "chat", first]).stderr.contains("ERR_NOT_LOGGED_IN"))
        #expect(try await StoreReader(socketPath: socket).holds(provider: "chat", user: first) == false)
        #expect(try vaultctl(socket, ["status", "other", bystander]).status == 0, "other providers are untouched")
        #expect(try vaultctl(socket, ["logout", "chat", second]).status == 0)
        #expect(try vaultctl(socket, ["logout", "other", bystander]).status == 0)
    }
}
