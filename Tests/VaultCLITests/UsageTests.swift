import Testing
import VaultCLI

/// Usage errors, derived from the command table: each names what is wrong,
/// points to `vaultctl help COMMAND`, and exits 2 without reaching vaultd.
@Suite("vaultctl usage errors", .timeLimit(.minutes(5)))
struct UsageTests {
    /// Expects exit status 2 and a message with `needle` and the hint to `help`.
    func expectUsage(
        _ arguments: [String], _ needle: String, help: String?, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let result = ctl(["--socket", noSocket] + arguments)
        #expect(result.status == .usage, "\(arguments): \(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stderr.hasPrefix("vaultctl: "), sourceLocation: sourceLocation)
        #expect(result.stderr.contains(needle), "\(arguments): \(result.stderr)", sourceLocation: sourceLocation)
        let hint = help.map { "see 'vaultctl help \($0)'" } ?? "see 'vaultctl help'"
        #expect(result.stderr.hasSuffix(hint), "\(arguments): \(result.stderr)", sourceLocation: sourceLocation)
        #expect(result.stdout.isEmpty, sourceLocation: sourceLocation)
    }

    @Test("Should refuse a connection state vaultd does not know, naming the ones it does, before connecting")
    func unknownConnectionState() {
        expectUsage(
            ["connection-state", "demo", "alice", "online"],
            "connection-state: 'online' is not a state (connecting, connected, connectFailed, kickedOffline",
            help: "connection-state")
    }

    @Test("Should name an unknown option of every command")
    func unknownOption() {
        for spec in CommandTable.commands {
            expectUsage(
                [spec.name] + validArguments(spec) + ["--no-such-option"],
                "\(spec.name): unknown option '--no-such-option'", help: spec.name)
        }
    }

    @Test("Should name every option of every command that is missing its value")
    func missingValue() {
        for spec in CommandTable.commands {
            for option in spec.options where option.takesValue {
                expectUsage(
                    [spec.name] + validArguments(spec) + [option.name],
                    "\(spec.name): \(option.name) needs \(option.valueName!)", help: spec.name)
            }
        }
    }

    @Test("Should name the missing arguments of every command that needs some")
    func tooFewArguments() {
        for spec in CommandTable.commands where !spec.required.isEmpty {
            let given = Array(validArguments(spec).dropLast())
            expectUsage([spec.name] + given, "missing \(spec.required.last!.name)", help: spec.name)
            expectUsage([spec.name], "missing \(spec.required.map(\.name).joined(separator: " "))", help: spec.name)
        }
    }

    @Test("Should refuse some but not all of a command's optional arguments")
    func partOfTheOptionalArguments() {
        for spec in CommandTable.commands where spec.optional.count > 1 {
            let given = validArguments(spec) + ["demo"]
            expectUsage(
                [spec.name] + given, "\(spec.name) takes PROVIDER USER or nothing: missing USER", help: spec.name)
        }
    }

    @Test("Should name the first argument too many of every command")
    func tooManyArguments() {
        for spec in CommandTable.commands {
            expectUsage(
                [spec.name] + validArguments(spec, optional: true) + ["surplus"], "unexpected argument 'surplus'",
                help: spec.name)
        }
    }

    @Test("Should say what the commands without arguments take")
    func noArguments() {
        expectUsage(["list", "x"], "list takes no arguments: unexpected argument 'x'", help: "list")
    }

    @Test("Should refuse bad option values with the command's help")
    func badValues() {
        expectUsage(
            ["login", "demo", "alice", "--expires-at", "soon"], "--expires-at needs Unix seconds", help: "login")
        expectUsage(
            ["token", "demo", "alice", "--min-valid", "-1"], "--min-valid needs a number of seconds", help: "token")
        expectUsage(["token", "demo", "alice", "--min-valid", "x"], "not 'x'", help: "token")
        expectUsage(["completion", "ksh"], "SHELL must be one of bash, zsh, fish, not 'ksh'", help: "completion")
    }

