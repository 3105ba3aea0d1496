import CShim
import Dispatch
import Glibc
import Synchronization
import VarlinkServer
import VaultCore
import VaultProtocol
import VaultSystem

/// The wall clock of the running daemon.
public struct SystemWallClock: WallClock {
    /// The system clock.
    public init() {}

    public func now() -> UnixTime {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return UnixTime(seconds: Int64(ts.tv_sec))
    }

    public func preciseNow() -> Double {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
    }
}

/// vaultd's command line.
public struct DaemonOptions: Sendable {
    public var configPath: String?
    public var socketPath: String?
    public var logLevel: Logger.Level = .info
    public var checkConfigOnly = false
    /// Keep sessions in memory instead of the Secret Service (`--memory-store`):
    /// for benchmarks and tests only, since sessions are lost when vaultd stops.
    public var memoryStore = false
    /// A job on the store to run instead of serving (`--rotate-key`,
    /// `--migrate-store FROM TO`): vaultd does it, prints what it did, exits.
    public var storeJob: StoreJob?

    /// The usage text of `vaultd --help`.
    public static let usage = """
        Usage: vaultd [OPTIONS]

        Keeps chat and messaging sessions in the Linux secret store and serves
        them to local clients over a Varlink Unix socket (see vaultctl).

        Options:
          --config PATH       read this configuration file (and its drop-ins) only,
                              instead of the files listed under Configuration below
          --socket PATH       listening socket (default: $VAULTD_SOCKET, else
                              $XDG_RUNTIME_DIR/vaultd/socket, else /run/vaultd/socket for root)
          --log-level LEVEL   error, warning, notice, info (default) or debug
          --check-config      validate the configuration, print the files read, exit
          --memory-store      keep sessions in memory only, not in the Secret Service:
                              they are lost when vaultd stops, and no D-Bus is needed.
                              For benchmarks and tests, never for real sessions
          --rotate-key        seal every row of the SQLite store (Store=sqlite) under a
                              new data key, print the old and new key ids, exit; with
                              the key from the credential data-key, give the new key as
                              data-key and the old as data-key.previous first
          --migrate-store FROM TO
                              move every session, queued revocation and client secret
                              from one store engine to the other (secret-service,
                              sqlite), print the counts, exit. Crash-safe: run it again
                              after an interruption to finish. Stop vaultd first
          --help              show this text
          --version           show the version

        Configuration: without --config, vaultd reads /etc/vaultd/vaultd.conf,
        then /etc/vaultd/vaultd.conf.d/*.conf; a user instance (not root) then
        reads $XDG_CONFIG_HOME/vaultd/vaultd.conf (~/.config/vaultd/vaultd.conf)
        and its vaultd.conf.d/*.conf. A user configures their own instance in
        ~/.config/vaultd, not in /etc. Drop-ins are read in lexical order; a
        later file wins key by key, and may add providers and accounts. Missing
        files are skipped; with none at all, a built-in configuration (one
        provider, 'demo') is used. --check-config prints the files read.
        VAULTD_SYSTEM_CONFIG_DIR replaces /etc/vaultd (for tests and packagers).

        SIGHUP reloads the configuration; SIGTERM stops vaultd cleanly. Under
        systemd, vaultd takes its socket from vaultd.socket, reports READY,
        STATUS, RELOADING, STOPPING and WATCHDOG, and logs to the journal.

        Tokens are kept in the Secret Service (gnome-keyring, KeePassXC) on the
        session bus in $DBUS_SESSION_BUS_ADDRESS; vaultd refuses to start when it
        is unreachable or its default collection is locked (unless --memory-store).
        Should it go away or be locked later, vaultd serves tokens from memory,
        refuses changes, and reconnects on its own.
        """

    /// What parsing the command line asks for.
    public enum Parsed {
        case run(DaemonOptions)
        case help
        case version
    }

    /// Parses `arguments` (without the program name).
    public static func parse(_ arguments: [String]) throws(VaultError) -> Parsed {
        var options = DaemonOptions()
        var index = 0
        func value(_ name: String) throws(VaultError) -> String {
            index += 1
            guard index < arguments.count else { throw VaultError(.invalidParameter, "\(name) needs a value") }
            return arguments[index]
        }
        while index < arguments.count {
            let argument = arguments[index]
            switch argument {
            case "--help", "-h": return .help
            case "--version": return .version
            case "--config": options.configPath = try value(argument)
            case "--socket": options.socketPath = try value(argument)
            case "--check-config": options.checkConfigOnly = true
            case "--memory-store": options.memoryStore = true
            case "--rotate-key": options.storeJob = .rotateKey
            case "--migrate-store":
                let from = try StoreJob.engine(try value(argument), option: argument)
                let to = try StoreJob.engine(try value(argument), option: argument)
                options.storeJob = .migrateStore(from: from, to: to)
            case "--log-level":
                let name = try value(argument)
                guard let level = Logger.Level.allCases.first(where: { $0.name == name }) else {
                    throw VaultError(
                        .invalidParameter,
                        "unknown log level '\(name)' (one of: error, warning, notice, info, debug)")
                }
                options.logLevel = level
            default:
                throw VaultError(.invalidParameter, "unknown argument '\(argument)'; see vaultd --help")
            }
            index += 1
        }
        return .run(options)
    }
}

