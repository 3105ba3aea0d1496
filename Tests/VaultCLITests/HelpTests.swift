import Foundation
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
            #expect(words(help.stdout).contains(words(spec.details)), "\(spec.name)")
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

    @Test("Should wrap help at the terminal's width, names in a column of at most a third of it")
    func wrapsAtWidth() {
        for columns in [60, 80, 132] {
            let texts =
                [ctl(["--help"], columns: columns).stdout]
                + CommandTable.commands.map {
                    ctl(["help", $0.name], columns: columns).stdout
                }
            for text in texts {
                // Examples are command lines to copy: they are not broken.
                let prose = text.components(separatedBy: "\nExamples:\n")[0]
                for line in prose.split(separator: "\n") {
                    #expect(line.count <= columns, "wider than \(columns): '\(line)'")
                }
            }
            // Beside a name or below it, a summary starts within the first third.
            let list = texts[0].components(separatedBy: "\n").drop { $0 != "Commands:" }.prefix { !$0.isEmpty }
            for spec in CommandTable.commands {
                let head = spec.summary.split(separator: " ").prefix(3).joined(separator: " ")
                let line = list.first { $0.contains(head) }
                let start = line.map { $0.distance(from: $0.startIndex, to: $0.range(of: head)!.lowerBound) }
                #expect(start.map { $0 <= columns / 3 + 2 } == true, "\(spec.name) at \(columns): \(line ?? "")")
            }
        }
        // Wider than 80 where the terminal is: a long summary stays on one line.
        let wide = ctl(["--help"], columns: 200).stdout.split(separator: "\n")
        let exec = CommandTable.command("exec")!
        #expect(wide.contains { $0.hasSuffix(exec.summary) && $0.count > 80 }, "\(wide)")
    }

    @Test("Should show a command's options before -- COMMAND in its usage line")
    func usageOrder() {
        for spec in CommandTable.commands {
            let usage = ctl(["help", spec.name], columns: 400).stdout.split(separator: "\n")[0]
            #expect(usage == "Usage: vaultctl \(spec.name) \(spec.synopsis)".trimmingCharacters(in: .whitespaces))
            guard let trailing = spec.trailing else { continue }
            #expect(usage.hasSuffix(" -- \(trailing)"), "\(usage)")
            for option in spec.options {
                #expect(usage.contains("[\(option.synopsis)] "), "\(usage)")
            }
        }
        let exec = ctl(["help", "exec"], columns: 400).stdout.split(separator: "\n")[0]
        #expect(
            exec
                == "Usage: vaultctl exec PROVIDER USER [--env NAME[=FIELD]...] [--on-refresh ACTION] [--signal-group] [--grace SECONDS] -- COMMAND [ARGS...]"
        )
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

/// `text` with every run of white space made one space: help reflows paragraphs.
func words(_ text: String) -> String {
    text.split(whereSeparator: \.isWhitespace).joined(separator: " ")
}
