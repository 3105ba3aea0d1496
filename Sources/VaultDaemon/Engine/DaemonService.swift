import Glibc
import Synchronization
import VarlinkServer
import VaultCore
import VaultProtocol
import VaultSystem

/// One part of the running daemon: the notifier, the store, the sessions,
/// the socket, the server (`Daemon.run` lists them). The parts start in
/// order, each from what the ones before it brought up, and stop in reverse:
/// swift-service-lifecycle's shape, run by the main thread, which serves in
/// between and runs the session manager throughout (`EngineThread`). A start
/// may block that thread (a store slow to answer); its async work goes
/// through `Daemon.blocking`.
protocol DaemonService: AnyObject {
    /// Brings the part up. When it throws, the parts started before it stop.
    func start() throws(VaultError)
    /// Takes the part down; called once, and only after `start` returned.
    func stop()
}

extension [any DaemonService] {
    /// Starts each service in order; when one fails, stops those started
    /// before it, the last first, and throws its error.
    func start() throws(VaultError) {
        for (index, service) in enumerated() {
            do { try service.start() } catch {
                prefix(index).reversed().forEach { $0.stop() }
                throw error
            }
        }
    }

    /// Stops every service, the last started first.
    func stop() { reversed().forEach { $0.stop() } }
}

/// What the parts of a running daemon are made from.
struct DaemonContext {
    let options: DaemonOptions
    let config: VaultConfig
    let tokenFilePlans: [Account: TokenFilePlan]
    let signalFD: Int32
    /// Reads the signals until the socket starts.
    let startup: StartupSignals?
    let notifier: ServiceNotifier
    let hub: SubscriptionHub
    /// The main thread's jobs: the session manager runs there.
    let engine: EngineThread
    let log: Logger
}

/// The service manager's side: STATUS= as the sessions change, flushed last.
extension ServiceNotifier: DaemonService {
    func start() {}
    func stop() { flush() }
}

/// The session store: opened before anything that keeps sessions, closed
/// after they stopped.
final class StoreService: DaemonService {
    private let open: () throws(VaultError) -> any SessionStore
    /// The store, once open.
    private(set) var store: (any SessionStore)!

    /// A store that `open` opens (`Daemon.openStore`).
    init(_ open: @escaping () throws(VaultError) -> any SessionStore) { self.open = open }

    func start() throws(VaultError) { store = try open() }

    func stop() {
        let store = self.store!
        try? Daemon.blocking { () async throws(VaultError) in await store.close() }
    }
}

/// The sessions: the manager, restored from the store (a fleet host then
/// follows the others), and the token files, which follow its table from
/// the sessions restored on. One service, as the files wait for what the
/// manager's shutdown writes.
final class Sessions: DaemonService {
    private let context: DaemonContext
    private let store: StoreService
    private(set) var manager: SessionManager!
    private(set) var tokenFiles: TokenFiles!
    private(set) var restored = (restored: 0, finishedLogouts: 0)

    init(_ context: DaemonContext, store: StoreService) { (self.context, self.store) = (context, store) }

    func start() throws(VaultError) {
        let (store, notifier, hub) = (self.store.store!, context.notifier, context.hub)
        let policy = try PolicyResolver.resolve(context.config)
        // The store's part of STATUS=, kept beside the sessions' counts.
        let storeStatus = Mutex("")
        let statusTable = Mutex<SessionTable?>(nil)
        let manager = SessionManager(
            store: store, config: context.config, clock: SystemWallClock(), log: context.log, policy: policy,
            executor: context.engine,
            tableDidChange: { table in
                if notifier.isActive {
                    notifier.status(ServiceNotifier.statusLine(table) + storeStatus.withLock { $0 })
                }
            },
            storeDidChange: { state in
                let line = Daemon.storeStatusLine(state, fleet: store is any SharedSessionStore)
                storeStatus.withLock { $0 = line }
                if notifier.isActive, let table = statusTable.withLock({ $0 }) {
                    notifier.status(ServiceNotifier.statusLine(table) + line)
                }
            },
            events: { event in hub.publish(event) })
        self.manager = manager
        statusTable.withLock { $0 = manager.table }
        restored = try Daemon.blocking(on: context.engine) { () async throws(VaultError) in
            try await manager.loadProviderSecrets()
            let restored = try await manager.restore()
            // A host of a fleet follows the others from what it restored on.
            await manager.followSharedStore()
            await manager.resumePendingRevocations()
            return restored
        }
        let tokenFiles = TokenFiles(table: manager.table, log: context.log, events: { event in hub.publish(event) })
        manager.table.observe { key in tokenFiles.changed(key) }
        tokenFiles.update(TokenFiles.targets(context.tokenFilePlans, policy: policy))
        self.tokenFiles = tokenFiles
    }

