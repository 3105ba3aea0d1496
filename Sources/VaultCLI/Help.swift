/// The help texts of vaultctl and its commands, rendered from `CommandTable`
/// and wrapped at `width` columns (the terminal's, or 80).
enum Help {
    /// `vaultctl --help`: what vaultctl is, its commands, its global options.
    static func tool(width: Int) -> String {
        let usage = ["Usage: vaultctl", "[--json]", "[--socket PATH]", "[--owner USER]", "COMMAND [ARGS]"]
        var lines = wrap(usage, first: "", rest: "    ", width: width) + [""]
        lines += paragraph(
            "The command-line client of vaultd, which keeps chat and messaging sessions in the Linux secret store.",
            width: width)
        lines += ["", "Commands:"]
        let names = CommandTable.commands.map { spec in
            ([spec.name] + spec.positionalSynopsis + (spec.trailing.map { ["-- " + $0] } ?? [])).joined(separator: " ")
        }
        lines += columns(zip(names, CommandTable.commands.map(\.summary)).map { $0 }, width: width)
        lines += ["", "Options:"]
        lines += optionLines(CommandTable.globalOptions, width: width)
        lines += [""]
        lines += paragraph(
            "Exit status: 0 ok, 1 vaultd answered with an error (code and message on stderr), 2 bad usage, 3 vaultd is not reachable.",
            width: width)
        lines += [""]
        lines += paragraph(
            "Run 'vaultctl help COMMAND' for a command's arguments, options and examples.", width: width)
        return lines.joined(separator: "\n")
    }

    /// `vaultctl help COMMAND`: usage, what it does, its options, examples.
    static func command(_ spec: CommandSpec, width: Int) -> String {
        // The usage breaks between arguments and options, never inside `[--env NAME]`.
        var parts = ["Usage: vaultctl \(spec.name)"] + spec.positionalSynopsis
        parts += spec.options.map { "[\($0.synopsis)]" }
        if let trailing = spec.trailing { parts.append("-- " + trailing) }
        var lines = wrap(parts, first: "", rest: "    ", width: width)
        lines += [""] + paragraph(spec.details, width: width)
        if !spec.options.isEmpty {
            lines += ["", "Options:"]
            lines += optionLines(spec.options, width: width)
        }
        let globals = CommandTable.globalOptions.map(\.synopsis).joined(separator: ", ")
        lines += [""] + paragraph("Global options: \(globals) (see 'vaultctl --help').", width: width)
        if !spec.examples.isEmpty {
            lines += ["", "Examples:"]
            for example in spec.examples { lines += ["  # \(example.what)", "  \(example.command)"] }
        }
        return lines.joined(separator: "\n")
    }

    /// Options as aligned `  --name VALUE   help` lines.
    static func optionLines(_ options: [OptionSpec], width: Int) -> [String] {
        let names = options.map { option in (option.aliases + [option.synopsis]).joined(separator: ", ") }
        return columns(zip(names, options.map(\.help)).map { $0 }, width: width)
    }

    /// Two columns: each name, then its text wrapped beside it. The first
    /// column takes at most a third of the width; a longer name has its text
    /// on the lines below, so the text keeps two thirds of the width.
    static func columns(_ rows: [(name: String, text: String)], width: Int) -> [String] {
        let column = min((rows.map(\.name.count).max() ?? 0) + 3, width / 3)
        let indent = String(repeating: " ", count: column + 2)
        var lines: [String] = []
        for (name, text) in rows {
            let words = text.split(separator: " ").map(String.init)
            if name.count + 2 > column {
                lines.append("  " + name)
                lines += wrap(words, first: indent, rest: indent, width: width)
            } else {
                lines += wrap(words, first: "  " + Format.pad(name, column), rest: indent, width: width)
            }
        }
        return lines
    }

    /// `text` as one paragraph, its lines broken anew at `width`.
    static func paragraph(_ text: String, width: Int) -> [String] {
        wrap(text.split(whereSeparator: \.isWhitespace).map(String.init), first: "", rest: "", width: width)
    }

    /// `words` in lines of at most `width` characters where they fit, the
    /// first line after `first`, the others after `rest`.
    static func wrap(_ words: [String], first: String, rest: String, width: Int) -> [String] {
        var lines: [String] = []
        var line = first
        var empty = true
        for word in words {
            if !empty && line.count + 1 + word.count > width {
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
