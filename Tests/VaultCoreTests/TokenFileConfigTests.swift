import Testing
import VaultCore

private let file = "/etc/vaultd/vaultd.conf"

/// The `[Account demo alice]` section with `lines`, parsed as `file`.
private func account(_ lines: String...) throws(VaultError) -> AccountSettings? {
    let text = (["[Provider demo]", "Type=static", "[Account demo alice]"] + lines).joined(separator: "\n")
    return try ConfigParser.parse(text, file: file).accounts[Account(provider: "demo", user: "alice")]
}

/// The message `lines` in `[Account demo alice]` are refused with.
private func refusal(_ lines: String...) throws -> String {
    let text = (["[Provider demo]", "Type=static", "[Account demo alice]"] + lines).joined(separator: "\n")
    let error = try #require(throws: VaultError.self) { try ConfigParser.parse(text, file: file) }
    #expect(error.code == .invalidConfig)
    return error.message
}

@Suite("Token file keys of [Account]", .timeLimit(.minutes(5)))
struct TokenFileConfigTests {
    @Test("Should read TokenFile= with mode 0600, no owner and no disk by default")
    func defaults() throws {
        let settings = try #require(try account("TokenFile=/run/user/1000/vaultd/alice.token")?.tokenFile)
        #expect(settings.path == "/run/user/1000/vaultd/alice.token")
        #expect(settings.mode == 0o600)
        #expect(settings.owner == nil && settings.onDisk == false)
        #expect(settings.location == "\(file):4")
        #expect(settings.directory == "/run/user/1000/vaultd" && settings.name == "alice.token")
        #expect(try account("Owner=0")?.tokenFile == nil, "no TokenFile=, no token file")
    }

    @Test("Should read TokenFileMode=, TokenFileOwner= and TokenFileOnDisk=")
    func allKeys() throws {
        let settings = try #require(
            try account(
                "TokenFile=/var/lib/bot/token", "TokenFileMode=0440", "TokenFileOwner=bot", "TokenFileOnDisk=yes"
            )?.tokenFile)
        #expect(settings.mode == 0o440)
        #expect(settings.owner == "bot" && settings.ownerLocation == "\(file):6")
        #expect(settings.onDisk)
        #expect(settings.directory == "/var/lib/bot" && settings.name == "token")
        #expect(try account("TokenFile=/t", "TokenFileOnDisk=no")?.tokenFile?.directory == "/")
    }

    @Test("Should refuse a TokenFile= that is not an absolute path to a file, naming the line and key")
    func badPaths() throws {
        for path in ["relative/token", "/run/dir/", "/run/../etc/token", "/run/./token", "/run//token", "", "/"] {
            let message = try refusal("TokenFile=\(path)")
            #expect(message.hasPrefix("\(file):4: key 'TokenFile': expected an absolute path"), "\(path): \(message)")
        }
    }

    @Test("Should refuse modes others could read or write, executable modes and modes without owner read")
    func badModes() throws {
        for mode in ["0644", "0666", "0700", "0200", "0000", "4600", "rw", "0x180", "01000"] {
            let message = try refusal("TokenFile=/run/t", "TokenFileMode=\(mode)")
            #expect(message.hasPrefix("\(file):5: key 'TokenFileMode': expected an octal mode"), "\(mode): \(message)")
        }
        for mode in ["0400", "0440", "0600", "0640", "600"] {
            #expect(try account("TokenFile=/run/t", "TokenFileMode=\(mode)")?.tokenFile != nil, "\(mode)")
        }
    }

    @Test("Should refuse TokenFileOnDisk= that is not a boolean and a TokenFileOwner= of two words")
    func badValues() throws {
        #expect(
            try refusal("TokenFile=/run/t", "TokenFileOnDisk=maybe")
                == "\(file):5: key 'TokenFileOnDisk': expected yes or no")
        #expect(
            try refusal("TokenFile=/run/t", "TokenFileOwner=a b")
                == "\(file):5: key 'TokenFileOwner': expected one user name or uid")
    }

    @Test("Should refuse the other token file keys without TokenFile=")
    func keysNeedTokenFile() throws {
        for line in ["TokenFileMode=0600", "TokenFileOwner=bot", "TokenFileOnDisk=yes"] {
            let key = line.split(separator: "=")[0]
            #expect(
                try refusal(line)
                    == "\(file):4: key '\(key)' needs TokenFile= in the same section [Account demo alice]")
        }
    }

    @Test("Should refuse two accounts writing the same file, and a key set twice")
    func conflicts() throws {
        let text = """
            [Provider demo]
            Type=static
            [Account demo alice]
            TokenFile=/run/shared.token
            [Account demo bob]
            TokenFile=/run/shared.token
            """
        let error = try #require(throws: VaultError.self) { try ConfigParser.parse(text, file: file) }
        #expect(
            error.message
                == "\(file):6: key 'TokenFile': [Account demo alice] writes the same file; give each account a file of its own"
        )
        #expect(try refusal("TokenFile=/run/a", "TokenFile=/run/b").contains("key 'TokenFile' set twice"))
    }

    @Test("Should let a drop-in set the token file of an account the main file declared")
    func dropIn() throws {
        let config = try ConfigParser.parse(layers: [
            ("[Provider demo]\nType=static\n[Account demo alice]\nOwner=0\n", file),
            ("[Account demo alice]\nTokenFile=/run/alice.token\n", "/etc/vaultd/vaultd.conf.d/10-token.conf"),
        ])
        let settings = try #require(config.accounts[Account(provider: "demo", user: "alice")])
        #expect(settings.owner == "0")
        #expect(settings.tokenFile?.location == "/etc/vaultd/vaultd.conf.d/10-token.conf:2")
    }
}