    /// A reload under way ends first. Background work (refreshes,
    /// revocations, save retries) gets what is left of the drain time;
    /// revocations are queued in the store already.
    func stop() {
        let manager = self.manager!
        try? Daemon.blocking(on: context.engine) { () async throws(VaultError) in
            await Daemon.reloadsFinished(manager)
            await manager.shutdown(graceSeconds: 5)
        }
        tokenFiles.waitIdle(seconds: 2)
    }
}

/// The listening socket: systemd's (vaultd.socket), or one vaultd binds and
/// removes again. From its start the serving loop reads the signals.
final class Socket: DaemonService {
    private let context: DaemonContext
    private(set) var fd: Int32 = -1
    /// Where the socket is, for the log: its path, or "passed by systemd".
    private(set) var description = ""
    private var ownsFile = false

    init(_ context: DaemonContext) { self.context = context }

    func start() throws(VaultError) {
        // No socket file exists yet.
        context.startup?.handOff()
        if let activated = try SocketActivation.listeningSocket() {
            (fd, description) = (activated, "passed by systemd")
        } else {
            description =
                context.options.socketPath ?? SocketPath.default(environment: Environment.all(), uid: getuid())
            fd = try Listener.bind(description, mode: context.config.socketMode)
            ownsFile = true
        }
    }

    func stop() {
        if ownsFile { unlink(description) }
        close(fd)
    }
}

/// The serving loop on the socket. It has drained when `run` returns.
final class Server: DaemonService {
    private let context: DaemonContext
    private let socket: Socket
    private let sessions: Sessions
    private var server: VarlinkServer!

    init(_ context: DaemonContext, socket: Socket, sessions: Sessions) {
        (self.context, self.socket, self.sessions) = (context, socket, sessions)
    }

    func start() throws(VaultError) {
        let (context, manager, tokenFiles, notifier) = (
            context, sessions.manager!, sessions.tokenFiles!, context.notifier
        )
        let hooks = ServerHooks(
            watchdogIntervalMilliseconds: notifier.watchdogIntervalMilliseconds,
            watchdogProbe: { await manager.ping() },
            watchdog: { notifier.watchdog() },
            stopping: { notifier.stopping() },
            reload: { server in
                Daemon.reload(
                    context.options, manager: manager, server: server, notifier: notifier, tokenFiles: tokenFiles,
                    log: context.log)
            },
            privileged: { caller in manager.policy.policy.isAdmin(caller) },
            ownWork: (context.engine.pollFD, { [engine = context.engine] in engine.runQueued() }))
        do {
            server = try VarlinkServer(
                listenFD: socket.fd, signalFD: context.signalFD,
                service: VaultMethods.service(manager: manager, clock: SystemWallClock(), hub: context.hub),
                log: context.log, errors: VaultMethods.transportErrors, hooks: hooks, limits: context.config.serving)
        } catch {
            throw VaultError(.internalError, "cannot start serving: \(error)")
        }
        context.hub.attach(server)
    }

    /// Serves until SIGTERM or SIGINT; returns the signal.
    func run() -> Int32 { server.run() }

    func stop() {}
}
