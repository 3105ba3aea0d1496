import Testing
import VaultCore

/// A file tree in memory: file texts by path. `read` and `list` behave as the
/// daemon's do on a real tree: nil and empty for what does not exist.
private struct FakeTree {
    var files: [String: String]

    func read(_ path: String) throws(VaultError) -> String? { files[path] }

    func list(_ directory: String) throws(VaultError) -> [String] {
        let prefix = directory + "/"
        return files.keys.filter { $0.hasPrefix(prefix) && !$0.dropFirst(prefix.count).contains("/") }
            .map { String($0.dropFirst(prefix.count)) }
            .sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
    }

    func load(_ search: ConfigSearch) throws(VaultError) -> VaultConfig {
        try search.load(read: read, list: list)
    }
}

private let system = "/etc/vaultd/vaultd.conf"
private let user = "/home/u/.config/vaultd/vaultd.conf"

/// The search of a user instance with HOME=/home/u and no XDG_CONFIG_HOME.
private func userSearch(_ environment: [String: String] = [:]) throws(VaultError) -> ConfigSearch {
    try ConfigSearch.plan(explicitPath: nil, isRoot: false, environment: environment, home: "/home/u")
}

@Suite("Configuration layers: /etc/vaultd, then the user's own", .timeLimit(.minutes(5)))
struct ConfigSearchTests {
    @Test("Should have a user instance read /etc/vaultd/vaultd.conf, then ~/.config/vaultd/vaultd.conf")
    func userInstanceLayers() throws {
        #expect(try userSearch().layers.map(\.file) == [system, user])
        #expect(try userSearch().layers.allSatisfy { !$0.required })
        #expect(try userSearch().layers.map(\.dropInDirectory) == [system + ".d", user + ".d"])
    }

