import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore
import VaultProtocol

/// Tokens without an expiry, the tokens an exec helper's refresh replaced,
/// and the helper's errors, against the real vaultd, the keyring, the
/// example cometchat-helper and the CometChat stand-in (Tests/servers/chat_standins.py).
@Suite(
    "exec helpers: expiry, replaced tokens and errors", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)),
    .serialized)
struct HelperExpiryTests {
    static let examples = Binaries.packageRoot.appendingPathComponent("config/examples").path

    /// A fixture (not started) with one provider, `cometchat`, run by `command`
    /// (default: the example helper against `standIns`), plus `extra` lines.
    func fixture(_ standIns: ChatStandIns, command: String? = nil, apiKey: String = "test-api-key", extra: String = "")
        throws -> DaemonFixture
    {
        let fixture = try DaemonFixture(start: false)
        let settings = fixture.directory.path("cometchat.json")
        try #"{"base_url": "\#(standIns.url)/cometchat/v3", "api_key": "\#(apiKey)"}"#.write(
            toFile: settings, atomically: true, encoding: .utf8)
        try fixture.configure(
            """
            [Vault]
            MinRefreshInterval=0

            [Provider cometchat]
            Type=exec
            Command=\(command ?? "\(Self.examples)/cometchat-helper") --config \(settings)
            Timeout=15s
            \(extra)
            """)
        return fixture
    }

    /// The live auth tokens of `uid` at the CometChat stand-in.
    func liveTokens(_ standIns: ChatStandIns, _ uid: String) throws -> [String] {
        let result = try runCommand(
            URL(fileURLWithPath: "/usr/bin/curl"),
            ["-s", "-H", "apikey: test-api-key", "\(standIns.url)/cometchat/v3/users/\(uid)/auth_tokens"])
        let data = try JSON.parse(Array(result.stdout.utf8))["data"]?.arrayValue ?? []
        return data.compactMap { $0["authToken"]?.stringValue }
    }

    func status(_ fixture: DaemonFixture, _ user: String) throws -> JSON {
        try JSON.parse(Array(vaultctl(fixture.socketPath, ["--json", "status", "cometchat", user]).stdout.utf8))
    }

    @Test("Should delete the token a refresh replaced, so that after refresh and logout no token of the user is live")
    func refreshThenLogout_leavesNoLiveToken() async throws {
        let standIns = try ChatStandIns()
        let fixture = try fixture(standIns)
        try fixture.start()
        #expect(try vaultctl(fixture.socketPath, ["login", "cometchat", "alice", "--from-provider"]).status == 0)
        let first = try fixture.token("cometchat", "alice")
        #expect(try liveTokens(standIns, "alice") == [first])

        try expectSuccess(vaultctl(fixture.socketPath, ["refresh", "cometchat", "alice"]))
        let second = try fixture.token("cometchat", "alice")
        #expect(second != first && second.hasPrefix("cc_alice_"))
        // The replaced token is deleted in the background, right after the refresh.
        let live = try await eventually({ try liveTokens(standIns, "alice") }, until: { $0 == [second] })
        #expect(live == [second], "only the current token is live after the refresh")

        // CometChat tokens do not expire: no expiry, and no refresh deadline, after the refresh either.
        let session = try status(fixture, "alice")["session"]
        #expect(session?["expiresAt"] == nil, "\(session?.text ?? "")")
        #expect(session?["refresh"]?["refreshAt"] == nil, "\(session?.text ?? "")")

        #expect(try vaultctl(fixture.socketPath, ["logout", "cometchat", "alice"]).status == 0)
        let after = try await eventually({ try liveTokens(standIns, "alice") }, until: { $0.isEmpty })
        #expect(after.isEmpty, "no token of alice is live after refresh and logout: \(after)")
        let daemon = try #require(fixture.daemon)
        #expect(!daemon.allOutput.contains(first) && !daemon.allOutput.contains(second))
    }

    @Test("Should refresh on a schedule only with DefaultLifetime=, deleting every token it replaced")
    func defaultLifetime_refreshesAndDeletes() async throws {
        let standIns = try ChatStandIns()
        let fixture = try fixture(standIns, extra: "DefaultLifetime=3s")
        try fixture.start()
        #expect(try vaultctl(fixture.socketPath, ["login", "cometchat", "bob", "--from-provider"]).status == 0)
        let first = try fixture.token("cometchat", "bob")
        #expect(try status(fixture, "bob")["session"]?["expiresAt"] != nil, "DefaultLifetime= gives an expiry")
        // A scheduled refresh (at 80-90% of 3 s), and its replaced token deleted: bounded at 20 s.
        let tokens = try await eventually(
            tries: 200, interval: .milliseconds(100), { try liveTokens(standIns, "bob") },
            until: { $0.count == 1 && $0[0] != first })
        #expect(tokens.count == 1 && tokens[0] != first, "refreshed, and each replaced token deleted: \(tokens)")
        #expect(try vaultctl(fixture.socketPath, ["logout", "cometchat", "bob"]).status == 0)
        let after = try await eventually({ try liveTokens(standIns, "bob") }, until: { $0.isEmpty })
        #expect(after.isEmpty, "\(after)")
    }

    @Test("Should keep the revocation of a replaced token queued across a crash, and delete it after the restart")
    func replacedRevocation_survivesCrash() async throws {
        let standIns = try ChatStandIns()
        let dir = try TemporaryDirectory()
        let block = dir.path("revocations-fail")
        // The example helper, except that a revoke of a replaced token fails while `block` exists.
        let wrapper = dir.path("wrapper")
        try writeExecutable(
            """
            #!/bin/sh
            input=$(cat)
            case "$input" in
            *'"replaced":true'*) if [ -e \(block) ]; then
                echo 'revocations blocked by the test' >&2
                echo '{"error":"ERR_NETWORK_ERROR","message":"blocked"}'; exit 1; fi ;;
            esac
            printf '%s' "$input" | exec \(Self.examples)/cometchat-helper "$@"
            """, to: wrapper)
        #expect(FileManager.default.createFile(atPath: block, contents: Data()))
        let fixture = try fixture(standIns, command: wrapper)
        let daemon = try fixture.start()
        #expect(try vaultctl(fixture.socketPath, ["login", "cometchat", "alice", "--from-provider"]).status == 0)
        let first = try fixture.token("cometchat", "alice")
        #expect(try vaultctl(fixture.socketPath, ["refresh", "cometchat", "alice"]).status == 0)
        let second = try fixture.token("cometchat", "alice")
        // The first attempt failed (queued and retried with backoff); the process dies.
        #expect(daemon.output.wait(for: "revocations blocked by the test"), "\(daemon.output.text)")
        #expect(try liveTokens(standIns, "alice").sorted() == [first, second].sorted())
        daemon.stop(signal: SIGKILL)

        try FileManager.default.removeItem(atPath: block)
        try fixture.start()
        let live = try await eventually({ try liveTokens(standIns, "alice") }, until: { $0 == [second] })
        #expect(live == [second], "the queued revocation of the replaced token ran after the restart")
        #expect(try fixture.token("cometchat", "alice") == second, "the session goes on with the new token")
        #expect(try vaultctl(fixture.socketPath, ["logout", "cometchat", "alice"]).status == 0)
    }

    @Test("Should report a helper's refusal with vaultd's code and the helper's own code beside it")
    func helperCodesPassThrough() throws {
        let standIns = try ChatStandIns()
        let wrongKey = try fixture(standIns, apiKey: "wrong-key")
        try wrongKey.start()
        let refused = try expectFailure(
            vaultctl(wrongKey.socketPath, ["login", "cometchat", "alice", "--from-provider"]))
        #expect(
            refused.stderr.contains("(ERR_INVALID_CLIENT; provider: AUTH_ERR_APIKEY_NOT_FOUND)"), "\(refused.stderr)")

        let dir = try TemporaryDirectory()
        let helper = dir.path("invalid-key-helper")
        try writeExecutable(
            """
            #!/bin/sh
            cat >/dev/null
            echo '{"error":"ERR_INVALID_API_KEY","message":"the API key is not valid for this app"}'
            exit 1
            """, to: helper)
        let custom = try fixture(standIns, command: helper)
        try custom.start()
        let failed = try expectFailure(
            vaultctl(custom.socketPath, ["--json", "login", "cometchat", "alice", "--from-provider"]))
        let error = try JSON.parse(Array(failed.stderr.utf8))
        #expect(error["code"]?.stringValue == "ERR_INVALID_CLIENT", "\(failed.stderr)")
        #expect(error["providerCode"]?.stringValue == "ERR_INVALID_API_KEY", "\(failed.stderr)")
        #expect(error["providerMessage"]?.stringValue == "the API key is not valid for this app", "\(failed.stderr)")
    }

    @Test("Should refuse a missing or non-executable helper at --check-config, and keep the old config at reload")
    func missingHelper_isAConfigError() async throws {
        let standIns = try ChatStandIns()
        let dir = try TemporaryDirectory()
        let missing = dir.path("no-such-helper")
        let check = try fixture(standIns, command: missing)
        let refused = try runCommand(Binaries.vaultd, ["--check-config", "--config", check.configPath])
        #expect(refused.status != 0)
        #expect(
            refused.stderr.contains(
                "\(check.configPath):6: [Provider cometchat] key 'Command': the helper program cannot be found"),
            "\(refused.stderr)")
        #expect(!refused.stderr.contains(missing), "a configuration error names the line, not its value")

        let plain = dir.path("not-executable")
        try "#!/bin/sh\n".write(toFile: plain, atomically: true, encoding: .utf8)
        chmod(plain, 0o644)
        let notExecutable = try fixture(standIns, command: plain)
        let refusedToo = try runCommand(Binaries.vaultd, ["--check-config", "--config", notExecutable.configPath])
        #expect(refusedToo.status != 0 && refusedToo.stderr.contains("is not executable"), "\(refusedToo.stderr)")

        // A reload to a configuration whose helper is missing keeps the one in force.
        let fixture = try fixture(standIns)
        let daemon = try fixture.start()
        let good = try String(contentsOfFile: fixture.configPath, encoding: .utf8)
        try fixture.configure(good.replacingOccurrences(of: "\(Self.examples)/cometchat-helper", with: missing))
        kill(daemon.process.processIdentifier, SIGHUP)
        #expect(daemon.output.wait(for: "reload refused"), "\(daemon.output.text)")
        #expect(daemon.output.text.contains("the helper program cannot be found"))
        let login = try vaultctl(fixture.socketPath, ["login", "cometchat", "alice", "--from-provider"])
        #expect(login.status == 0, "the old configuration is still in force: \(login.stderr)")
        #expect(try vaultctl(fixture.socketPath, ["logout", "cometchat", "alice"]).status == 0)
    }

    @Test("Should fail with ERR_HELPER_UNAVAILABLE, not ERR_NETWORK_ERROR, when the helper vanished")
    func vanishedHelper_isHelperUnavailable() throws {
        let standIns = try ChatStandIns()
        let dir = try TemporaryDirectory()
        let helper = dir.path("helper")
        try writeExecutable(String(contentsOfFile: "\(Self.examples)/cometchat-helper", encoding: .utf8), to: helper)
        let fixture = try fixture(standIns, command: helper)
        try fixture.start()
        try FileManager.default.removeItem(atPath: helper)
        try expectFailure(
            vaultctl(fixture.socketPath, ["login", "cometchat", "alice", "--from-provider"]),
            saying: "(ERR_HELPER_UNAVAILABLE)", "cannot be run")
    }
}
