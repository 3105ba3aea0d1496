/// A command's words, checked against its declaration.
struct ParsedCommand {
    /// The command's declaration.
    let spec: CommandSpec
    /// The positional arguments, as many as the declaration allows.
    var arguments: [String] = []
    /// The values of the options given, by option name, in order.
    var values: [String: [String]] = [:]
    /// The flags given, by option name.
    var flags: Set<String> = []

    /// The (last) value of the option `name`.
    func value(_ name: String) -> String? { values[name]?.last }

    /// Whether the flag `name` was given.
    func has(_ name: String) -> Bool { flags.contains(name) }

    /// The words after `--`, for a command that takes them (`exec`).
    var trailing: [String] = []
    /// Whether `--` was given after the command's name.
    var sawSeparator = false
}

/// A whole vaultctl command line, parsed.
struct Invocation {
    /// The global options' values, by option name.
    var globalValues: [String: String] = [:]
    /// The global flags given.
    var globalFlags: Set<String> = []
    /// The command, when one was named.
    var command: ParsedCommand?

    /// Whether `--help` (or `-h`) was given.
    var wantsHelp: Bool { globalFlags.contains("--help") }
    /// Whether `--version` was given.
    var wantsVersion: Bool { globalFlags.contains("--version") }
}

/// What is wrong with a command line, and which command's help to point to.
struct UsageError: Error, Equatable {
    let message: String
    let command: String?
}

/// Parses vaultctl's command line against `CommandTable`: global options
/// anywhere, the first other word names the command, then its options and
/// arguments; `--` ends the options.
enum CommandLineParser {
    /// Whether `word` is meant as an option: `--anything` or `-h`.
    static func looksLikeOption(_ word: String) -> Bool {
        word.hasPrefix("--") || CommandTable.globalOption(word) != nil
    }

    /// The invocation, or the first thing wrong with it. `--version` and then
    /// `--help` win over anything wrong, except that `--help` after an unknown
    /// command still reports the unknown command.
    static func parse(_ words: [String]) -> Result<Invocation, UsageError> {
        var invocation = Invocation()
        var command: ParsedCommand?
        var firstError: UsageError?
        var unknownCommand: UsageError?
        var optionsEnded = false
        var index = 0
        func fail(_ message: String, _ name: String?) {
            if firstError == nil { firstError = UsageError(message: message, command: name) }
        }
        while index < words.count {
            let word = words[index]
            index += 1
            if !optionsEnded && word == "--" {
                optionsEnded = true
                // A command that runs another takes everything after `--` as it is.
                if command?.spec.trailing != nil {
                    command?.sawSeparator = true
                    command?.trailing = Array(words[index...])
                    break
                }
                continue
            }
            if !optionsEnded && looksLikeOption(word) {
                let name = command?.spec.name
                if let option = CommandTable.globalOption(word) {
                    guard option.takesValue else {
                        invocation.globalFlags.insert(option.name)
                        continue
                    }
                    guard index < words.count else {
                        fail("\(option.name) needs \(option.valueName ?? "a value")", name)
                        continue
                    }
                    invocation.globalValues[option.name] = words[index]
                    index += 1
                } else if unknownCommand != nil {
                    continue
                } else if let option = command?.spec.option(word) {
                    guard option.takesValue else {
                        command?.flags.insert(option.name)
                        continue
                    }
                    guard index < words.count else {
                        fail("\(name ?? "vaultctl"): \(option.name) needs \(option.valueName ?? "a value")", name)
                        continue
                    }
                    command?.values[option.name, default: []].append(words[index])
                    index += 1
                } else if let name {
                    fail("\(name): unknown option '\(word)'", name)
                } else {
                    fail("unknown option '\(word)'", nil)
                }
                continue
            }
            if unknownCommand != nil { continue }
            if command == nil {
                if let spec = CommandTable.command(word) {
                    command = ParsedCommand(spec: spec)
                } else {
                    unknownCommand = UsageError(message: "unknown command '\(word)'", command: nil)
                }
                continue
            }
            command?.arguments.append(word)
        }
        invocation.command = command
        if invocation.wantsVersion { return .success(invocation) }
        if let unknownCommand { return .failure(unknownCommand) }
        if invocation.wantsHelp { return .success(invocation) }
        if let firstError { return .failure(firstError) }
        guard let command else { return .failure(UsageError(message: "no command given", command: nil)) }
        if let error = check(command) { return .failure(error) }
        return .success(invocation)
    }

    /// What is wrong with the arguments of `command`: too few, too many, or
    /// not one of the words an argument accepts.
    static func check(_ command: ParsedCommand) -> UsageError? {
        let spec = command.spec
        let given = command.arguments
        let takes: String
        if spec.required.isEmpty && spec.optional.isEmpty {
            takes = "\(spec.name) takes no arguments"
        } else if spec.optional.isEmpty {
            takes = "\(spec.name) needs " + spec.required.map(\.name).joined(separator: " ")
        } else {
            let all = (spec.required + spec.optional).map(\.name).joined(separator: " ")
            let short = spec.required.isEmpty ? "nothing" : spec.required.map(\.name).joined(separator: " ")
            takes = "\(spec.name) takes \(all) or \(short)"
        }
        let all = spec.required + spec.optional
        let needed = given.count < spec.required.count ? spec.required.count : all.count
        if given.count < needed && (given.count < spec.required.count || given.count > spec.required.count) {
            let missing = all[given.count..<needed].map(\.name).joined(separator: " ")
            return UsageError(message: "\(takes): missing \(missing)", command: spec.name)
        }
        if given.count > all.count {
            let hint = spec.trailing.map { "; put the \($0) after --" } ?? ""
            return UsageError(
                message: "\(takes): unexpected argument '\(given[all.count])'\(hint)", command: spec.name)
        }
        if let trailing = spec.trailing, command.trailing.isEmpty {
            return UsageError(message: "\(spec.name) needs -- \(trailing) at the end", command: spec.name)
        }
        for (argument, word) in zip(all, given) {
            if case .oneOf(let words) = argument.kind, !words.contains(word) {
                return UsageError(
                    message:
                        "\(spec.name): \(argument.name) must be one of \(words.joined(separator: ", ")), not '\(word)'",
                    command: spec.name)
            }
        }
        return nil
    }
}
