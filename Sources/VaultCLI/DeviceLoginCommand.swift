import Glibc
import Varlink
import VaultClient
import VaultCore
import VaultSystem

extension VaultCtl {
    /// `login PROVIDER USER --device`: shows where to go and the code to
    /// enter, then waits while vaultd polls the provider; Ctrl-C ends
    /// vaultctl, and with it the polling.
    mutating func deviceLogin(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        for other in ["--token-file", "--expires-at", "--profile-file"] where command.value(other) != nil {
            return usage("login: --device takes no \(other): the provider issues the tokens", command: "login")
        }
        if command.has("--from-provider") {
            return usage("login: --device and --from-provider are two ways to log in; pick one", command: "login")
        }
        let vault: VaultConnection
        let start: DeviceLoginStart
        do throws(VaultClientError) {
            // A poll waits up to 25 seconds for its turn, then for the provider.
            vault = try VaultConnection(path: socketPath, timeoutSeconds: timeoutSeconds + 30)
            if let done = alreadyLoggedIn(vault, provider, user, command) { return done }
            start = try vault.startDeviceLogin(
                provider: provider, user: user, ownerUID: owner, replace: command.has("--replace"))
        } catch {
            return report(error)
        }
        show(start, provider: provider, user: user)
        // Bounded by the code's lifetime: vaultd answers LoginExpired past it.
        let deadline = Monotonic.milliseconds() + UInt64(start.expiresIn + 60) * 1000
        for _ in 0..<(start.expiresIn + 64) where Monotonic.milliseconds() < deadline {
            do throws(VaultClientError) {
                guard case .done(let result) = try vault.pollDeviceLogin(start.login) else { continue }
                output.out(json ? loginJSON(result).text : "\(loginWhat(result)): \(describe(result.session))")
                return .ok
            } catch {
                return report(error)
            }
        }
        output.err("vaultctl: the device login of \(user) @ \(provider) did not finish in time; start it again")
        return .daemonError
    }

    /// What the user must do, each address and the code on a line of its own.
    func show(_ start: DeviceLoginStart, provider: String, user: String) {
        if json {
            var fields: [String: JSON] = [
                "userCode": .string(start.userCode), "verificationUri": .string(start.verificationURI),
                "expiresIn": .int(start.expiresIn), "interval": .int(start.interval),
            ]
            fields["verificationUriComplete"] = start.verificationURIComplete.map(JSON.string)
            output.out(JSON.object(fields).text)
            return
        }
        var lines = [
            "To log \(user) in at \(provider), open this address in a browser:", start.verificationURI,
            "and enter the code:", start.userCode,
        ]
        if let complete = start.verificationURIComplete {
            lines += ["or open this address, which holds the code:", complete]
        }
        let minutes = (start.expiresIn + 59) / 60
        lines.append("Waiting for the login (the code is valid for \(minutes) min; Ctrl-C cancels)...")
        output.out(lines.joined(separator: "\n"))
    }

    /// An interactive login (--device, --browser) of an account that has a
    /// session already ends before it begins, as `login` does: "already
    /// logged in", and nothing for the user to approve. With --replace, or
    /// when there is no session the caller can read, nil: go on. (vaultd
    /// revokes the tokens of one that began anyway and finds the session.)
    func alreadyLoggedIn(_ vault: VaultConnection, _ provider: String, _ user: String, _ command: ParsedCommand)
        -> ExitCode?
    {
        guard !command.has("--replace"),
            let session = try? vault.session(provider: provider, user: user, ownerUID: owner), session.state == .logged
        else { return nil }
        let result = LoginResult(session: session, created: false)
        output.out(json ? loginJSON(result).text : "\(loginWhat(result)): \(describe(session))")
        return .ok
    }
}
