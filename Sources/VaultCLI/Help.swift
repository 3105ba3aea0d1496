/// The help texts of vaultctl and its commands, rendered from `CommandTable`.
enum Help {
    /// `vaultctl --help`: what vaultctl is, its commands, its global options.
    static var tool: String {
        var lines = [
            "Usage: vaultctl [--json] [--socket PATH] [--owner USER] COMMAND [ARGS]",
            "",
            "The command-line client of vaultd, which keeps chat and messaging",
            "sessions in the Linux secret store.",
            "",
            "Commands:",
        ]
        let names = CommandTable.commands.map { spec in
            ([spec.name] + spec.positionalSynopsis + (spec.trailing.map { ["-- " + $0] } ?? [])).joined(separator: " ")
        }
        let width = (names.map(\.count).max() ?? 0) + 3
        for (name, spec) in zip(names, CommandTable.commands) {
            lines += wrap(
                spec.summary, first: "  " + Format.pad(name, width), rest: String(repeating: " ", count: width + 2))
        }
        lines += ["", "Options:"]
        lines += optionLines(CommandTable.globalOptions)
        lines += [
            "",
            "Exit status: 0 ok, 1 vaultd answered with an error (code and message on",
            "stderr), 2 bad usage, 3 vaultd is not reachable.",
            "",
            "Run 'vaultctl help COMMAND' for a command's arguments, options and examples.",
        ]
        return lines.joined(separator: "\n")
    }

    /// `vaultctl help COMMAND`: usage, what it does, its options, examples.
    static func command(_ spec: CommandSpec) -> String {
        var lines = ["Usage: vaultctl \(spec.name) \(spec.synopsis)".trimmingSpaces(), "", spec.details]
        if !spec.options.isEmpty {
            lines += ["", "Options:"]
            lines += optionLines(spec.options)
        }
        let globals = CommandTable.globalOptions.map(\.synopsis).joined(separator: ", ")
        lines += ["", "Global options: \(globals) (see 'vaultctl --help')."]
        if !spec.examples.isEmpty {
            lines += ["", "Examples:"]
            for example in spec.examples { lines += ["  # \(example.what)", "  \(example.command)"] }
        }
        return lines.joined(separator: "\n")
    }

    /// Options as aligned `  --name VALUE   help` lines.
    static func optionLines(_ options: [OptionSpec]) -> [String] {
        let names = options.map { option in (option.aliases + [option.synopsis]).joined(separator: ", ") }
        let width = (names.map(\.count).max() ?? 0) + 3
        var lines: [String] = []
        for (name, option) in zip(names, options) {
            lines += wrap(
                option.help, first: "  " + Format.pad(name, width), rest: String(repeating: " ", count: width + 2))
        }
        return lines
    }

    /// `text` broken into lines of at most 80 characters where it can be,
    /// the first after `first`, the others after `rest`.
    static func wrap(_ text: String, first: String, rest: String) -> [String] {
        var lines: [String] = []
        var line = first
        var empty = true
        for word in text.split(separator: " ") {
            if !empty && line.count + 1 + word.count > 80 {
                lines.append(line)
                line = rest
                empty = true
            }
            line += (empty ? "" : " ") + word
            empty = false
        }
        lines.append(line)
        return lines
    }
}

extension String {
    /// The text without trailing spaces.
    func trimmingSpaces() -> String {
        var text = self
        while text.last == " " { text.removeLast() }
        return text
    }
}
