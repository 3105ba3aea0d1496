import Foundation
import Glibc
import Testing
import VaultClient
import VaultCore
import VaultProtocol

/// Local stand-ins of the CometChat and OpenIM REST APIs (Tests/servers/chat_standins.py).
final class ChatStandIns {
    private let server: PythonServer
    var url: String { server.url }

    init() throws { server = try PythonServer("chat_standins.py", ["--openim-lifetime", "5"]) }
}

/// The exec providers of config/examples, against local stand-ins of the
/// CometChat and OpenIM server APIs.
@Suite("exec providers", .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)), .serialized)
struct ExecProviderTests {
    func start(_ standIns: ChatStandIns) throws -> DaemonFixture {
        let fixture = try DaemonFixture(start: false)
        let examples = Binaries.packageRoot.appendingPathComponent("config/examples").path
        let cometchat = fixture.directory.path("cometchat.json")
        let openim = fixture.directory.path("openim.json")
        try #"{"base_url": "\#(standIns.url)/cometchat/v3", "api_key": "test-api-key"}"#.write(
            toFile: cometchat, atomically: true, encoding: .utf8)
        try
            #"{"api_url": "\#(standIns.url)/openim", "admin_user_id": "imAdmin", "secret": "openIM123", "platform_id": 5}"#
            .write(toFile: openim, atomically: true, encoding: .utf8)
        try fixture.configure(
            """
            [Provider cometchat]
            Type=exec
            Command=\(examples)/cometchat-helper --config \(cometchat)
            Timeout=15s

            [Provider openim]
            Type=exec
            Command=\(examples)/openim-helper --config \(openim)
            Timeout=15s
            """)
        try fixture.start()
        return fixture
    }

    @Test("Should log in through the CometChat helper and report the seeds' error codes")
    func cometChat() throws {
        let standIns = try ChatStandIns()
        let fixture = try start(standIns)
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "cometchat", "alice", "--from-provider"]))
        let token = try vaultctl(fixture.socketPath, ["token", "cometchat", "alice"]).stdout
        #expect(token.hasPrefix("cc_alice_"))
        try expectSuccess(vaultctl(fixture.socketPath, ["refresh", "cometchat", "alice"]))
        let second = try vaultctl(fixture.socketPath, ["token", "cometchat", "alice"]).stdout
        #expect(second.hasPrefix("cc_alice_") && second != token, "refresh forces a new auth token")

        try expectFailure(
            vaultctl(fixture.socketPath, ["login", "cometchat", "carol", "--from-provider"]),
            saying: "ERR_USER_DEACTIVATED")
        let unknown = try vaultctl(fixture.socketPath, ["login", "cometchat", "zed", "--from-provider"])
        #expect(unknown.stderr.contains("ERR_UID_NOT_FOUND"))
        #expect(try vaultctl(fixture.socketPath, ["logout", "cometchat", "alice"]).status == 0)
        let daemon = try #require(fixture.daemon)
        #expect(!daemon.allOutput.contains(token.trimmingCharacters(in: .whitespacesAndNewlines)))
        #expect(!daemon.allOutput.contains("test-api-key"))
    }

    @Test("Should refresh an OpenIM user token through the helper before it expires")
    func openIMRefreshes() throws {
        let standIns = try ChatStandIns()
        let fixture = try start(standIns)
        let watcher = try subscription(fixture.socketPath, provider: "openim", user: "bob").watcher
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "openim", "bob", "--from-provider"]))
        let first = try vaultctl(fixture.socketPath, ["token", "openim", "bob"]).stdout
        #expect(first.hasPrefix("oi_bob_"))
        var refreshed = false
        for _ in 0..<10 {
            guard let event = try watcher.nextReply()?.parameters["event"] else { break }
            if event["kind"]?.stringValue == "tokenRefreshed" {
                refreshed = true
                break
            }
        }
        #expect(refreshed, "the 5 s OpenIM token is refreshed before it expires")
        let second = try vaultctl(fixture.socketPath, ["token", "openim", "bob"]).stdout
        #expect(second.hasPrefix("oi_bob_") && second != first)
        #expect(try vaultctl(fixture.socketPath, ["logout", "openim", "bob"]).status == 0)
    }

    /// A daemon whose provider `name` runs `script` as its helper (extra
    /// config lines follow the provider's), logged in once as alice through
    /// it; returns the fixture and alice's token.
    func loginThroughHelper(
        _ name: String, extraConfig: String = "", script: (DaemonFixture) -> String
    ) throws -> (DaemonFixture, String) {
        let fixture = try DaemonFixture(start: false)
        let helper = fixture.directory.path("\(name)-helper")
        try writeExecutable(script(fixture), to: helper)
        try fixture.configure("[Provider \(name)]\nType=exec\nCommand=\(helper)\n\(extraConfig)")
        try fixture.start()
        try expectSuccess(vaultctl(fixture.socketPath, ["login", name, "alice", "--from-provider"]))
        return (fixture, try fixture.token(name, "alice"))
    }

    @Test("Should start a helper with no signal blocked or ignored and only the documented environment")
    func helperProcessState() throws {
        // The token reports what the helper inherited: blocked and ignored
        // signal masks, and the names of its environment variables.
        let (fixture, token) = try loginThroughHelper("state") { _ in
            """
            #!/bin/sh
            cat >/dev/null
            blocked=$(sed -n 's/^SigBlk:[[:space:]]*//p' /proc/$$/status)
            ignored=$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/$$/status)
            names=$(env | cut -d= -f1 | grep -v '^PWD$' | sort | tr '\\n' '.')
            printf '{"access_token":"blk-%s-ign-%s-env-%s"}' "$blocked" "$ignored" "$names"
            """
        }
        let parts = token.split(separator: "-", maxSplits: 5).map(String.init)
        try #require(parts.count == 6 && parts[0] == "blk" && parts[2] == "ign" && parts[4] == "env", "\(token)")
        // Signals 1 to 31; glibc keeps 32 and 33 for itself, beyond a program's reach.
        let standard: UInt64 = 0x7FFF_FFFF
        #expect(UInt64(parts[1], radix: 16).map { $0 & standard } == 0, "no signal blocked: \(token)")
        #expect(UInt64(parts[3], radix: 16).map { $0 & standard } == 0, "no signal ignored: \(token)")
        let names = Set(parts[5].split(separator: ".").map(String.init))
        #expect(names.contains("PATH"))
        #expect(names.isSubset(of: ["PATH", "HOME", "LANG", "CREDENTIALS_DIRECTORY", "SHLVL", "_"]), "\(names)")
        _ = try vaultctl(fixture.socketPath, ["logout", "state", "alice"])
    }

    @Test("Should start a helper with no descriptor of vaultd's but its standard input, output and error")
    func helperDescriptors() throws {
        // Python, not a shell: a shell keeps descriptors of its own. fstat opens
        // nothing. An oauth2 provider too, so that libcurl is loaded in vaultd.
        let oauth2 = "\n[Provider web]\nType=oauth2\nTokenURL=http://127.0.0.1:9/t\nClientID=c\n"
        let (fixture, token) = try loginThroughHelper("fds", extraConfig: oauth2) { _ in
            """
            #!/usr/bin/python3
            import os, sys
            sys.stdin.read()
            found = []
            for fd in range(3, 4096):
                try:
                    os.fstat(fd)
                    found.append(str(fd))
                except OSError:
                    pass
            print('{"access_token": "fds-%s-end-padding-abcdefgh"}' % (".".join(found) or "none"))
            """
        }
        #expect(token.hasPrefix("fds-none-end"), "descriptors inherited from vaultd: \(token)")
        _ = try vaultctl(fixture.socketPath, ["logout", "fds", "alice"])
    }

    @Test("Should take a helper's answer even when a child it left behind keeps its output open, and kill that child")
    func helperWithLingeringChild() async throws {
        let (fixture, token) = try loginThroughHelper("forking", extraConfig: "Timeout=20s\n") { fixture in
            """
            #!/bin/sh
            # Leaves a child holding stdout and stderr, as a careless helper might.
            input=$(cat)
            case "$input" in
            *'"action":"login"'*)
                sleep 30 &
                echo $! > \(fixture.directory.path("child.pid")) ;;
            esac
            echo '{"access_token":"forked_token_abcdefghijklmnop"}'
            """
        }
        #expect(token.hasPrefix("forked_token_"))
        _ = try vaultctl(fixture.socketPath, ["logout", "forking", "alice"])
        let childPID = try String(contentsOfFile: fixture.directory.path("child.pid"), encoding: .utf8)
        let pid = try #require(Int32(childPID.trimmingCharacters(in: .whitespacesAndNewlines)))
        // Killed with the helper's process group once the answer was taken (issue 13).
        let alive = try await eventually({ processAlive(pid) }, until: { !$0 })
        if alive { kill(pid, SIGKILL) }
        #expect(!alive, "the helper's child is left running")
    }

    @Test("Should store the token a client brings to an exec provider, and have the helper mint only when asked")
    func heldTokenKept() throws {
        let (fixture, minted) = try loginThroughHelper("held") { _ in
            """
            #!/bin/sh
            cat >/dev/null
            echo '{"access_token":"minted_token_abcdefghijklmnop"}'
            """
        }
        #expect(minted == "minted_token_abcdefghijklmnop", "--from-provider has the helper mint")
        let held = "held_token_" + uniqueName("cc")
        try expectSuccess(vaultctl(fixture.socketPath, ["login", "held", "bob"], input: held))
        let token = try vaultctl(fixture.socketPath, ["token", "held", "bob"]).stdout
        #expect(token.trimmingCharacters(in: .whitespacesAndNewlines) == held, "the held token was replaced")
    }
}
