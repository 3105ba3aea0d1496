import Testing
import VaultCore

private let file = "/etc/vaultd/vaultd.conf"

/// Parses the given lines, joined with newlines, as `file`.
private func parse(_ lines: String...) throws(VaultError) -> VaultConfig {
    try ConfigParser.parse(lines.joined(separator: "\n"), file: file)
}

/// The error the given lines are refused with.
private func configError(_ lines: String...) throws -> VaultError {
    let text = lines.joined(separator: "\n")
    let error = try #require(throws: VaultError.self) { try ConfigParser.parse(text, file: file) }
    #expect(error.code == .invalidConfig)
    return error
}

@Suite("ConfigParser", .timeLimit(.minutes(5)))
struct ConfigParserTests {
    @Test("Should parse the built-in text to the static provider demo")
    func builtIn() throws {
        let config = try ConfigParser.parse(VaultConfig.builtInText, file: "<built-in>")
        #expect(
            config.providers == [
                "demo": ProviderConfig(
                    name: "demo", type: .static,
                    description: "Tokens kept as given; the session ends when the token expires")
            ])
        #expect(config.storeTimeoutSeconds == 30)
        #expect(config == VaultConfig(providers: config.providers))
    }

    @Test("Should parse an empty file to no providers and the default store timeout")
    func empty() throws {
        #expect(try parse("") == VaultConfig(providers: [:], storeTimeoutSeconds: 30))
    }

    @Test("Should ignore comments, blank lines and whitespace around keys, values and lines")
    func commentsAndBlanks() throws {
        let config = try parse(
            "# a comment",
            "; another comment",
            "",
            "   ",
            "  [Provider cometchat]  ",
            "  # indented comment",
            "Type = static ",
            "\tDescription=  CometChat app 1234  ",
            "",
            "[Provider openim]",
            "Type=static")
        #expect(
            config.providers == [
                "cometchat": ProviderConfig(name: "cometchat", type: .static, description: "CometChat app 1234"),
                "openim": ProviderConfig(name: "openim", type: .static, description: nil),
            ])
    }

    @Test("Should keep everything after the first '=' as the value")
    func equalsInValue() throws {
        let config = try parse("[Provider a]", "Type=static", "Description=a=b c")
        #expect(config.providers["a"]?.description == "a=b c")
    }

    @Test("Should read [Vault] StoreTimeout as a duration", arguments: [("1min", 60), ("45", 45), ("59min 60s", 3600)])
    func storeTimeout(value: String, seconds: Int64) throws {
        #expect(try parse("[Vault]", "StoreTimeout=\(value)").storeTimeoutSeconds == seconds)
    }

    @Test("Should refuse a bad or zero StoreTimeout, naming file, line and key", arguments: ["soon", "0", "", "5x"])
    func badStoreTimeout(value: String) throws {
        let error = try configError("# timeouts", "[Vault]", "StoreTimeout=\(value)")
        #expect(error.message.hasPrefix("\(file):3: "))
        #expect(error.message.contains("'StoreTimeout': expected a duration"), "\(error.message)")
        #expect(!error.message.contains("'\(value)'"), "the value is not quoted")
    }

    @Test(
        "Should refuse a timeout longer than an hour, however large, naming the key and the limit",
        arguments: [
            ["[Vault]", "StoreTimeout=1h 1s"],
            [
                "[Provider o]", "Type=oauth2", "TokenURL=https://example.com/t", "ClientID=c",
                "Timeout=9999999999999999",
            ],
            ["[Provider e]", "Type=exec", "Command=/bin/true", "Timeout=2h"],
        ])
    func timeoutOverAnHour(lines: [String]) throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse(lines.joined(separator: "\n"), file: file)
        }
        #expect(error.code == .invalidConfig)
        #expect(error.message.hasPrefix("\(file):\(lines.count): key '"), "\(error.message)")
        #expect(error.message.hasSuffix("is longer than the most allowed, 1h"), "\(error.message)")
    }

    @Test("Should read an exec provider's MaxConcurrentHelpers, 4 when absent")
    func maxConcurrentHelpers() throws {
        let given = try parse("[Provider e]", "Type=exec", "Command=/bin/true", "MaxConcurrentHelpers=2")
        #expect(given.providers["e"]?.exec?.maxConcurrentHelpers == 2)
        let absent = try parse("[Provider e]", "Type=exec", "Command=/bin/true")
        #expect(absent.providers["e"]?.exec?.maxConcurrentHelpers == 4)
    }

    @Test(
        "Should refuse a MaxConcurrentHelpers that is not a whole number from 1 to 64, naming file, line and key",
        arguments: ["0", "65", "-1", "two", "", "4.5"])
    func badMaxConcurrentHelpers(value: String) throws {
        let error = try configError("[Provider e]", "Type=exec", "Command=/bin/true", "MaxConcurrentHelpers=\(value)")
        #expect(
            error.message
                == "\(file):4: key 'MaxConcurrentHelpers': expected a whole number from 1 to 64")
    }

    @Test("Should refuse MaxConcurrentHelpers outside an exec provider")
    func maxConcurrentHelpersOnlyForExec() throws {
        let error = try configError("[Provider s]", "Type=static", "MaxConcurrentHelpers=2")
        #expect(error.message == "\(file):3: key 'MaxConcurrentHelpers' is for Type=exec, not Type=static")
    }

    @Test("Should refuse an unknown key in a provider section, naming file, line and key")
    func unknownProviderKey() throws {
        let error = try configError("[Provider a]", "Type=static", "Colour=blue")
        #expect(
            error.message
                == "\(file):3: unknown key 'Colour' in [Provider a] (known: Type, Description, SingleAccount, TokenURL, "
                + "ClientID, RevocationURL, AuthorizationURL, Scope, DefaultLifetime, MaxSessionLifetime, ClientSecretFile, "
                + "TokenEndpointAuthMethod, AllowInsecureHTTP, Command, Timeout, MaxConcurrentHelpers, Grant, JWTKeyFile, "
                + "JWTIssuer, JWTAudience, MintUsers, MintGroups, DeviceAuthorizationURL)"
        )
    }

    @Test("Should read an oauth2 provider's Timeout, 30 s when absent")
    func oauth2Timeout() throws {
        let oauth = ["[Provider o]", "Type=oauth2", "TokenURL=https://example.com/token", "ClientID=c"]
        #expect(
            try ConfigParser.parse((oauth + ["Timeout=5s"]).joined(separator: "\n"), file: file)
                .providers["o"]?.oauth2?.timeoutSeconds == 5)
        #expect(
            try ConfigParser.parse(oauth.joined(separator: "\n"), file: file)
                .providers["o"]?.oauth2?.timeoutSeconds == 30)
    }

    @Test("Should refuse a key of another provider type, naming the types it belongs to")
    func keyOfAnotherType() throws {
        #expect(
            try configError("[Provider a]", "Type=static", "Timeout=5").message
                == "\(file):3: key 'Timeout' is for Type=oauth2 or Type=exec, not Type=static")
        #expect(
            try configError("[Provider a]", "Type=exec", "Command=/bin/true", "TokenURL=https://x.example").message
                == "\(file):4: key 'TokenURL' is for Type=oauth2, not Type=exec")
    }

    @Test("Should refuse an unknown key in [Vault], naming file, line and key")
    func unknownVaultKey() throws {
        let error = try configError("", "[Vault]", "StoreTimeout=5", "Timeout=5")
        #expect(error.message.hasPrefix("\(file):4: "))
        #expect(error.message.contains("'Timeout'"))
    }

    @Test("Should refuse an unknown section, naming its line")
    func unknownSection() throws {
        let error = try configError("[Vault]", "[Service]")
        #expect(error.message.hasPrefix("\(file):2: "))
        #expect(error.message.contains("unknown section (expected [Vault]"), "\(error.message)")
        #expect(!error.message.contains("Service"))
    }

    @Test("Should refuse a section header without ']'")
    func unclosedHeader() throws {
        let error = try configError("[Provider a")
        #expect(error.message == "\(file):1: section header without closing ']'")
    }

    @Test("Should refuse a key outside any section, naming it")
    func keyOutsideSection() throws {
        let error = try configError("# header", "Type=static", "[Provider a]", "Type=static")
        #expect(error.message == "\(file):2: key 'Type' outside of any section")
    }

    @Test("Should refuse a line that is not Key=value")
    func notKeyValue() throws {
        let error = try configError("[Provider a]", "Type static")
        #expect(error.message == "\(file):2: expected a Key=value line, a [Section] header or a # comment")
    }

    @Test("Should refuse a provider without Type, naming its header line")
    func missingType() throws {
        let error = try configError("[Provider a]", "Type=static", "", "[Provider b]", "Description=no type")
        #expect(error.message.hasPrefix("\(file):4: [Provider b] has no Type="))
    }

    @Test("Should refuse a provider without Type when another section follows it")
    func missingTypeBeforeNextSection() throws {
        let error = try configError("[Provider b]", "Description=x", "[Vault]")
        #expect(error.message.hasPrefix("\(file):1: [Provider b] has no Type="))
    }

    @Test("Should refuse an unknown Type value, naming the Type line and the known types")
    func badType() throws {
        let error = try configError("[Provider a]", "Description=x", "Type=oauth9")
        #expect(error.message == "\(file):3: key 'Type': expected a provider type, one of: static, oauth2, exec")
    }

    @Test("Should refuse a provider defined twice, naming the second header")
    func duplicateProvider() throws {
        let error = try configError("[Provider a]", "Type=static", "[Provider a]", "Type=static")
        #expect(error.message == "\(file):3: provider 'a' is defined twice")
    }

    @Test("Should refuse a key set twice in a provider, naming the second line")
    func keySetTwice() throws {
        let error = try configError("[Provider a]", "Type=static", "Description=x", "Type=static")
        #expect(error.message == "\(file):4: key 'Type' set twice in [Provider a]")
    }

    @Test("Should refuse a provider name with spaces or an empty one", arguments: ["[Provider a b]", "[Provider  ]"])
    func badProviderName(header: String) throws {
        let error = try configError(header, "Type=static")
        #expect(error.message.hasPrefix("\(file):1: "))
    }

    static let marker = "s3cr3t-MARKER-9f8e7d"

    @Test(
        "Should never quote a line or a value in an error, whatever the file holds",
        arguments: [
            ["root:$y$\(marker):19000:0:99999:7:::"],
            ["[\(marker)]"],
            ["[Provider \(marker) x]"],
            ["[Account demo]", "x=\(marker)"],
            ["[Vault]", "StoreTimeout=\(marker)"],
            ["[Vault]", "StoreTimeout=1h \(marker)"],
            ["[Vault]", "StoreScope=\(marker)!"],
            ["[Vault]", "SocketMode=\(marker)"],
            ["[Vault]", "AdminGroup=a \(marker)"],
            ["[Vault]", "\(marker) x=1"],
            ["[Vault]", "\(marker)=1"],
            ["[Provider a]", "Type=\(marker)"],
            ["[Provider a]", "Type=static", "SingleAccount=\(marker)"],
            ["[Provider a]", "Type=exec", "Command=\(marker)"],
            ["[Provider a]", "Type=exec", "Command=/bin/true", "Timeout=\(marker)"],
            ["[Provider a]", "Type=exec", "Command=/bin/true", "MaxConcurrentHelpers=\(marker)"],
            ["[Provider a]", "Type=static", "Description=\(marker)\u{0}"],
            ["[Provider a]", "Type=oauth2", "TokenURL=\(marker)", "ClientID=c"],
            ["[Provider a]", "Type=oauth2", "TokenURL=https://x.example/t", "ClientID=c", "DefaultLifetime=\(marker)"],
            ["[Provider a]", "Type=oauth2", "TokenURL=https://x.example/t", "ClientID=c", "RevocationURL=\(marker)"],
        ])
    func neverQuotesContent(lines: [String]) throws {
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse(lines.joined(separator: "\n"), file: file)
        }
        #expect(error.code == .invalidConfig)
        #expect(error.message.hasPrefix("\(file):"), "\(error.message)")
        #expect(!error.message.contains("s3cr3t"), "\(error.message)")
        #expect(!error.message.contains("MARKER"), "\(error.message)")
    }

    @Test(
        "Should refuse a control character anywhere in a line, comments included, naming file and line",
        arguments: ["\u{0}", "\u{1}", "\u{1B}", "\u{7F}", "\r ", "\u{0C}"])
    func controlCharacters(character: String) throws {
        for line in ["Command=/bin/true\(character)x", "# a comment\(character)", "Command=/bin/true\(character)"] {
            let error = try configError("[Provider e]", "Type=exec", line)
            #expect(
                error.message == "\(file):3: control character in the line; only tabs and spaces may separate words")
        }
        // A tab is whitespace, and a CR ends a CR LF line.
        #expect(try parse("[Provider e]", "Type=exec\t", "Command=/bin/true\targ\r").providers["e"] != nil)
    }

    @Test("Should refuse a file that is not UTF-8 text, naming the first line that is not")
    func notUTF8() throws {
        let bytes = Array("[Provider a]\nType=static\n".utf8) + [0x44, 0xFF, 0x0A] + Array("Description=\u{e9}".utf8)
        let error = try #require(throws: VaultError.self) { try ConfigParser.text(of: bytes, file: file) }
        #expect(error.code == .invalidConfig)
        #expect(error.message == "\(file):3: not UTF-8 text; write the file in UTF-8")
        let cut = Array("# caf\u{e9}".utf8).dropLast()
        #expect(throws: VaultError.self) { try ConfigParser.text(of: Array(cut), file: file) }
        #expect(try ConfigParser.text(of: Array("# caf\u{e9}\n".utf8), file: file) == "# caf\u{e9}\n")
    }

    @Test("Should count lines of a file with CRLF line endings like any other")
    func crlf() throws {
        let text = "[Provider a]\r\nType=static\r\nDescription=x\r\n"
        let config = try ConfigParser.parse(text, file: file)
        #expect(config.providers == ["a": ProviderConfig(name: "a", type: .static, description: "x")])
        let error = try #require(throws: VaultError.self) {
            try ConfigParser.parse("[Provider a]\r\nType=static\r\nColour=blue\r\n", file: file)
        }
        #expect(error.message.hasPrefix("\(file):3: unknown key 'Colour'"))
    }
}

