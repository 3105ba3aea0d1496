extension ConfigParser {
    /// The text of a configuration file read as `bytes`: UTF-8, or an error
    /// naming the file and the first line that is not (never quoting it).
    public static func text(of bytes: [UInt8], file: String) throws(VaultError) -> String {
        if let text = String(validating: bytes, as: UTF8.self) { return text }
        // A multi-byte sequence never holds a LF byte: the lines can be checked one by one.
        var lineNumber = 0
        for line in bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            if String(validating: line, as: UTF8.self) == nil { break }
        }
        throw VaultError(.invalidConfig, "\(file):\(lineNumber): not UTF-8 text; write the file in UTF-8")
    }

    /// One `Key=value`, with where it was written.
    struct Entry {
        var value: String
        var file: String
        var line: Int

        func error(_ message: String) -> VaultError { VaultError(.invalidConfig, "\(file):\(line): \(message)") }
    }

    /// A provider section as merged so far, with where it was first defined.
    struct ProviderSection {
        var file: String
        var line: Int
        var entries: [String: Entry] = [:]
    }

    /// The sections of every file read so far.
    struct MergedSections {
        var accounts: [Account: [String: Entry]] = [:]
        var vault: [String: Entry] = [:]
        var providers: [String: ProviderSection] = [:]
        var providerOrder: [String] = []
        var etcd: [String: Entry] = [:]
    }

    /// Reads the sections of one file into `merged`, checking section names and
    /// keys; values are checked once every file is merged.
    static func scan(_ text: String, file: String, into merged: inout MergedSections) throws(VaultError) {
        enum Section {
            case none
            case vault
            case provider(String)
            case account(Account)
            case etcd
        }
        var section = Section.none
        var seenProviders: Set<String> = []
        var seenKeys: Set<String> = []

        func fail(_ line: Int, _ message: String) -> VaultError {
            VaultError(.invalidConfig, "\(file):\(line): \(message)")
        }
        /// Lets `key` into the section `name` if the section knows it and it was not set there before.
        func admit(_ key: String, known: [String], in name: String, _ line: Int) throws(VaultError) {
            guard known.contains(key) else {
                throw fail(line, "unknown key '\(key)' in \(name) (known: \(known.joined(separator: ", ")))")
            }
            guard seenKeys.insert(key).inserted else { throw fail(line, "key '\(key)' set twice in \(name)") }
        }

        var lineNumber = 0
        // Split on LF bytes: Swift reads CR LF as one Character, which is not "\n".
        for rawLine in text.utf8.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            // A NUL would cut a value short where it becomes a C string (an
            // exec argv, a URL for libcurl); no control character but a tab
            // (and the CR of a CR LF) has a use in this file, comments included.
            let content = rawLine.last == 0x0D ? rawLine.dropLast() : rawLine[...]
            if content.contains(where: { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }) {
                throw fail(lineNumber, "control character in the line; only tabs and spaces may separate words")
            }
            let line = LoginCredential.trimmed(String(decoding: rawLine, as: UTF8.self))
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { throw fail(lineNumber, "section header without closing ']'") }
                seenKeys = []
                let header = String(line.dropFirst().dropLast())
                if header == "Vault" {
                    section = .vault
                } else if header == "Etcd" {
                    section = .etcd
                } else if header.hasPrefix("Provider ") {
                    let name = LoginCredential.trimmed(String(header.dropFirst("Provider ".count)))
                    guard (try? Account.validate(provider: name, user: "-")) != nil, !name.contains(" ") else {
                        throw fail(
                            lineNumber,
                            "bad provider name in [Provider NAME]: expected 1 to 256 bytes, no spaces or control characters"
                        )
                    }
                    guard seenProviders.insert(name).inserted else {
                        throw fail(lineNumber, "provider '\(name)' is defined twice")
                    }
                    if merged.providers[name] == nil {
                        merged.providers[name] = ProviderSection(file: file, line: lineNumber)
                        merged.providerOrder.append(name)
                    }
                    section = .provider(name)
                } else if header.hasPrefix("Account ") {
                    let words = header.split(separator: " ").map(String.init)
                    guard words.count == 3, let account = try? Account.validate(provider: words[1], user: words[2])
                    else {
                        throw fail(
                            lineNumber,
                            "bad [Account PROVIDER USER] header: expected a provider and a user, without control characters"
                        )
                    }
                    guard seenProviders.insert("account \(words[1]) \(words[2])").inserted else {
                        throw fail(lineNumber, "account '\(words[2]) @ \(words[1])' is defined twice")
                    }
                    if merged.accounts[account] == nil { merged.accounts[account] = [:] }
                    section = .account(account)
                } else {
                    throw fail(
                        lineNumber,
                        "unknown section (expected [Vault], [Etcd], [Provider NAME] or [Account PROVIDER USER])")
                }
                continue
            }
            guard let equals = line.firstIndex(of: "=") else {
                throw fail(lineNumber, "expected a Key=value line, a [Section] header or a # comment")
            }
            let rawKey = LoginCredential.trimmed(String(line[..<equals]))
            // Known keys are named; an unknown one only when it looks like a key,
            // since this text may be anything (a secret, another file).
            let key = looksLikeKey(rawKey) ? rawKey : "(not a key name)"
            let entry = Entry(
                value: LoginCredential.trimmed(String(line[line.index(after: equals)...])), file: file, line: lineNumber
            )
            switch section {
            case .none:
                throw fail(lineNumber, "key '\(key)' outside of any section")
            case .vault:
                try admit(key, known: vaultKeys, in: "[Vault]", lineNumber)
                merged.vault[key] = entry
            case .provider(let name):
                try admit(key, known: providerKeys, in: "[Provider \(name)]", lineNumber)
                merged.providers[name]!.entries[key] = entry
            case .account(let account):
                try admit(key, known: accountKeys, in: "[Account \(account.provider) \(account.user)]", lineNumber)
                merged.accounts[account]![key] = entry
            case .etcd:
                try admit(key, known: etcdKeys, in: "[Etcd]", lineNumber)
                merged.etcd[key] = entry
            }
        }
    }

    /// A key name worth quoting in an error: ASCII letters, digits and '_', at most 64.
    static func looksLikeKey(_ text: String) -> Bool {
        !text.isEmpty && text.utf8.count <= 64
            && text.utf8.allSatisfy {
                $0 == UInt8(ascii: "_") || (($0 | 0x20) >= 97 && ($0 | 0x20) <= 122) || ($0 >= 48 && $0 <= 57)
            }
    }

}
