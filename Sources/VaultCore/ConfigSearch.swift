/// Where one vaultd instance reads its configuration, and in which order, as
/// systemd layers its own: the system directory first, then the user's.
///
/// - `--config PATH`: that file (which must exist) and its drop-ins, nothing else.
/// - root (the system instance): `/etc/vaultd/vaultd.conf` and its drop-ins.
/// - any other user (a user instance): the same, then
///   `$XDG_CONFIG_HOME/vaultd/vaultd.conf` (`~/.config/...` when that is
///   unset or not absolute) and its drop-ins.
///
/// Every main file is followed by the `*.conf` files of its drop-in directory
/// (`vaultd.conf.d/`), in bytewise order. Later files win key by key: a user
/// file may add providers and accounts and override single keys of a section
/// an earlier file declared (see `ConfigParser.parse(layers:)`). A missing
/// file is skipped; when no file at all is found the built-in configuration
/// (provider `demo`) is used. The search is pure: reading is done by the
/// caller's functions, so the daemon reads real files and tests read a table.
public struct ConfigSearch: Sendable, Equatable {
    /// One main file and its drop-in directory.
    public struct Layer: Sendable, Equatable {
        /// The main file.
        public var file: String
        /// True for `--config`: a missing file is an error, not skipped.
        public var required: Bool

        /// The directory whose `*.conf` files are read after `file`: `file` + `.d`.
        public var dropInDirectory: String { file + ".d" }

        /// A layer of `file`.
        public init(file: String, required: Bool = false) {
            self.file = file
            self.required = required
        }
    }

    /// The layers, in the order they are read.
    public var layers: [Layer]

    /// The system configuration directory unless `VAULTD_SYSTEM_CONFIG_DIR` says otherwise.
    public static let defaultSystemDirectory = "/etc/vaultd"
    /// The environment variable that moves the system configuration
    /// directory: for tests and packagers only, never needed in production.
    public static let systemDirectoryVariable = "VAULTD_SYSTEM_CONFIG_DIR"
    /// The name of the main file in each configuration directory.
    public static let fileName = "vaultd.conf"
    /// The name `ConfigParser` errors give the built-in configuration.
    public static let builtInName = "(built-in)"

    /// The layers themselves.
    public init(layers: [Layer]) { self.layers = layers }

    /// The search of an instance: `explicitPath` (`--config`) alone when
    /// given; else the system file, then, unless `isRoot`, the user's.
    /// `environment` supplies `VAULTD_SYSTEM_CONFIG_DIR` and
    /// `XDG_CONFIG_HOME`; `home` is the user's home directory, if known.
    public static func plan(
        explicitPath: String?, isRoot: Bool, environment: [String: String], home: String?
    ) throws(VaultError) -> ConfigSearch {
        if let explicitPath { return ConfigSearch(layers: [Layer(file: explicitPath, required: true)]) }
        var systemDirectory = defaultSystemDirectory
        if let override = environment[systemDirectoryVariable], !override.isEmpty {
            guard override.hasPrefix("/") else {
                throw VaultError(
                    .invalidConfig,
                    "\(systemDirectoryVariable) must be an absolute path (a directory holding \(fileName)); unset it to read \(defaultSystemDirectory)"
                )
            }
            systemDirectory = override
        }
        var layers = [Layer(file: join(systemDirectory, fileName))]
        if !isRoot {
            let base: String
            if let xdg = environment["XDG_CONFIG_HOME"], xdg.hasPrefix("/") {
                base = xdg
            } else {
                base = join(home ?? "/", ".config")
            }
            let user = Layer(file: join(join(base, "vaultd"), fileName))
            if user.file != layers[0].file { layers.append(user) }
        }
        return ConfigSearch(layers: layers)
    }

    /// Reads every layer with `read` (a file's text, nil when it does not
    /// exist) and `list` (the names in a directory, sorted bytewise; empty
    /// when it does not exist), merges them and returns the configuration,
    /// its `sources` and `searchedFiles` filled in. With no file found it is
    /// the built-in configuration, and `sources` is empty.
    public func load(
        read: (String) throws(VaultError) -> String?,
        list: (String) throws(VaultError) -> [String]
    ) throws(VaultError) -> VaultConfig {
        var texts: [(text: String, file: String)] = []
        for layer in layers {
            if let text = try read(layer.file) {
                texts.append((text, layer.file))
            } else if layer.required {
                throw VaultError(
                    .invalidConfig,
                    "cannot read the configuration: \(layer.file) does not exist; --config must name an existing file")
            }
            for name in try list(layer.dropInDirectory) where name.hasSuffix(".conf") {
                let file = ConfigSearch.join(layer.dropInDirectory, name)
                // A drop-in removed between the listing and the read is skipped like a missing file.
                if let text = try read(file) { texts.append((text, file)) }
            }
        }
        let sources = texts.map(\.file)
        if texts.isEmpty { texts = [(VaultConfig.builtInText, ConfigSearch.builtInName)] }
        var config = try ConfigParser.parse(layers: texts)
        config.sources = sources
        config.searchedFiles = layers.map(\.file)
        return config
    }

    /// `directory` + `/` + `name`, without doubling a trailing slash.
    static func join(_ directory: String, _ name: String) -> String {
        directory.hasSuffix("/") ? directory + name : directory + "/" + name
    }
}
