import Foundation
import Testing
import VaultCLI

/// The completion scripts, run by the shells themselves.
@Suite("vaultctl completion", .timeLimit(.minutes(5)))
struct CompletionTests {
    static let bash = findProgram("bash")
    static let zsh = findProgram("zsh")
    static let fish = findProgram("fish")

    /// A stand-in `vaultctl` that lists three sessions the way `vaultctl --json list` does.
    static let fakeVaultctl = """
        #!/bin/sh
        echo '{"sessions":[{"expiresAt":1,"ownerUid":1000,"profile":{"name":"Alice"},"provider":"demo","state":"loggedIn","user":"alice"},{"provider":"demo","user":"bob"},{"provider":"oauth","user":"carol"}]}'
        """

    /// What bash's completion function offers for `line` (completing its last word),
    /// with `vaultctl` on PATH being `fake` when given.
    func bashCompletions(_ line: String, fake: String? = nil) throws -> [String] {
        let directory = try TemporaryDirectory()
        let script = try directory.write("vaultctl.bash", ctl(["completion", "bash"]).stdout)
        var environment: [String: String] = [:]
        if let fake {
            try directory.write("vaultctl", fake, executable: true)
            environment["PATH"] = directory.url.path + ":/usr/bin:/bin"
        }
        let driver = """
            source "$1"
            read -ra COMP_WORDS <<< "$2"
            [[ $2 == *" " ]] && COMP_WORDS+=("")
            COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
            _vaultctl
            printf '%s\\n' "${COMPREPLY[@]}"
            """
        let result = try runProgram(Self.bash!, ["-c", driver, "bash", script, line], environment: environment)
        #expect(result.status == 0, "\(result.stderr)")
        return result.stdout.split(separator: "\n").map(String.init)
    }

    @Test("Should print a script for each shell and refuse others")
    func scripts() {
        for shell in ["bash", "zsh", "fish"] {
            let result = ctl(["completion", shell])
            #expect(result.status == .ok)
            #expect(result.stdout.contains("vaultctl completion \(shell)"))
            for spec in CommandTable.commands { #expect(result.stdout.contains(spec.name)) }
        }
        #expect(ctl(["completion"]).status == .usage)
    }

    @Test("Should load into bash and register the completion", .enabled(if: bash != nil))
    func bashLoads() throws {
        // The built vaultctl when there is one (as a user loads it), else the same script from a file.
        let directory = try TemporaryDirectory()
        let script = try directory.write("vaultctl.bash", ctl(["completion", "bash"]).stdout)
        let program = Self.vaultctlPath()
        let load =
            FileManager.default.isExecutableFile(atPath: program)
            ? "source <(\"$0\" completion bash)" : "source <(cat \"$1\")"
        let result = try runProgram(Self.bash!, ["-c", load + " && complete -p vaultctl", program, script])
        #expect(result.status == 0, "\(result.stderr)")
        #expect(result.stdout.contains("complete -F _vaultctl vaultctl"))
    }

    @Test("Should complete commands, options and option values in bash", .enabled(if: bash != nil))
    func bashCommandsAndOptions() throws {
        #expect(try bashCompletions("vaultctl lo") == ["login", "logout"])
        let loginOptions = try bashCompletions("vaultctl login --")
        #expect(loginOptions.contains("--token-file"))
        #expect(loginOptions.contains("--from-provider"))
        #expect(loginOptions.contains("--json"))
        #expect(!loginOptions.contains("--reason"))
        #expect(try bashCompletions("vaultctl --json kick demo alice --r") == ["--reason"])
        #expect(try bashCompletions("vaultctl completion ") == ["bash", "zsh", "fish"])
        #expect(try bashCompletions("vaultctl help to") == ["token"])
        #expect(try bashCompletions("vaultctl watch --kind kick") == ["kickedOffline"])
        #expect(try bashCompletions("vaultctl token demo alice --min-valid ").isEmpty)
    }

    @Test("Should complete providers and users from vaultctl --json list in bash", .enabled(if: bash != nil))
    func bashSessions() throws {
        #expect(try bashCompletions("vaultctl logout ", fake: Self.fakeVaultctl) == ["demo", "oauth"])
        #expect(try bashCompletions("vaultctl logout demo ", fake: Self.fakeVaultctl) == ["alice", "bob"])
        #expect(try bashCompletions("vaultctl --socket /x token oauth ", fake: Self.fakeVaultctl) == ["carol"])
        #expect(try bashCompletions("vaultctl status d", fake: Self.fakeVaultctl) == ["demo"])
        #expect(try bashCompletions("vaultctl provider-secret o", fake: Self.fakeVaultctl) == ["oauth"])
        // A vaultd that does not answer: nothing, and nothing on stderr either.
        let unreachable = "#!/bin/sh\necho 'vaultctl: vaultd is not reachable' >&2\nexit 3\n"
        #expect(try bashCompletions("vaultctl logout ", fake: unreachable).isEmpty)
        #expect(try bashCompletions("vaultctl logout demo ", fake: unreachable).isEmpty)
    }

    @Test("Should print a zsh script zsh parses", .enabled(if: zsh != nil))
    func zshParses() throws {
        let directory = try TemporaryDirectory()
        let script = try directory.write("_vaultctl", ctl(["completion", "zsh"]).stdout)
        let result = try runProgram(Self.zsh!, ["-n", script])
        #expect(result.status == 0, "\(result.stderr)")
    }

    @Test("Should print a fish script fish parses", .enabled(if: fish != nil))
    func fishParses() throws {
        let directory = try TemporaryDirectory()
        let script = try directory.write("vaultctl.fish", ctl(["completion", "fish"]).stdout)
        let result = try runProgram(Self.fish!, ["-n", script])
        #expect(result.status == 0, "\(result.stderr)")
    }

    /// The built vaultctl: in VAULTD_BIN_DIR (scripts/test), else this checkout's debug build.
    static func vaultctlPath() -> String {
        if let directory = ProcessInfo.processInfo.environment["VAULTD_BIN_DIR"] { return directory + "/vaultctl" }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent(".build/debug/vaultctl").path
    }
}
