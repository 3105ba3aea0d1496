import Varlink
import VaultCore

/// What a word on vaultctl's command line stands for: how a shell completes
/// it, and for `oneOf` the only words accepted.
public enum ValueKind: Sendable, Equatable {
    /// Any text; nothing to complete.
    case text
    /// A file name.
    case file
    /// A local user name (or a uid).
    case localUser
    /// A provider, completed from the sessions vaultd lists.
    case provider
    /// A user of the provider named just before it, completed from the sessions vaultd lists.
    case user
    /// One of vaultctl's commands.
    case command
    /// Any text; these words are suggested.
    case suggest([String])
    /// Exactly one of these words.
    case oneOf([String])
}

/// One option of vaultctl or of one of its commands, as declared.
public struct OptionSpec: Sendable {
    /// The spelling, with its dashes: `--token-file`.
    public let name: String
    /// Other spellings of the same option: `-h`.
    public let aliases: [String]
    /// The name of the value in help texts (`FILE`), nil for a flag.
    public let valueName: String?
    /// What the value is, for completion.
    public let valueKind: ValueKind
    /// Whether the option may be given more than once, each value kept.
    public let repeatable: Bool
    /// One line of help.
    public let help: String

    /// A flag: an option without a value.
    static func flag(_ name: String, aliases: [String] = [], _ help: String) -> OptionSpec {
        OptionSpec(name: name, aliases: aliases, valueName: nil, valueKind: .text, repeatable: false, help: help)
    }

    /// An option that takes the next word as its value.
    static func value(
        _ name: String, _ valueName: String, _ kind: ValueKind, repeatable: Bool = false, _ help: String
    ) -> OptionSpec {
        OptionSpec(name: name, aliases: [], valueName: valueName, valueKind: kind, repeatable: repeatable, help: help)
    }

    /// Whether the option takes a value.
    public var takesValue: Bool { valueName != nil }

    /// `--token-file FILE`, `--kind KIND...`, `--json`.
    public var synopsis: String {
        guard let valueName else { return name }
        return "\(name) \(valueName)" + (repeatable ? "..." : "")
    }

    /// Whether `word` spells this option.
    func matches(_ word: String) -> Bool { word == name || aliases.contains(word) }
}

/// One positional argument of a command.
public struct ArgumentSpec: Sendable {
    /// The name in help texts: `PROVIDER`.
    public let name: String
    /// What it is, for completion and (with `oneOf`) checking.
    public let kind: ValueKind

    init(_ name: String, _ kind: ValueKind = .text) {
        self.name = name
        self.kind = kind
    }

    static let provider = ArgumentSpec("PROVIDER", .provider)
    static let user = ArgumentSpec("USER", .user)
}

/// A vaultctl command, declared once: parsing, help, usage errors and the
/// completion scripts all derive from it.
public struct CommandSpec: Sendable {
    /// The word that selects the command.
    public let name: String
    /// The arguments that must be given, in order.
    public let required: [ArgumentSpec]
    /// Arguments that follow the required ones, all of them or none.
    public let optional: [ArgumentSpec]
    /// What comes after `--`, taken as it is (`COMMAND [ARGS...]`); nil when
    /// the command takes nothing there.
    public var trailing: String? = nil
    /// The command's own options (the global ones apply too).
    public let options: [OptionSpec]
    /// One line for the list of commands.
    public let summary: String
    /// The longer help of `vaultctl help COMMAND`.
    public let details: String
    /// Example command lines, each with what it does.
    public let examples: [(command: String, what: String)]
    /// Runs the parsed command.
    let handler: @Sendable (inout VaultCtl, ParsedCommand) -> VaultCtl.ExitCode

    /// The arguments and options as the help texts show them, what follows
    /// `--` last, as it must be typed:
    /// `PROVIDER USER [--env NAME] -- COMMAND [ARGS...]`.
    public var synopsis: String {
        var parts = positionalSynopsis + options.map { "[\($0.synopsis)]" }
        if let trailing { parts.append("-- " + trailing) }
        return parts.joined(separator: " ")
    }

    /// The positional part of the synopsis: `PROVIDER USER`, `[COMMAND]`.
    var positionalSynopsis: [String] {
        var parts = required.map(\.name)
        if !optional.isEmpty { parts.append("[" + optional.map(\.name).joined(separator: " ") + "]") }
        return parts
    }

