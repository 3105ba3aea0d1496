import Testing
import VaultCLI

/// Help and version, rendered from the command table.
@Suite("vaultctl help", .timeLimit(.minutes(5)))
struct HelpTests {
    @Test("Should print every command's help for --help, -h and help COMMAND alike")
    func commandHelp() {
        for spec in CommandTable.commands {
            let help = ctl([spec.name, "--help"])
            #expect(help.status == .ok, "\(spec.name)")
            #expect(help.stderr.isEmpty)
            #expect(help.stdout.hasPrefix("Usage: vaultctl \(spec.name)"), "\(spec.name)")
            #expect(help.stdout.contains(spec.details))
            for option in spec.options { #expect(help.stdout.contains(option.synopsis), "\(spec.name) \(option.name)") }
            for example in spec.examples { #expect(help.stdout.contains(example.command)) }
            #expect(ctl(["help", spec.name]).stdout == help.stdout)
            #expect(ctl(["-h", spec.name]).stdout == help.stdout)
            // --help wins over arguments and options that are wrong.
            #expect(ctl([spec.name, "--no-such-option", "a", "b", "c", "--help"]).stdout == help.stdout)
        }
    }

    @Test("Should list every command and global option in vaultctl's help")
    func toolHelp() {
        let help = ctl(["--help"])
        #expect(help.status == .ok)
        #expect(help.stdout.hasPrefix("Usage: vaultctl [--json] [--socket PATH] [--owner USER] COMMAND [ARGS]"))
        for spec in CommandTable.commands {
            #expect(help.stdout.contains("  \(spec.name)"), "\(spec.name)")
            #expect(help.stdout.contains(spec.summary.split(separator: " ").prefix(3).joined(separator: " ")))
        }
        for option in CommandTable.globalOptions { #expect(help.stdout.contains(option.synopsis)) }
        #expect(ctl(["help"]).stdout == help.stdout)
        #expect(ctl(["-h"]).stdout == help.stdout)
    }

    @Test("Should print the version for --version, wherever it is")
    func version() {
        for arguments in [["--version"], ["status", "--version"], ["frobnicate", "--version"]] {
            let result = ctl(arguments)
            #expect(result.status == .ok)
            #expect(result.stdout == "vaultctl \(VaultCtl.version)")
        }
    }
}
