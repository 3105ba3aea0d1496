import Foundation
import Glibc
import Testing
import Varlink
import VaultClient
import VaultCore

/// An account vaultd keeps logged in (`AutoLogin=yes`) at a client
/// credentials provider that gives no refresh token, the common service
/// account: each token is minted anew ahead of its expiry, like a refresh,
/// against the real vaultd, keyring, token server and `vaultctl exec`.
@Suite("Kept-alive accounts", .serialized, .requiresKeyring, .ownThreads, .timeLimit(.minutes(5)))
struct KeepAliveTests {
    /// The lines of `path` (empty while it does not exist).
    func lines(_ path: String) -> [String] {
        ((try? String(contentsOfFile: path, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
    }

    /// Should give a kept-alive account its next 6 s token ahead of expiry,
    /// over several lifetimes (four refreshes, about 18 s; under `--soak`
    /// thirty, about two and a half minutes), with `tokenRefreshed` each
    /// time, no `tokenExpired` or logout, no GetToken answered with an error,
    /// and a `vaultctl exec` program that keeps running (restarted with each
    /// new token).
    ///
    /// A new token is handed out only once the store holds it, so a store
    /// write slower than the token's whole life leaves nothing valid to
    /// serve. The keyring all suites share stalls under CI's load: a 3 s
    /// token once failed so (made at will by SIGSTOPping gnome-keyring for
    /// 3.6 s: `storedAfterMs=3337`, the same ERR_TOKEN_EXPIRED), and a 6 s
    /// one when a write took 9.2 s. So the sessions are in this daemon's own
    /// SQLite database; refreshes through the keyring are RefreshTests'.
    @Test func mintsAheadOfExpiryWithNoGap() async throws {
        let refreshes = Soak.size(short: 4, long: 30)
        let server = try TokenServer(["--lifetime", "6", "--no-client-refresh-token"])
        let user = uniqueName("bot")
        let fixture = try DaemonFixture(
            oauthServer: server, extra: "\n[Account oauth \(user)]\nAutoLogin=yes\n", start: true, engine: .sqlite)
        let socket = fixture.socketPath
        _ = try await fixture.awaitToken("oauth", user)
        let watcher = try subscription(socket, provider: "oauth", user: user, timeoutSeconds: 30).watcher

        let out = fixture.directory.path("tokens")
        let marker = "3\(Int.random(in: 100...999))7"
        let (exec, _, execErrors) = try startInterruptible(
            Binaries.vaultctl.path,
            [
                "--socket", socket, "exec", "--env", "TOK", "oauth", user, "--", "/bin/sh", "-c",
                "echo \"$TOK\" >> \(out); exec sleep \(marker)",
            ])
        defer { if exec.isRunning { kill(exec.processIdentifier, SIGKILL) } }
        #expect(try await eventually({ lines(out) }, until: { $0.count >= 1 }).count >= 1, "\(execErrors.text)")

        // GetToken read over and over while the tokens turn over: each
        // answer that is not a token is a line in `gaps`. Bounded by a count
        // and ended by the `stop` file.
        let gaps = fixture.directory.path("gaps")
        let reads = fixture.directory.path("reads")
        let stop = fixture.directory.path("stop")
        let (reader, _, readerErrors) = try startInterruptible(
            "/bin/sh",
            [
                "-c",
                "i=0; while [ $i -lt 50000 ] && [ ! -e \(stop) ]; do "
                    + "if answer=$(\(Binaries.vaultctl.path) --socket \(socket) token oauth \(user) 2>&1); "
                    + "then echo . >> \(reads); else echo \"$answer\" >> \(gaps); fi; i=$((i+1)); done",
            ])
        defer { if reader.isRunning { kill(reader.processIdentifier, SIGKILL) } }

        // Waits on the events themselves: the refreshes, or the first sign
        // of a lapse; bounded by a count of events and the subscription's
        // read timeout.
        let lapses: Set = ["tokenExpired", "tokenInvalid", "logoutSuccess", "loginSuccess", "kickedOffline"]
        var kinds: [String] = []
        for _ in 0..<(refreshes * 4 + 10) where kinds.filter({ $0 == "tokenRefreshed" }).count < refreshes {
            guard let event = try watcher.nextReply()?.parameters["event"] else { break }
            kinds.append(event["kind"]?.stringValue ?? "?")
            if lapses.contains(kinds.last!) { break }
        }
        #expect(FileManager.default.createFile(atPath: stop, contents: nil))
        #expect(try reap(reader) == 0, "\(readerErrors.text)")

        #expect(kinds.filter { $0 == "tokenRefreshed" }.count == refreshes, "\(kinds)")
        #expect(lapses.isDisjoint(with: kinds), "\(kinds)")
        let failed = lines(gaps)
        // How long each refresh's tokens waited for the store: a gap needs a
        // write that took about the whole 6 s of the new token's life.
        let writes = (fixture.daemon?.allOutput ?? "").split(separator: "\n").filter { $0.contains("storedAfterMs") }
        #expect(
            failed.isEmpty,
            "GetToken failed \(failed.count) times, first: \(failed.first ?? ""); refreshes: \(writes.joined(separator: " | "))"
        )
        #expect(lines(reads).count >= refreshes, "\(lines(reads).count) tokens read")
        #expect(exec.isRunning, "vaultctl exec kept running: \(execErrors.text)")
        #expect(!execErrors.text.contains("tokenExpired"), "\(execErrors.text)")
        // Each new token was minted (no refresh token to refresh with), and
        // the program runs with the current one.
        let stats = try await server.stats()
        #expect(stats["refresh_requests"]?.integerValue == 0, "\(stats)")
        #expect((stats["client_credentials_requests"]?.integerValue ?? 0) >= Int64(refreshes + 1), "\(stats)")
        let current = try vaultctl(socket, ["token", "oauth", user]).stdout.trimmingCharacters(in: .newlines)
        let seen = try await eventually({ lines(out) }, until: { $0.last == current })
        #expect(seen.last == current, "\(execErrors.text)")
        #expect(try await server.accepts(current))

        // A client's logout is left alone: the program is stopped as before.
        #expect(try vaultctl(socket, ["logout", "oauth", user]).status == 0)
        #expect(try reap(exec) == 75, "\(execErrors.text)")
    }
}