    /// The option `word` spells, if the command has one.
    func option(_ word: String) -> OptionSpec? { options.first { $0.matches(word) } }
}

/// The table of vaultctl's global options and commands.
public enum CommandTable {
    /// Options of vaultctl itself, accepted before or after the command.
    public static let globalOptions: [OptionSpec] = [
        .flag("--json", "print stable JSON instead of tables"),
        .value(
            "--socket", "PATH", .file,
            "vaultd's socket (default: $VAULTD_SOCKET, else $XDG_RUNTIME_DIR/vaultd/socket, else /run/vaultd/socket for root)"
        ),
        .value(
            "--timeout", "SECONDS", .text,
            "give up when vaultd does not answer within SECONDS (default \(VaultCtl.defaultTimeoutSeconds)); watch waits for events without limit"
        ),
        .value(
            "--owner", "USER", .localUser,
            "address USER's (a name or uid) session instead of your own: for root and the admin group"),
        .flag("--help", aliases: ["-h"], "show help (also after a command)"),
        .flag("--version", "show the version"),
    ]

    /// The global option `word` spells, if any.
    static func globalOption(_ word: String) -> OptionSpec? { globalOptions.first { $0.matches(word) } }

    /// The command called `name`, if any.
    public static func command(_ name: String) -> CommandSpec? { commands.first { $0.name == name } }