@Suite("DurationParser", .timeLimit(.minutes(5)))
struct DurationParserTests {
    @Test(
        "Should read systemd-style durations in seconds",
        arguments: [
            ("90", 90), ("90s", 90), ("1sec", 1), ("2seconds", 2), ("5min", 300), ("5m", 300), ("2minutes", 120),
            ("2h", 7200), ("1hour", 3600), ("3hours", 10800), ("1d", 86400), ("2days", 172_800),
            ("1h 30min", 5400), ("1d  1s", 86401), ("0", 0),
        ] as [(String, Int64)])
    func valid(text: String, seconds: Int64) {
        #expect(DurationParser.seconds(text) == seconds)
    }

    @Test(
        "Should refuse text that is not a duration",
        arguments: [
            "abc", "", " ", "5x", "min", "-5", "1.5h", "5 min", "h1", "99999999999999999999",
            "9223372036854775807d",
        ])
    func invalid(text: String) {
        #expect(DurationParser.seconds(text) == nil)
    }

    @Test("Should refuse a sum of parts that overflows, rather than crash")
    func sumOverflow() async {
        // Run in a child process: the overflow traps.
        await #expect(processExitsWith: .success) {
            precondition(DurationParser.seconds("9223372036854775807 1") == nil)
        }
        // The part's value alone is fine; the overflow is only in the sum.
        #expect(DurationParser.seconds("9223372036854775807") == Int64.max)
    }
}