/// Builds the pieces of vaultd and runs them: config, secret store, restored
/// sessions, then the socket. Returns the process exit code.
public enum Daemon {
    /// Runs vaultd with the process's arguments; returns the exit status.
    /// `openShared` opens the fleet's store (`Store=etcd`), which lives in
    /// its own target (VaultFleet) that the executable links.
    public static func main(arguments: [String], openShared: @escaping SharedStoreOpener) -> Int32 {
        // Before any thread exists: signals are read from a signalfd, so they
        // must be blocked in every thread that will be created.
        let signalFD = vaultd_signalfd_termination()
        signal(SIGPIPE, SIG_IGN)
        _ = vaultd_disable_core_dumps()
        raiseDescriptorLimit()

        let parsed: DaemonOptions.Parsed
        do { parsed = try DaemonOptions.parse(arguments) } catch {
            printError("vaultd: \(error.message)")
            return 2
        }
        switch parsed {
        case .help:
            print(DaemonOptions.usage)
            return 0
        case .version:
            print("vaultd \(VaultMethods.version)")
            return 0
        case .run(let options):
            let log = Logger(level: options.logLevel, target: Logger.automaticTarget())
            // Every line handed to the log writer is out before vaultd exits.
            defer { log.flush() }
            // SIGTERM and SIGINT stop vaultd even while a start-up step blocks.
            let startup = signalFD >= 0 ? StartupSignals(signalFD: signalFD, log: log) : nil
            do {
                return try run(options, signalFD: signalFD, log: log, startup: startup, openShared: openShared)
            } catch {
                log.error(error.message, ["code": error.code.seedCode])
                return 1
            }
        }
    }

    static func run(
        _ options: DaemonOptions, signalFD: Int32, log: Logger, startup: StartupSignals?,
        openShared: @escaping SharedStoreOpener
    ) throws(VaultError) -> Int32 {
        let config = try loadConfig(options.configPath, log: log)
        let tokenFilePlans = try TokenFiles.check(config)
        if options.checkConfigOnly {
            print(checkConfigReport(config, store: try StoreSelection.resolve(config)))
            return 0
        }
        if let job = options.storeJob { return try runStoreJob(job, options: options, config: config, log: log) }
        guard signalFD >= 0 else { throw VaultError(.internalError, "signalfd failed: \(SystemError("signalfd"))") }
        let context = DaemonContext(
            options: options, config: config, tokenFilePlans: tokenFilePlans, signalFD: signalFD, startup: startup,
            notifier: ServiceNotifier(), hub: SubscriptionHub(log: log), engine: EngineThread(), log: log)
        let store = StoreService { () throws(VaultError) in
            try openStore(options, config: config, log: log, openShared: openShared)
        }
        let sessions = Sessions(context, store: store)
        let socket = Socket(context)
        let server = Server(context, socket: socket, sessions: sessions)
        // In this order: nothing listens before the sessions are restored.
        let services: [any DaemonService] = [context.notifier, store, sessions, socket, server]
        try services.start()
        log.notice(
            "ready",
            [
                "socket": socket.description, "sessions": String(sessions.restored.restored),
                "finishedLogouts": String(sessions.restored.finishedLogouts), "store": store.store.profile.location,
                "providers": config.providers.keys.sorted().joined(separator: ","),
                "config": config.sources.isEmpty ? ConfigSearch.builtInName : config.sources.joined(separator: ","),
            ])
        context.notifier.ready(status: ServiceNotifier.statusLine(sessions.manager.table))
        let signal = server.run()
        services.stop()
        log.notice("stopped", ["signal": String(signal)])
        return 0
    }

    /// The store's part of the STATUS= line: nothing while it is available.
    /// A host of a fleet says what it does without the shared store.
    static func storeStatusLine(_ state: StoreState, fleet: Bool = false) -> String {
        switch state {
        case .available: return ""
        case .unavailable where fleet:
            return "; store=unavailable (no quorum): read-only, tokens served from memory, no refresh, reconnecting"
        case .unavailable: return "; secret store unavailable, changes refused, reconnecting"
        case .locked: return "; secret store locked, changes refused until it is unlocked"
        }
    }

