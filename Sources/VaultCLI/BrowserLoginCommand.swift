import Glibc
import Varlink
import VaultClient
import VaultCore
import VaultProtocol
import VaultSystem

/// `vaultctl login PROVIDER USER --browser`: the authorization code grant
/// with PKCE on a loopback redirect. vaultctl listens on 127.0.0.1, vaultd
/// makes the verifier and the authorization URL, the user's browser brings
/// the code back to the listener, and vaultd exchanges it.
extension VaultCtl {
    mutating func browserLogin(_ command: ParsedCommand) -> ExitCode {
        guard command.has("--browser") else { return usage("login: --no-open is for --browser", command: "login") }
        for other in ["--token-file", "--expires-at", "--profile-file"] where command.value(other) != nil {
            return usage("login: \(other) is not for --browser", command: "login")
        }
        if command.has("--from-provider") {
            return usage("login: --from-provider and --browser exclude each other", command: "login")
        }
        let (provider, user) = (command.arguments[0], command.arguments[1])
        do throws(VaultClientError) {
            if let done = alreadyLoggedIn(try connect(), provider, user, command) { return done }
        } catch {
            return report(error)
        }
        let listener: LoopbackListener
        switch LoopbackListener.open() {
        case .success(let opened): listener = opened
        case .failure(let error):
            output.err("vaultctl: cannot listen for the browser's redirect: \(error)")
            return .daemonError
        }
        let start: BrowserLoginStart
        do throws(VaultClientError) {
            start = try connect().beginBrowserLogin(
                provider: provider, user: user, redirectURI: listener.redirectURI, ownerUID: owner,
                replace: command.has("--replace"))
        } catch {
            return report(error)
        }
        output.err(
            "Open this URL in a browser to log \(user) in at \(provider); waiting for its redirect to \(listener.redirectURI) until \(Format.time(start.expiresAt.seconds)) (Ctrl-C cancels):"
        )
        output.out(start.authorizationURL)
        var opener = command.has("--no-open") ? nil : openInBrowser(start.authorizationURL)
        let code: Secret
        switch awaitRedirect(listener, start, opener: &opener) {
        case .success(let received): code = received
        case .failure(let error): return fail(error)
        }
        return run { vault throws(VaultClientError) in
            let result = try vault.finishBrowserLogin(login: start.login, code: code, state: start.state)
            return (loginJSON(result), "\(loginWhat(result)): \(describe(result.session))")
        }
    }

    /// Takes requests at `listener` until the redirect of `start` comes, or
    /// its login expires: the code, or why there is none. Other requests get
    /// a 404. `opener` is xdg-open while it runs; its failure is told once.
    func awaitRedirect(_ listener: LoopbackListener, _ start: BrowserLoginStart, opener: inout pid_t?)
        -> Result<Secret, VaultError>
    {
        let wallLeft = max(0, start.expiresAt.seconds - Int64(time(nil)))
        let deadline = Monotonic.milliseconds() + UInt64(wallLeft) * 1000
        // Bounded by the deadline: each pass waits at most a second.
        while Monotonic.milliseconds() < deadline {
            if let pid = opener { opener = reportOpener(pid) }
            let left = deadline - Monotonic.milliseconds()
            guard let client = listener.accept(within: Int32(min(left, 1000))) else { continue }
            let line = LoopbackListener.requestLine(client, deadline: min(deadline, Monotonic.milliseconds() + 30_000))
            switch line.map({ LoopbackRedirect.parse(requestLine: $0) }) ?? .other {
            case .other:
                LoopbackListener.answer(client, status: "404 Not Found", "Not the redirect vaultctl waits for.")
            case .error(let code, let description, let state):
                // An error redirect of another login (or anyone's forgery) neither
                // ends this one with the words it brings nor is shown.
                guard Self.isThisLogins(state, start) else { return Self.refuseForeign(client) }
                LoopbackListener.answer(
                    client, status: "200 OK", "The login was refused. Go back to the terminal to see why.")
                let said = description.map { ": " + LoopbackRedirect.printable($0) } ?? ""
                let printable = LoopbackRedirect.printable(code)
                return .failure(
                    VaultError(
                        .authorizationFailed,
                        "the authorization server refused the login (\(printable)\(said)); nothing was sent to the token endpoint",
                        providerCode: ProviderFailure.providerCode(code, kind: .authorizationFailed),
                        providerMessage: description.map(LoopbackRedirect.printable)))
            case .code(let code, let state):
                guard Self.isThisLogins(state, start) else { return Self.refuseForeign(client) }
                LoopbackListener.answer(
                    client, status: "200 OK", "vaultctl has the authorization. Go back to the terminal.")
                return .success(Secret(code))
            }
        }
        return .failure(
            VaultError(
                .authorizationFailed,
                "no redirect came before the login expired at \(Format.time(start.expiresAt.seconds)); log in again"))
    }

    /// True when a redirect's `state` is the login's (compared in constant time).
    static func isThisLogins(_ state: String?, _ start: BrowserLoginStart) -> Bool {
        guard let state else { return false }
        return SHA256.constantTimeEqual(Array(state.utf8), Array(start.state.utf8))
    }

    /// Answers a redirect whose state is not the login's, and ends the login.
    static func refuseForeign(_ client: Int32) -> Result<Secret, VaultError> {
        LoopbackListener.answer(
            client, status: "400 Bad Request",
            "This redirect does not belong to the login vaultctl started. Go back to the terminal.")
        return .failure(
            VaultError(
                .authorizationFailed,
                "the redirect's state is not the one of this login (a redirect of another login, or a forged one); nothing it brought was used"
            ))
    }

    /// Runs `xdg-open url`, its output discarded; nil (having said so) when it cannot be run.
    func openInBrowser(_ url: String) -> pid_t? {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        let words: [String] = ["xdg-open", url]
        var arguments = words.map { strdup($0) } + [nil]
        defer { for pointer in arguments { free(pointer) } }
        var pid: pid_t = 0
        let result = posix_spawnp(&pid, "xdg-open", &actions, nil, &arguments, environ)
        guard result == 0 else {
            output.err(
                "vaultctl: cannot run xdg-open (\(String(cString: strerror(result)))); open the URL above yourself")
            return nil
        }
        return pid
    }

    /// Looks at the xdg-open `pid` without waiting: nil once it ended (and
    /// its failure, if it failed, was told), else `pid`.
    func reportOpener(_ pid: pid_t) -> pid_t? {
        var status: Int32 = 0
        let reaped = waitpid(pid, &status, WNOHANG)
        if reaped == 0 { return pid }
        let exited = status & 0x7f == 0
        let code = (status >> 8) & 0xff
        if reaped < 0 || !exited || code != 0 {
            let how = reaped < 0 ? "could not be waited for" : exited ? "exited with \(code)" : "was killed"
            output.err("vaultctl: xdg-open \(how); open the URL above yourself (still waiting)")
        }
        return nil
    }

    /// Reports an error of vaultctl's own as `report` does vaultd's.
    func fail(_ error: VaultError) -> ExitCode {
        if json {
            var fields: [String: JSON] = [
                "error": .string("\(VaultInterface.name).\(error.code.varlinkErrorName)"),
                "code": .string(error.code.seedCode), "message": .string(error.message),
            ]
            fields["providerCode"] = error.providerCode.map(JSON.string)
            fields["providerMessage"] = error.providerMessage.map(JSON.string)
            output.err(JSON.object(fields).text)
        } else {
            let provider = error.providerCode.map { "; provider: \($0)" } ?? ""
            output.err("vaultctl: \(error.message) (\(error.code.seedCode)\(provider))")
        }
        return .daemonError
    }
}
