/// How a provider keeps its tokens fresh. Only `static` exists yet: the token is
/// used as given and the session ends when it expires.
public enum ProviderType: String, Sendable, CaseIterable {
    case `static`
}

/// One `[Provider NAME]` section of the configuration.
public struct ProviderConfig: Sendable, Equatable {
    /// The provider's name, as clients address it.
    public var name: String
    /// How tokens are refreshed.
    public var type: ProviderType
    /// A free-text description shown by `vaultctl`.
    public var description: String?

    /// Makes a provider entry.
    public init(name: String, type: ProviderType, description: String? = nil) {
        self.name = name
        self.type = type
        self.description = description
    }
}

/// The whole configuration of a vaultd instance.
public struct VaultConfig: Sendable, Equatable {
    /// The providers, by name.
    public var providers: [String: ProviderConfig]
    /// How long one secret store call may take before it is abandoned, in seconds.
    public var storeTimeoutSeconds: Int64

    /// A configuration with the given providers and default settings.
    public init(providers: [String: ProviderConfig] = [:], storeTimeoutSeconds: Int64 = 30) {
        self.providers = providers
        self.storeTimeoutSeconds = storeTimeoutSeconds
    }

    /// The configuration used when no file exists: one static provider, `demo`.
    public static let builtInText = """
        # Built-in default: one provider that keeps tokens as given.
        [Provider demo]
        Type=static
        Description=Tokens kept as given; the session ends when the token expires
        """
}

/// Reads vaultd's INI-style configuration, in the syntax of systemd's unit files:
/// `[Section]` headers, `Key=value` lines, `#` and `;` comments. Every error
/// names the file, the line and the key.
public enum ConfigParser {
    /// Parses `text`, read from `file` (used in error messages only).
    public static func parse(_ text: String, file: String) throws(VaultError) -> VaultConfig {
        var config = VaultConfig()
        enum Section {
            case none
            case vault
            case provider(name: String, line: Int)
        }
        var section = Section.none
        var pending: [String: (value: String, line: Int)] = [:]

        func fail(_ line: Int, _ message: String) -> VaultError {
            VaultError(.invalidConfig, "\(file):\(line): \(message)")
        }

        func finishSection() throws(VaultError) {
            defer { pending = [:] }
            guard case .provider(let name, let headerLine) = section else { return }
            guard let type = pending["Type"] else {
                throw fail(headerLine, "[Provider \(name)] has no Type= (one of: \(typeNames))")
            }
            guard let providerType = ProviderType(rawValue: type.value) else {
                throw fail(type.line, "key 'Type': unknown provider type '\(type.value)' (one of: \(typeNames))")
            }
            config.providers[name] = ProviderConfig(
                name: name, type: providerType, description: pending["Description"]?.value)
        }

        var lineNumber = 0
        // Split on LF bytes: Swift reads CR LF as one Character, which is not "\n".
        for rawLine in text.utf8.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false) {
            lineNumber += 1
            let line = LoginCredential.trimmed(String(decoding: rawLine, as: UTF8.self))
            if line.isEmpty || line.hasPrefix("#") || line.hasPrefix(";") { continue }
            if line.hasPrefix("[") {
                guard line.hasSuffix("]") else { throw fail(lineNumber, "section header without closing ']'") }
                try finishSection()
                let header = String(line.dropFirst().dropLast())
                if header == "Vault" {
                    section = .vault
                } else if header.hasPrefix("Provider ") {
                    let name = LoginCredential.trimmed(String(header.dropFirst("Provider ".count)))
                    do { _ = try Account.validate(provider: name, user: "-") } catch {
                        throw fail(lineNumber, "bad provider name '\(name)': \(error.message)")
                    }
                    if name.contains(where: { $0 == " " }) {
                        throw fail(lineNumber, "provider name '\(name)' must not contain spaces")
                    }
                    if config.providers[name] != nil {
                        throw fail(lineNumber, "provider '\(name)' is defined twice")
                    }
                    section = .provider(name: name, line: lineNumber)
                } else {
                    throw fail(lineNumber, "unknown section [\(header)] (expected [Vault] or [Provider NAME])")
                }
                continue
            }
            guard let equals = line.firstIndex(of: "=") else {
                throw fail(lineNumber, "expected Key=value, got '\(line)'")
            }
            let key = LoginCredential.trimmed(String(line[..<equals]))
            let value = LoginCredential.trimmed(String(line[line.index(after: equals)...]))
            switch section {
            case .none:
                throw fail(lineNumber, "key '\(key)' outside of any section")
            case .vault:
                switch key {
                case "StoreTimeout":
                    guard let seconds = DurationParser.seconds(value), seconds > 0 else {
                        throw fail(lineNumber, "key 'StoreTimeout': bad duration '\(value)' (e.g. 30 or 30s or 1min)")
                    }
                    config.storeTimeoutSeconds = seconds
                default:
                    throw fail(lineNumber, "unknown key '\(key)' in [Vault] (known: StoreTimeout)")
                }
            case .provider(let name, _):
                guard ["Type", "Description"].contains(key) else {
                    throw fail(lineNumber, "unknown key '\(key)' in [Provider \(name)] (known: Type, Description)")
                }
                if pending[key] != nil { throw fail(lineNumber, "key '\(key)' set twice in [Provider \(name)]") }
                pending[key] = (value, lineNumber)
            }
        }
        try finishSection()
        return config
    }

    static var typeNames: String { ProviderType.allCases.map(\.rawValue).joined(separator: ", ") }
}

/// Parses durations as systemd writes them: `90`, `90s`, `5min`, `2h`, `1d`, `1h 30min`.
public enum DurationParser {
    /// The duration in seconds, or nil when the text is not a duration.
    public static func seconds(_ text: String) -> Int64? {
        let units: [(String, Int64)] = [
            ("days", 86400), ("day", 86400), ("d", 86400), ("hours", 3600), ("hour", 3600), ("h", 3600),
            ("minutes", 60), ("minute", 60), ("min", 60), ("m", 60), ("seconds", 1), ("second", 1),
            ("sec", 1), ("s", 1), ("", 1),
        ]
        var total: Int64 = 0
        var sawAny = false
        for part in text.split(separator: " ") {
            let digits = part.prefix(while: { $0.isASCII && $0.isNumber })
            guard !digits.isEmpty, let number = Int64(digits) else { return nil }
            let unit = String(part.dropFirst(digits.count))
            guard let multiplier = units.first(where: { $0.0 == unit })?.1 else { return nil }
            let (product, overflow) = number.multipliedReportingOverflow(by: multiplier)
            guard !overflow else { return nil }
            let (sum, sumOverflow) = total.addingReportingOverflow(product)
            guard !sumOverflow else { return nil }
            total = sum
            sawAny = true
        }
        return sawAny ? total : nil
    }
}