    /// One descriptor per client: raise the soft limit (often 1024) towards the
    /// hard one, as systemd's own daemons do, so a thousand subscribers fit.
    static func raiseDescriptorLimit() {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return }
        let wanted = min(limit.rlim_max, 65536)
        if limit.rlim_cur < wanted {
            limit.rlim_cur = wanted
            _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        }
    }

    /// SIGHUP: reads and validates the whole configuration again, then puts it
    /// in force at once; a broken one is refused and the old one stays.
    static func reload(
        _ options: DaemonOptions, manager: SessionManager, server: VarlinkServer, notifier: ServiceNotifier,
        tokenFiles: TokenFiles, log: Logger
    ) {
        notifier.reloading()
        // Off the serving thread (reading files and resolving names can block),
        // and one reload after the other, so the last SIGHUP's file wins.
        reloadQueue.async {
            let config: VaultConfig
            let policy: AccessPolicy
            let tokenFilePlans: [Account: TokenFilePlan]
            do throws(VaultError) {
                config = try loadConfig(options.configPath, log: log)
                policy = try PolicyResolver.resolve(config)
                tokenFilePlans = try TokenFiles.check(config)
            } catch {
                log.error(
                    "reload refused, the previous configuration stays in force: \(error.message)",
                    ["code": error.code.seedCode, "event": "reload"])
                notifier.ready(status: ServiceNotifier.statusLine(manager.table) + "; last reload failed")
                return
            }
            // Put in force on the manager's thread, in the order read, so the last SIGHUP's file wins.
            manager.post { manager in
                let change = manager.apply(config, policy: policy)
                server.reload(config.serving)
                tokenFiles.update(TokenFiles.targets(tokenFilePlans, policy: policy))
                log.notice(
                    "configuration reloaded",
                    [
                        "event": "reload", "providers": config.providers.keys.sorted().joined(separator: ","),
                        "added": change.added.joined(separator: ","),
                        "removed": change.removed.joined(separator: ","),
                        "orphanedSessions": String(change.orphaned.count),
                    ])
                notifier.ready(status: ServiceNotifier.statusLine(manager.table))
            }
        }
    }

    /// Where reloads read their files, one at a time.
    static let reloadQueue = DispatchQueue(label: "io.vaultd.reload")

    /// Returns once every reload signalled so far is in force (or refused):
    /// the sessions stop after it, not under it.
    static func reloadsFinished(_ manager: SessionManager) async {
        await withCheckedContinuation { done in reloadQueue.async { done.resume() } }
        // Every reload read is posted to the manager by now: this runs after them.
        await withCheckedContinuation { done in manager.post { _ in done.resume() } }
    }

    /// Reads the configuration where `ConfigSearch` says: the given file
    /// (which must exist) and its drop-ins; else `/etc/vaultd/vaultd.conf`
    /// and, for a user instance, the user's own file after it, each with its
    /// drop-ins; else, when no file is found, the built-in configuration,
    /// with a warning naming the files looked for.
    static func loadConfig(_ explicitPath: String?, log: Logger) throws(VaultError) -> VaultConfig {
        let search = try ConfigSearch.plan(
            explicitPath: explicitPath, isRoot: getuid() == 0, environment: Environment.all(),
            home: Files.homeDirectory())
        let config = try search.load(
            read: { (path) throws(VaultError) in try readConfigFile(path) },
            list: { (directory) throws(VaultError) in try listDropIns(directory) })
        if config.sources.isEmpty {
            log.warning(
                "no configuration file found; using the built-in one (provider 'demo'). Create one of the files looked for to configure your providers",
                ["lookedFor": config.searchedFiles.joined(separator: ",")])
        } else {
            log.info("configuration read", ["files": config.sources.joined(separator: ",")])
        }
        // libcurl is loaded only when an oauth2 provider needs it; a missing one
        // is reported now, not at the first refresh.
        if let name = config.providers.keys.sorted().first(where: { config.providers[$0]?.oauth2 != nil }),
            let failure = HTTPClient.loadFailure()
        {
            throw VaultError(.invalidConfig, "[Provider \(name)] is an oauth2 provider, but \(failure)")
        }
        // A helper that cannot be run would fail every login and refresh.
        try HelperProgram.check(config)
        return config
    }

    /// What `vaultd --check-config` prints: one `read: FILE` line per file
    /// read, in order (`read: (built-in)` when none was found), then the verdict.
    static func checkConfigReport(_ config: VaultConfig, store: StoreSelection) -> String {
        let files = config.sources.isEmpty ? [ConfigSearch.builtInName] : config.sources
        return
            (files.map { "read: \($0)" } + [
                store.summary, "configuration is valid: \(config.providers.count) provider(s)",
            ])
            .joined(separator: "\n")
    }

    /// Reads one configuration file, which must be a regular file: a FIFO, a
    /// device or a directory is an error naming it, never a hang. Opened
    /// through `PathTrust.vaultd` (so with O_NONBLOCK: opening a FIFO does
    /// not wait for a writer) and checked with fstat on the open descriptor,
    /// so nothing can be swapped in between. A file that does not exist is
    /// nil (`ConfigSearch` decides whether that is an error); one that
    /// someone other than root or vaultd's user could change, or reached
    /// through their symlink, is refused (`trusted(_:leaf:)`); any other
    /// failure to read it is an error.
    static func readConfigFile(_ path: String) throws(VaultError) -> String? {
        guard let fd = try trusted(path, leaf: .file) else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0 else {
            throw VaultError(.invalidConfig, "cannot read the configuration: \(SystemError("fstat \(path)"))")
        }
        guard st.st_mode & S_IFMT == S_IFREG else {
            throw VaultError(
                .invalidConfig,
                "\(path) is \(fileKind(st.st_mode)), not a regular file; point --config (or vaultd.conf.d/) at regular files only"
            )
        }
        let bytes: [UInt8]
        do { bytes = try Files.readAll(fd, limit: 1 << 20, name: path) } catch {
            throw VaultError(.invalidConfig, "cannot read the configuration: \(error)")
        }
        return try ConfigParser.text(of: bytes, file: path)
    }

    /// The `*.conf` names in the drop-in directory `directory`, which
    /// `trusted(_:leaf:)` must let through; none when it does not exist.
    static func listDropIns(_ directory: String) throws(VaultError) -> [String] {
        guard let fd = try trusted(directory, leaf: .directory) else { return [] }
        do { return try Files.list(descriptor: fd, name: directory) } catch {
            throw VaultError(.invalidConfig, "cannot read the drop-in directory: \(error)")
        }
    }

    /// `path` opened through `PathTrust.vaultd`, nil when it does not
    /// exist. Whoever could change a configuration file could grant
    /// themselves another user's tokens (TokenReadUsers=, AdminGroup=), so a
    /// file or drop-in directory that anyone but root or vaultd's user owns
    /// or may write, or that is reached through a directory they could
    /// change or a symlink of theirs, is an error naming the file and why.
    static func trusted(_ path: String, leaf: PathTrust.Leaf) throws(VaultError) -> Int32? {
        let outcome: PathTrust.Outcome
        do { outcome = try PathTrust.vaultd.open(path, leaf: leaf) } catch {
            if error.errno == ENOENT || error.errno == ENOTDIR { return nil }
            throw VaultError(.invalidConfig, "cannot read the configuration: \(error)")
        }
        switch outcome {
        case .opened(let fd): return fd
        case .missing: return nil
        case .refused(let problem):
            throw VaultError(
                .invalidConfig,
                "refusing to read the configuration \(path): \(problem); make it and the directories above it owned by root (or vaultd's user) and writable by nobody else (chmod go-w), with no symlink of another user on the way"
            )
        }
    }

    /// "a FIFO", "a directory", ... for a file's `st_mode`.
    static func fileKind(_ mode: mode_t) -> String {
        switch mode & S_IFMT {
        case S_IFIFO: return "a FIFO"
        case S_IFCHR: return "a character device"
        case S_IFBLK: return "a block device"
        case S_IFDIR: return "a directory"
        case S_IFSOCK: return "a socket"
        case S_IFLNK: return "a symlink"
        default: return "of an unknown kind"
        }
    }

    /// Runs async work from a thread outside Swift's cooperative pool (the
    /// main thread) to its end, running the jobs of `engine` meanwhile: the
    /// session manager's, when it is the main thread's engine, which the
    /// start-up before serving and the shutdown after need; none, when it is
    /// the default, an engine of this call's own. The main thread stays
    /// synchronous: it serves, and an async main resumes after its first
    /// await on a dispatch worker thread, not on the main thread (Linux).
    static func blocking<T: Sendable>(
        on engine: EngineThread = EngineThread(), _ body: @escaping @Sendable () async throws(VaultError) -> T
    ) throws(VaultError) -> T {
        let outcome = Mutex<Result<T, VaultError>?>(nil)
        Task {
            let result: Result<T, VaultError>
            do throws(VaultError) { result = .success(try await body()) } catch { result = .failure(error) }
            outcome.withLock { $0 = result }
            engine.wake()
        }
        engine.run(until: { outcome.withLock { $0 != nil } })
        return try outcome.withLock { $0! }.get()
    }

    static func printError(_ text: String) {
        var bytes = Array((text + "\n").utf8)
        _ = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
    }
}