    @Test("Should take XDG_CONFIG_HOME when absolute, and ~/.config when it is relative or empty")
    func xdgConfigHome() throws {
        #expect(
            try userSearch(["XDG_CONFIG_HOME": "/x/cfg"]).layers.map(\.file) == [system, "/x/cfg/vaultd/vaultd.conf"])
        #expect(try userSearch(["XDG_CONFIG_HOME": "cfg"]).layers.map(\.file) == [system, user])
        #expect(try userSearch(["XDG_CONFIG_HOME": ""]).layers.map(\.file) == [system, user])
    }

    @Test("Should have root (the system instance) read /etc/vaultd only")
    func systemInstance() throws {
        let search = try ConfigSearch.plan(
            explicitPath: nil, isRoot: true, environment: ["XDG_CONFIG_HOME": "/root/.config"], home: "/root")
        #expect(search.layers.map(\.file) == [system])
    }

    @Test("Should read only the --config file, which must exist, for root and users alike")
    func explicitPath() throws {
        for isRoot in [true, false] {
            let search = try ConfigSearch.plan(
                explicitPath: "/srv/v.conf", isRoot: isRoot,
                environment: ["VAULTD_SYSTEM_CONFIG_DIR": "/sys-dir"], home: "/home/u")
            #expect(search.layers == [ConfigSearch.Layer(file: "/srv/v.conf", required: true)])
        }
        let error = try #require(throws: VaultError.self) {
            try FakeTree(files: [:]).load(
                ConfigSearch.plan(explicitPath: "/srv/v.conf", isRoot: false, environment: [:], home: nil))
        }
        #expect(error.code == .invalidConfig)
        #expect(error.message.contains("/srv/v.conf does not exist"), "\(error.message)")
    }

    @Test("Should move the system directory with VAULTD_SYSTEM_CONFIG_DIR, and refuse a relative one")
    func systemDirectoryOverride() throws {
        let moved = try userSearch(["VAULTD_SYSTEM_CONFIG_DIR": "/tmp/t/etc/"])
        #expect(moved.layers.map(\.file) == ["/tmp/t/etc/vaultd.conf", user])
        let error = try #require(throws: VaultError.self) { try userSearch(["VAULTD_SYSTEM_CONFIG_DIR": "etc"]) }
        #expect(error.message.contains("VAULTD_SYSTEM_CONFIG_DIR must be an absolute path"), "\(error.message)")
    }

    @Test("Should read one file once when the user's path is the system one")
    func samePathOnce() throws {
        let search = try userSearch(["XDG_CONFIG_HOME": "/etc", "VAULTD_SYSTEM_CONFIG_DIR": "/etc/vaultd"])
        #expect(search.layers.map(\.file) == [system])
    }

    @Test("Should let the user file override one key of a system provider and add a provider, in order")
    func userOverridesKeyByKey() throws {
        let tree = FakeTree(files: [
            system: "[Vault]\nStoreTimeout=10\n\n[Provider a]\nType=static\nDescription=1\n",
            system + ".d/20-b.conf": "[Vault]\nStoreTimeout=20\n",
            system + ".d/10-a.conf": "[Provider a]\nSingleAccount=yes\n",
            system + ".d/notes.txt": "not a drop-in",
            user: "[Provider a]\nDescription=2\n\n[Provider b]\nType=static\n\n[Account b alice]\nAutoLogin=no\n",
            user + ".d/10-late.conf": "[Vault]\nStoreTimeout=30\n",
        ])
        let config = try tree.load(userSearch())
        #expect(
            config.sources == [
                system, system + ".d/10-a.conf", system + ".d/20-b.conf", user, user + ".d/10-late.conf",
            ])
        #expect(config.searchedFiles == [system, user])
        // The section declared in two files merges key by key: Type and
        // SingleAccount from /etc, Description from the user's file.
        #expect(config.providers["a"]?.type == .static)
        #expect(config.providers["a"]?.singleAccount == true)
        #expect(config.providers["a"]?.description == "2")
        #expect(config.providers["b"]?.type == .static)
        #expect(config.accounts[Account(provider: "b", user: "alice")] != nil)
        #expect(config.storeTimeoutSeconds == 30, "the last file read wins")
    }

    @Test("Should skip missing files: the user's alone, /etc's alone, or drop-ins without their main file")
    func missingFilesSkipped() throws {
        let userOnly = try FakeTree(files: [user: "[Provider b]\nType=static\n"]).load(userSearch())
        #expect(userOnly.sources == [user])
        #expect(userOnly.providers.keys.sorted() == ["b"])
        let systemOnly = try FakeTree(files: [system: "[Provider a]\nType=static\n"]).load(userSearch())
        #expect(systemOnly.sources == [system])
        #expect(systemOnly.providers.keys.sorted() == ["a"])
        let dropInOnly = try FakeTree(files: [user + ".d/x.conf": "[Provider c]\nType=static\n"]).load(userSearch())
        #expect(dropInOnly.sources == [user + ".d/x.conf"])
        #expect(dropInOnly.providers.keys.sorted() == ["c"])
    }

    @Test("Should use the built-in configuration, with no sources, when no file at all is found")
    func builtInWhenNothingFound() throws {
        let config = try FakeTree(files: [:]).load(userSearch())
        #expect(config.sources.isEmpty)
        #expect(config.searchedFiles == [system, user])
        #expect(config.providers.keys.sorted() == ["demo"])
    }

    @Test("Should name the file and line of an error in a later layer")
    func errorInUserLayer() throws {
        let tree = FakeTree(files: [system: "[Provider a]\nType=static\n", user: "[Provider a]\nType=magic\n"])
        let error = try #require(throws: VaultError.self) { try tree.load(userSearch()) }
        #expect(error.message.hasPrefix("\(user):2: key 'Type'"), "\(error.message)")
    }

    @Test("Should name the files read in 'provider not configured', and the user's file when it is missing")
    func unknownProviderNamesFiles() throws {
        let both = try FakeTree(files: [system: "[Provider a]\nType=static\n", user: "[Provider b]\nType=static\n"])
            .load(userSearch())
        #expect(
            VaultError.unknownProvider("x", in: both).message
                == "provider 'x' is not configured; add a [Provider x] section to one of: \(system), \(user)")
        let systemOnly = try FakeTree(files: [system: "[Provider a]\nType=static\n"]).load(userSearch())
        #expect(
            VaultError.unknownProvider("x", in: systemOnly).message
                == "provider 'x' is not configured; add a [Provider x] section to one of: \(system) (or create \(user))"
        )
        let none = try FakeTree(files: [:]).load(userSearch())
        let message = VaultError.unknownProvider("x", in: none).message
        #expect(message.contains("no configuration file was found"), "\(message)")
        #expect(message.contains("create \(system) or \(user) with a [Provider x] section"), "\(message)")
        #expect(VaultError.unknownProvider("x", in: none).code == .unknownProvider)
    }
}