    /// Every command, in the order `vaultctl --help` lists them.
    public static let commands: [CommandSpec] = [
        CommandSpec(
            name: "login", required: [.provider, .user], optional: [],
            options: [
                .value("--token-file", "FILE", .file, "read the token or token response from FILE, not stdin"),
                .value("--expires-at", "UNIX_SECONDS", .text, "when a bare token expires"),
                .flag("--from-provider", "the provider obtains the tokens; nothing is read"),
                .flag("--replace", "replace the tokens of a session that is logged in already"),
                .value("--profile-file", "FILE", .file, "the user's profile (name, avatar, metadata) as JSON"),
                .flag("--device", "log in on another device: show an address and a code, wait for the user (RFC 8628)"),
                .flag("--browser", "log in in a browser: authorization code with PKCE, redirected to vaultctl"),
                .flag("--no-open", "with --browser: only print the URL, do not run xdg-open"),
            ],
            summary: "log in; the token comes on stdin or from FILE (or the provider obtains it)",
            details: """
                Logs USER in at PROVIDER (a [Provider] section of vaultd.conf). The
                credential is read from stdin, or from FILE: either a bare token
                (CometChat authToken, OpenIM token) or an OAuth 2.0 token response as
                JSON (access_token, refresh_token, expires_in, instance_url, ...), so
                `curl ... | vaultctl login PROVIDER USER` works. Never pass a token as an
                argument. An account that is already logged in keeps its session.
                With --from-provider nothing is read: the provider obtains the tokens
                itself (oauth2: its Grant=, client credentials or a JWT bearer assertion
                for USER; exec: its helper's login).
                With --device (oauth2 providers with DeviceAuthorizationURL=) vaultd asks
                the provider for a code: vaultctl prints the address to open and the code
                to enter, each on a line of its own (and the address that holds the code,
                when the provider gives one), then waits while vaultd polls the provider
                at the pace it asks for, until the user approves or refuses
                (ERR_LOGIN_DENIED) or the code expires (ERR_LOGIN_EXPIRED). Ctrl-C stops
                the wait, and vaultd polls no more. The client secret and the device code
                stay in vaultd.
                With --replace a logged-in account gets the new tokens instead: they are
                stored before vaultctl returns and served at once, subscribers see
                tokenRefreshed (reason replaced), and a replaced refresh token is revoked
                at the provider. Only the session's owner (or root, the admin group) may.
                --profile-file FILE gives the session's profile: a JSON object with
                CometChat's User fields (name, avatar, role, metadata, ...); uid, when
                given, must be USER. It wins over the profile the provider's helper
                answers or an id_token in the token response describes.
                With --browser (an oauth2 provider with AuthorizationURL=) nothing is
                read either: vaultctl listens on 127.0.0.1 on a free port, prints the
                authorization URL on a line of its own and opens it with xdg-open (not
                with --no-open: then open it yourself, on this machine). Once you
                approve, the browser is sent back to vaultctl with a code, which vaultd
                exchanges with its PKCE verifier (S256) and the client's credentials.
                A redirect with another state, an error (access_denied) or a code the
                token endpoint refuses fails; the login expires after 10 minutes.
                """,
            examples: [
                ("echo -n \"$TOKEN\" | vaultctl login demo alice", "log in with a bare token"),
                ("vaultctl login demo alice --token-file token.json", "log in with a token response from a file"),
                ("vaultctl login cometchat alice --from-provider", "have the provider's helper log alice in"),
                ("vaultctl login corp alice --browser", "log alice in at corp in a browser (PKCE)"),
                ("echo -n \"$NEW\" | vaultctl login --replace demo alice", "rotate alice's token by hand"),
                ("vaultctl login corp alice --device", "log alice in at corp with a code entered in a browser"),
                (
                    "vaultctl login demo alice --token-file t.json --profile-file alice.json",
                    "log in with alice's name and avatar"
                ),
            ],
            handler: { ctl, parsed in
                if parsed.has("--device") { return ctl.deviceLogin(parsed) }
                if parsed.has("--browser") || parsed.has("--no-open") { return ctl.browserLogin(parsed) }
                return ctl.login(parsed)
            }),
        CommandSpec(
            name: "logout", required: [.provider, .user], optional: [], options: [],
            summary: "log out and delete the stored session",
            details: """
                Logs USER out at PROVIDER and deletes the stored session. Fails with
                ERR_NOT_LOGGED_IN when the account is not logged in.
                """,
            examples: [("vaultctl logout demo alice", "log alice out at demo")],
            handler: { ctl, parsed in ctl.logout(parsed) }),
        CommandSpec(
            name: "status", required: [], optional: [.provider, .user], options: [],
            summary: "one session in detail, or all of them",
            details: "Shows one session in detail (the token masked), or lists every session.",
            examples: [
                ("vaultctl status demo alice", "alice's session at demo"),
                ("vaultctl --json status", "every session, as JSON"),
            ],
            handler: { ctl, parsed in ctl.status(parsed) }),
        CommandSpec(
            name: "list", required: [], optional: [], options: [],
            summary: "every session you may see",
            details: """
                Lists every session you may see: provider, user, state, expiry, owner
                (the user's name, or the uid when no user has it).
                """,
            examples: [("vaultctl --json list", "the same, as JSON")],
            handler: { ctl, _ in ctl.list() }),
        CommandSpec(
            name: "token", required: [.provider, .user], optional: [],
            options: [.value("--min-valid", "SECONDS", .text, "fail unless the token stays valid this long")],
            summary: "print the access token (for $(vaultctl token ...))",
            details: """
                Prints the access token and nothing else, for $(vaultctl token P U).
                With --min-valid, fails unless the token stays valid that long.
                """,
            examples: [
                (
                    "curl -H \"Authorization: Bearer $(vaultctl token demo alice)\" https://api.example.com/",
                    "call an API with alice's token"
                ),
                ("vaultctl token demo alice --min-valid 300", "a token good for five more minutes"),
            ],
            handler: { ctl, parsed in ctl.token(parsed) }),
        CommandSpec(
            name: "refresh", required: [.provider, .user], optional: [], options: [],
            summary: "refresh the tokens now (oauth2, exec providers)",
            details: """
                Refreshes the account's tokens now at its provider's token endpoint,
                joining a refresh already under way, and shows the session afterwards.
                vaultd refreshes by itself ahead of expiry; this is for when you know
                the token went bad early.
                """,
            examples: [("vaultctl refresh salesforce alice", "refresh alice's tokens at salesforce")],
            handler: { ctl, parsed in ctl.refresh(parsed) }),
        CommandSpec(
            name: "provider-secret", required: [.provider], optional: [], options: [],
            summary: "store an oauth2 client secret, read from stdin",
            details: """
                Reads an OAuth 2.0 client secret from stdin (without echo on a
                terminal) and stores it in the secret store for the oauth2 provider
                PROVIDER; vaultd uses it from then on. A client secret never goes into
                vaultd.conf or onto a command line.
                """,
            examples: [("vaultctl provider-secret salesforce < client-secret.txt", "store salesforce's secret")],
            handler: { ctl, parsed in ctl.providerSecret(parsed) }),
        CommandSpec(
            name: "watch", required: [], optional: [.provider, .user],
            options: [
                .value(
                    "--kind", "KIND", .suggest(EventKind.allCases.map(\.rawValue)), repeatable: true,
                    "only events of this kind (may be given more than once)"),
                .flag("--no-reconnect", "end when vaultd goes away (status 1, or 3 if it was killed)"),
            ],
            summary: "print session events as they happen",
            details: """
                Prints events as they happen, one line each, until interrupted: login,
                logout, kicks and (with refreshing providers) token changes, for the
                sessions you may see. --json prints one JSON object per line: first
                {"sessions":[...]}, then one {"event":{...}} per event. When vaultd stops
                or restarts, watch says so on stderr, reconnects (1 s to 30 s apart), says
                when it is back, and catches up: one line per session with its state now
                (--json: {"reconnected":{"sessions":[...],"gone":[...]}}), and a gone line
                per session that ended meanwhile; events that happened meanwhile are not
                replayed. With --no-reconnect it ends instead: with vaultd's error and code
                (status 1), or, when the connection just closed (vaultd was killed), with
                a sentence and status 3. Kinds:
                \(EventKind.allCases.map(\.rawValue).joined(separator: ", ")).
                """,
            examples: [
                ("vaultctl watch", "every event of every session you may see"),
                ("vaultctl watch demo alice --kind kickedOffline", "only when alice is kicked offline"),
            ],
            handler: { ctl, parsed in ctl.watch(parsed) }),
        CommandSpec(
            name: "exec", required: [.provider, .user], optional: [], trailing: "COMMAND [ARGS...]",
            options: [
                .value(
                    "--env", "NAME[=FIELD]", .text, repeatable: true,
                    "put the token (or FIELD) under NAME too; NAME alone replaces VAULTD_TOKEN (may be repeated)"),
                .value(
                    "--on-refresh", "ACTION", .suggest(["restart", "none", "signal:HUP", "signal:USR1"]),
                    "on a new token: restart the command (default), send it signal:NAME, or none"),
                .flag("--signal-group", "send the signal:NAME of --on-refresh to COMMAND's whole process group"),
                .value("--grace", "SECONDS", .text, "how long a stopped command may take before SIGKILL (default 10)"),
            ],
            summary: "run a command with the token in its environment, kept in step with the session",
            details: """
                Runs COMMAND with the account's session in its environment, for programs
                that cannot speak Varlink, and stays subscribed to the session. The
                variables: VAULTD_TOKEN (the access token; --env NAME puts it under NAME
                instead), VAULTD_TOKEN_TYPE, VAULTD_EXPIRES_AT (Unix seconds),
                VAULTD_INSTANCE_URL, VAULTD_SCOPE, VAULTD_PROVIDER and VAULTD_USER; one the
                session lacks is unset. --env NAME=FIELD puts a field under NAME too;
                FIELD is token, type, expires_at, instance_url, scope, provider or user. When the token is refreshed, it
                restarts COMMAND with the new one (SIGTERM, then SIGKILL after the grace
                time), sends it a signal (signal:HUP; the command then reads the token
                with `vaultctl token`), or leaves it alone (none). The signal goes to
                COMMAND's process only, not to the programs it started, unless
                --signal-group sends it to COMMAND's whole process group. When the session
                ends (logout, kick, an invalid or expired token) it stops COMMAND and
                exits with status 75. SIGINT, SIGTERM and SIGHUP are passed on to
                COMMAND; otherwise vaultctl exits with COMMAND's own status. If vaultd
                goes away, it reconnects (1 s to 30 s apart) and catches up on a token
                that changed meanwhile. COMMAND runs in a process group of its own, and
                its environment can be read by its own user and root only.
                """,
            examples: [
                ("vaultctl exec demo alice -- ./bot --server chat.example.com", "run a bot with alice's token"),
                (
                    "vaultctl exec --env API_TOKEN --on-refresh signal:HUP salesforce alice -- ./sync",
                    "tell a program that reloads on SIGHUP"
                ),
                (
                    "vaultctl exec --env SF_URL=instance_url salesforce alice -- ./sync",
                    "give the instance URL under a name of the program's own"
                ),
            ],
            handler: { ctl, parsed in ctl.exec(parsed) }),
        CommandSpec(
            name: "kick", required: [.provider, .user], optional: [],
            options: [.value("--reason", "REASON", .text, "why, as subscribers see it (default: kicked)")],
            summary: "force a logout (the chat server kicked the client)",
            details: """
                Logs the account out at once, as when its chat server kicked the client
                offline; subscribers get kickedOffline with REASON (default: kicked).
                The owner, root and members of the configured AdminGroup may do this.
                """,
            examples: [("vaultctl kick demo alice --reason revoked", "withdraw alice's token now")],
            handler: { ctl, parsed in ctl.kick(parsed) }),
        CommandSpec(
            name: "report-rejected", required: [.provider, .user], optional: [],
            options: [.value("--token-file", "FILE", .file, "read the rejected token from FILE, not stdin")],
            summary: "tell vaultd the chat server rejected a token (read from stdin)",
            details: """
                Reads the token the chat server rejected from stdin (or FILE) and sends
                only its SHA-256 to vaultd. If it is still the session's current token,
                vaultd refreshes the session, once however many clients report it
                (outcome refreshed), or ends it with tokenInvalid when the provider
                cannot refresh it (outcome ended). If the session has a newer token
                already, nothing is done (outcome alreadyReplaced): read the token again.
                """,
            examples: [
                (
                    "vaultctl token demo alice | vaultctl report-rejected demo alice",
                    "the current token was refused: get a new one"
                )
            ],
            handler: { ctl, parsed in ctl.reportRejected(parsed) }),
        CommandSpec(
            name: "connection-state",
            required: [
                .provider, .user,
                ArgumentSpec("STATE", .suggest(ClientConnectionState.allCases.map(\.rawValue) + ["-"])),
            ],
            optional: [],
            options: [.value("--client", "NAME", .text, "the name the client is listed under (default: vaultctl)")],
            summary: "report your own connection to the chat server (connecting, connected, ...)",
            details: """
                Reports that this client's connection to the chat server is in STATE:
                connecting, connected, connectFailed or kickedOffline (OpenIM's
                connection callbacks). Subscribers get connectionChanged with source
                client and the client's NAME; status lists the client for as long as
                its connection to vaultd is open, so a single report lasts only while
                vaultctl runs. With STATE -, states are read from stdin, one per line,
                over one connection, and the client stays listed until stdin ends (the
                last state is sent again each minute, so vaultd's idle timeout does not
                close the connection). kickedOffline logs the session out, as kick does.
                The session's owner and root may report.
                """,
            examples: [
                ("vaultctl connection-state demo alice connected --client mybot", "tell subscribers mybot connected"),
                (
                    "./bot 2>&1 | sed -n 's/^STATE //p' | vaultctl connection-state demo alice - --client bot",
                    "report every STATE line the bot prints, listed while it runs"
                ),
            ],
            handler: { ctl, parsed in ctl.connectionState(parsed) }),
        CommandSpec(
            name: "completion", required: [ArgumentSpec("SHELL", .oneOf(Completion.shells))], optional: [],
            options: [],
            summary: "print a completion script for bash, zsh or fish",
            details: """
                Prints a script that completes vaultctl's commands and options in
                SHELL, and providers and users from the sessions vaultd lists when it
                answers. Load it in the shell's start-up file.
                """,
            examples: [
                ("source <(vaultctl completion bash)", "in ~/.bashrc"),
                ("source <(vaultctl completion zsh)", "in ~/.zshrc, after compinit"),
                ("vaultctl completion fish > ~/.config/fish/completions/vaultctl.fish", "for fish"),
            ],
            handler: { ctl, parsed in ctl.completion(parsed) }),
        CommandSpec(
            name: "help", required: [], optional: [ArgumentSpec("COMMAND", .command)], options: [],
            summary: "show help",
            details: "Shows what vaultctl, or one of its commands, does and takes.",
            examples: [("vaultctl help login", "how to log in")],
            handler: { ctl, parsed in ctl.help(parsed) }),
    ]
}