    @Test("Should refuse unknown commands, a missing command and bad global options")
    func globalErrors() {
        expectUsage(["frobnicate"], "unknown command 'frobnicate'", help: nil)
        expectUsage([], "no command given", help: nil)
        expectUsage(["help", "frobnicate"], "unknown command 'frobnicate'", help: nil)
        expectUsage(["--no-such-option", "list"], "unknown option '--no-such-option'", help: nil)
        expectUsage(["--owner", "no-such-user-here", "list"], "--owner: no user 'no-such-user-here'", help: nil)
        #expect(ctl(["list", "--socket"]).stderr.contains("--socket needs PATH"))
        #expect(ctl(["list", "--owner"]).status == .usage)
        expectUsage(["frobnicate", "--help"], "unknown command 'frobnicate'", help: nil)
    }

    @Test("Should exit 3, naming the socket, when vaultd is not reachable")
    func unreachable() {
        let commands = [
            ["status"], ["status", "demo", "alice"], ["list"], ["token", "demo", "alice"], ["logout", "demo", "alice"],
            ["refresh", "demo", "alice"], ["kick", "demo", "alice", "--reason", "admin"],
            ["watch", "--kind", "loginSuccess", "--kind", "kickedOffline"],
            ["login", "demo", "alice", "--from-provider"], ["exec", "demo", "alice", "--", "true"],
        ]
        for arguments in commands {
            let result = ctl(["--socket", noSocket] + arguments)
            #expect(result.status == .unreachable, "\(arguments)")
            #expect(result.stderr.contains("vaultd is not reachable at \(noSocket)"), "\(arguments)")
        }
        // Global options may come after the command and its options.
        let late = ctl(["token", "demo", "alice", "--json", "--socket", noSocket, "--owner", "0"])
        #expect(late.status == .unreachable)
        #expect(late.stderr.contains(noSocket))
    }

    @Test(
        "Should refuse an exec without a command after --, with a bad --env, --on-refresh or --grace, or a lone --signal-group"
    )
    func execUsage() {
        expectUsage(["exec", "demo", "alice"], "exec needs -- COMMAND [ARGS...] at the end", help: "exec")
        expectUsage(["exec", "demo", "alice", "--"], "exec needs -- COMMAND [ARGS...] at the end", help: "exec")
        expectUsage(["exec", "demo", "alice", "./bot"], "unexpected argument './bot'; put the COMMAND", help: "exec")
        for (option, value) in [
            ("--env", "1TOKEN"), ("--env", "A-B"), ("--env", "URL=url"), ("--env", "=token"), ("--env", "A=Token"),
            ("--env", "A="), ("--on-refresh", "reload"), ("--on-refresh", "signal:NOPE"),
            ("--grace", "-1"), ("--grace", "soon"),
        ] {
            expectUsage(["exec", option, value, "demo", "alice", "--", "true"], "exec: \(option)", help: "exec")
        }
        expectUsage(
            ["exec", "--signal-group", "demo", "alice", "--", "true"],
            "exec: --signal-group goes with --on-refresh signal:NAME", help: "exec")
        // Options after -- belong to the command, not to vaultctl.
        let result = ctl(["--socket", noSocket, "exec", "demo", "alice", "--", "env", "--no-such-option", "-h"])
        #expect(result.status == .unreachable, "\(result.stderr)")
    }

    @Test("Should take words after -- as arguments, not options")
    func endOfOptions() {
        let result = ctl(["--socket", noSocket, "token", "--", "demo", "--alice"])
        #expect(result.status == .unreachable)
    }

    @Test("Should declare each option spelling once: a value everywhere or nowhere, and not shadowing a global one")
    func tableIsConsistent() {
        var takesValue: [String: Bool] = [:]
        let globals = Set(CommandTable.globalOptions.map(\.name))
        for spec in CommandTable.commands {
            for option in spec.options {
                #expect(!globals.contains(option.name), "\(spec.name) \(option.name)")
                if let known = takesValue[option.name] { #expect(known == option.takesValue, "\(option.name)") }
                takesValue[option.name] = option.takesValue
            }
        }
        let names = CommandTable.commands.map(\.name)
        #expect(Set(names).count == names.count)
    }
}
