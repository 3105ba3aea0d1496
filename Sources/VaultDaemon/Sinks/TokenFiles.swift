import Glibc
import Synchronization
import VaultCore
import VaultSystem

/// One account's token file as checked against the host: the settings, and
/// the uid and gid the file is given to (nil: left to vaultd's own).
public struct TokenFilePlan: Sendable, Equatable {
    /// What the configuration says.
    public var settings: TokenFileSettings
    /// The owner the file is given with fchown; nil when vaultd's own.
    public var fileOwner: UInt32?
    /// The group given with the owner: the owner's primary group, or
    /// unchanged (`UInt32.max`) for a uid with no entry in the user database.
    public var fileGroup: UInt32?

    /// A plan for `settings`, the file given to `fileOwner` (and `fileGroup`) when set.
    public init(settings: TokenFileSettings, fileOwner: UInt32? = nil, fileGroup: UInt32? = nil) {
        self.settings = settings
        self.fileOwner = fileOwner
        self.fileGroup = fileGroup
    }
}

/// The token files of `[Account PROVIDER USER] TokenFile=`: each holds the
/// access token of the declared owner's session of that account, exactly
/// what `GetToken` serves (`TokenFileFormat=raw`), or the session's fields
/// as JSON or `EnvironmentFile=` lines (`json`, `env`; see `SessionFields`).
/// It is written (atomically, see
/// `Directory.writeAtomically`) when vaultd starts with the session logged
/// in, on login and on every refresh or replacement, and removed when the
/// session ends (logout, kick, expiry, a refused token).
///
/// The files follow the `SessionTable`, the one place where the token
/// served changes, through its observer: a change marks the account dirty
/// and one job on `WorkerPool`'s token-file worker (a thread of vaultd's own, never
/// the serving loop or the cooperative pool) brings every dirty account's
/// file in line with the table, coalescing changes that come while it
/// works. A login never waits for a file. A failed write or removal is an
/// error the session's owner sees: logged at error priority (journald), sent
/// as a `tokenFileFailed` event, and shown in the session's status
/// (`tokenFileError`) and in STATUS= until a later write succeeds; it is
/// tried again at the account's next change. None of these holds the token.
/// A raw file's token goes from its `Secret` storage (wiped when released)
/// straight to write(2); the JSON and env documents are built in a buffer
/// sized to never grow, zeroed once written.
public final class TokenFiles: Sendable {
    /// One file to keep in line with one session.
    struct Target: Sendable, Equatable {
        var key: SessionKey
        var plan: TokenFilePlan
    }

    /// What the file of one account was last brought to: written with a
    /// plan (path, mode, owner, format) and what its format holds of the
    /// session, or removed from a path.
    enum Written {
        case token(TokenFilePlan, SessionFields)
        case absent(path: String)
    }

    private struct State {
        var targets: [SessionKey: Target] = [:]
        var dirty: Set<SessionKey> = []
        /// Files of targets a reload dropped or moved: removed by the next job.
        var stale: [Target] = []
        var written: [SessionKey: Written] = [:]
        /// A job is queued or running.
        var scheduled = false
    }

    private let state = Mutex(State())
    private let table: SessionTable
    private let log: Logger
    private let events: @Sendable (VaultEvent) -> Void

    /// Token files for the sessions of `table`, reported to `log` and, when
    /// one fails, to `events` (the subscribers); none until `update(_:)`.
    public init(table: SessionTable, log: Logger, events: @escaping @Sendable (VaultEvent) -> Void = { _ in }) {
        self.table = table
        self.log = log
        self.events = events
    }

    /// The targets of `plans`: the session of each account's declared owner
    /// (`Owner=`, else the user vaultd runs as), as `policy` resolves it.
    public static func targets(_ plans: [Account: TokenFilePlan], policy: AccessPolicy) -> [SessionKey: TokenFilePlan] {
        var targets: [SessionKey: TokenFilePlan] = [:]
        for (account, plan) in plans {
            targets[SessionKey(owner: policy.declared[account]?.owner ?? policy.vaultdUID, account: account)] = plan
        }
        return targets
    }

    /// Puts `targets` in force (at start, and at each reload) and brings
    /// every file in line with the table. The file of an account no longer
    /// configured, or moved to another path, is removed.
    public func update(_ targets: [SessionKey: TokenFilePlan]) {
        let dropped = state.withLock { state in state.targets.keys.filter { targets[$0] == nil } }
        // A file no longer configured fails no one: its owner's status stops saying so.
        for key in dropped { table.tokenFileFailed(key, nil) }
        let schedule = state.withLock { state in
            for (key, old) in state.targets where targets[key] != old.plan {
                if targets[key]?.settings.path != old.plan.settings.path { state.stale.append(old) }
                state.written[key] = nil
            }
            state.targets = Dictionary(
                uniqueKeysWithValues: targets.map { ($0.key, Target(key: $0.key, plan: $0.value)) })
            state.dirty.formUnion(targets.keys)
            return takeSchedule(&state)
        }
        if schedule { enqueue() }
    }

    /// The session `key` changed: its file is brought in line soon. Returns at once.
    public func changed(_ key: SessionKey) {
        let schedule = state.withLock { state in
            guard state.targets[key] != nil else { return false }
            state.dirty.insert(key)
            return takeSchedule(&state)
        }
        if schedule { enqueue() }
    }

    /// Waits, at most `seconds`, until no job is queued or running: at
    /// shutdown, so that no write is cut short by the exit.
    public func waitIdle(seconds: Double) {
        let deadline = Monotonic.milliseconds() + UInt64(seconds * 1000)
        var pause = timespec(tv_sec: 0, tv_nsec: 5_000_000)
        while state.withLock({ $0.scheduled }), Monotonic.milliseconds() < deadline {
            nanosleep(&pause, nil)
        }
    }

    /// True (and marks a job scheduled) when a job must be queued.
    private func takeSchedule(_ state: inout State) -> Bool {
        guard !state.scheduled, !state.dirty.isEmpty || !state.stale.isEmpty else { return false }
        state.scheduled = true
        return true
    }

    private func enqueue() {
        WorkerPool.shared.enqueue(
            .file, lane: "tokenfiles", cap: 1, deadline: Monotonic.milliseconds() + 3_600_000,
            { [self] in work() },
            expired: { [self] in
                // Never seen: one job at a time, on a worker of its own.
                let again = state.withLock { state in
                    state.scheduled = false
                    return takeSchedule(&state)
                }
                if again { enqueue() }
            })
    }

    /// The job: handles dirty accounts until none is left.
    private func work() {
        for _ in 0..<1_000_000 {
            let (stale, dirty) = state.withLock { state in
                let taken = (state.stale, state.dirty)
                state.stale = []
                state.dirty = []
                if taken.0.isEmpty && taken.1.isEmpty { state.scheduled = false }
                return taken
            }
            if stale.isEmpty && dirty.isEmpty { return }
            for target in stale { removeStale(target) }
            if !stale.isEmpty {
                // A path a reload gave to another account may have been written
                // for it already (a reload racing this job): write it again.
                let removed = Set(stale.map(\.plan.settings.path))
                state.withLock { state in
                    for (key, target) in state.targets where removed.contains(target.plan.settings.path) {
                        state.written[key] = nil
                        state.dirty.insert(key)
                    }
                }
            }
            for key in dirty.sorted() { bringInLine(key) }
        }
        state.withLock { $0.scheduled = false }
    }

    /// Writes or removes the file of `key` as its session in the table says.
    private func bringInLine(_ key: SessionKey) {
        guard let target = state.withLock({ $0.targets[key] }) else { return }
        let view = table.view(of: key)
        let record = view?.state == .logged ? view?.record : nil
        let token = record.map { TokenFiles.content($0, target.plan.settings.format) }
        let last = state.withLock { $0.written[key] }
        let path = target.plan.settings.path
        var fields = TokenFiles.fields(key)
        fields["path"] = path
        if let token {
            if case .token(let plan, let written)? = last, plan == target.plan, written == token { return }
            fields["format"] = target.plan.settings.format.rawValue
            do throws(SystemError) {
                try write(token, target.plan)
                state.withLock { $0.written[key] = .token(target.plan, token) }
                table.tokenFileFailed(key, nil)
                fields["event"] = "tokenFileWritten"
                log.info("token file written", fields)
            } catch {
                state.withLock { $0.written[key] = nil }
                failed(key, "write", error, fields)
            }
        } else {
            if case .absent(path)? = last { return }
            do throws(SystemError) {
                let removed = try Directory(target.plan.settings.directory).remove(target.plan.settings.name)
                state.withLock { $0.written[key] = .absent(path: path) }
                table.tokenFileFailed(key, nil)
                if removed {
                    fields["event"] = "tokenFileRemoved"
                    log.info("token file removed", fields)
                }
            } catch {
                state.withLock { $0.written[key] = nil }
                failed(key, "remove", error, fields)
            }
        }
    }

    /// Tells the owner of `key` that its token file could not be written or
    /// removed (`action`): the log at error priority and the status at each
    /// attempt, an event when the failure is new (a refresh that changes the
    /// session twice while the directory stays unfit is one failure, not two).
    private func failed(_ key: SessionKey, _ action: String, _ error: SystemError, _ fields: [String: String]) {
        let message = "the token file could not be \(action == "write" ? "written" : "removed"): \(error.description)"
        var fields = fields
        fields["event"] = "tokenFileFailed"
        fields["error"] = error.description
        log.error(
            "\(message); it is tried again at the session's next change (vaultctl status \(key.account.provider) \(key.account.user) shows it until then)",
            fields)
        guard table.tokenFileFailed(key, message) else { return }
        events(
            VaultEvent(
                kind: .tokenFileFailed, account: key.account, ownerUID: key.owner, time: SystemWallClock().now(),
                reason: action, message: message))
    }

    /// Removes the file of a target the configuration no longer has.
    private func removeStale(_ target: Target) {
        var fields = TokenFiles.fields(target.key)
        fields["path"] = target.plan.settings.path
        do throws(SystemError) {
            if try Directory(target.plan.settings.directory).remove(target.plan.settings.name) {
                fields["event"] = "tokenFileRemoved"
                log.info("token file removed: no longer configured", fields)
            }
        } catch {
            fields["event"] = "tokenFileFailed"
            fields["error"] = error.description
            log.warning("a token file no longer configured could not be removed", fields)
        }
    }

    /// What a file of `format` holds of `record`: for a raw file the token
    /// alone, so that a refresh that keeps the token (a new expiry) does not
    /// write the file again.
    static func content(_ record: SessionRecord, _ format: TokenFileFormat) -> SessionFields {
        guard format == .raw else { return SessionFields(record) }
        return SessionFields(token: record.accessToken, provider: record.account.provider, user: record.account.user)
    }

    /// Writes `content` as `plan` says, after checking the directory again,
    /// on the descriptor the write goes through (see `directory(of:vaultdUID:)`),
    /// so a directory remounted or changed since the configuration was
    /// checked gets no token.
    private func write(_ content: SessionFields, _ plan: TokenFilePlan) throws(SystemError) {
        let directory: Directory
        do { directory = try TokenFiles.directory(of: plan, vaultdUID: getuid()) } catch {
            switch error {
            case .cannotOpen(let failure): throw failure
            case .unfit(let problem): throw SystemError(problem, errno: EPERM)
            }
        }
        let owner = plan.fileOwner.map { (uid: uid_t($0), gid: gid_t(plan.fileGroup ?? UInt32.max)) }
        // withUTF8 and withUnsafeBufferPointer rethrow untyped errors: the outcome is carried out as a value.
        let write = { (bytes: UnsafeBufferPointer<UInt8>) -> SystemError? in
            do throws(SystemError) {
                try directory.writeAtomically(
                    plan.settings.name, mode: mode_t(plan.settings.mode), owner: owner, bytes: bytes)
                return nil
            } catch {
                return error
            }
        }
        var document: [UInt8]
        switch plan.settings.format {
        case .raw:
            if let failure = content.token.withUTF8(write) { throw failure }
            return
        case .json:
            document = content.json()
        case .env:
            do { document = try content.environmentFile() } catch {
                throw SystemError(error.description, errno: EINVAL)
            }
        }
        defer { document.withUnsafeMutableBytes { Secret.wipe($0) } }
        if let failure = document.withUnsafeBufferPointer(write) { throw failure }
    }
}

extension TokenFiles {
    /// The log fields of one session, as the session manager writes them.
    static func fields(_ key: SessionKey) -> [String: String] {
        ["provider": key.account.provider, "user": key.account.user, "owner": String(key.owner)]
    }
}

// MARK: Checks

extension TokenFiles {
    /// Checks every token file of `config` against this host and resolves
    /// its owner, for `--check-config`, start-up and reload. Refused, with
    /// the file, the line and the key, and what to do:
    ///
    /// - a directory that is missing or not a directory;
    /// - a directory on a disk file system (not tmpfs or ramfs), unless
    ///   `TokenFileOnDisk=yes`: the token would outlive a reboot and end up
    ///   in backups;
    /// - a directory that anyone but root, vaultd's user or the file's owner
    ///   can write (sticky bit or not), a directory above it that anyone but
    ///   root or vaultd's user can change, or a symlink on the way that
    ///   another user owns: they could put their own file in the token's
    ///   place or, for a vaultd running as root, redirect its writes (see
    ///   `directory(of:vaultdUID:)`);
    /// - a path that is a directory;
    /// - `TokenFileOwner=` naming an unknown user, or another user than
    ///   vaultd's own when vaultd does not run as root (only root can give a
    ///   file away).
    public static func check(_ config: VaultConfig, vaultdUID: UInt32 = getuid()) throws(VaultError)
        -> [Account: TokenFilePlan]
    {
        var plans: [Account: TokenFilePlan] = [:]
        for account in config.accounts.keys.sorted() {
            guard let settings = config.accounts[account]?.tokenFile else { continue }
            plans[account] = try plan(settings, vaultdUID: vaultdUID)
        }
        return plans
    }

    static func plan(_ settings: TokenFileSettings, vaultdUID: UInt32) throws(VaultError) -> TokenFilePlan {
        func refuse(_ message: String) -> VaultError {
            VaultError(.invalidConfig, "\(settings.location): key 'TokenFile': \(message)")
        }
        var plan = TokenFilePlan(settings: settings)
        if let owner = settings.owner {
            let at = settings.ownerLocation ?? settings.location
            let uid: UInt32
            var gid: UInt32?
            if let number = UInt32(owner) {
                uid = number
                if let entry = getpwuid(number) { gid = entry.pointee.pw_gid }
            } else if let entry = getpwnam(owner) {
                uid = entry.pointee.pw_uid
                gid = entry.pointee.pw_gid
            } else {
                throw VaultError(
                    .invalidConfig,
                    "\(at): key 'TokenFileOwner': no user '\(owner)' on this host; create it or fix the name")
            }
            if uid != vaultdUID {
                guard vaultdUID == 0 else {
                    throw VaultError(
                        .invalidConfig,
                        "\(at): key 'TokenFileOwner': vaultd runs as uid \(vaultdUID) and cannot give a file to uid \(uid) (only root can); remove TokenFileOwner=, or give the reader access with TokenFileMode=0640 and the directory's group"
                    )
                }
                plan.fileOwner = uid
                plan.fileGroup = gid ?? UInt32.max
            }
        }
        let directory: Directory
        do { directory = try TokenFiles.directory(of: plan, vaultdUID: vaultdUID) } catch {
            switch error {
            case .cannotOpen(let failure):
                throw refuse(
                    "cannot open the directory \(settings.directory) (\(failure)); create it (for a service, RuntimeDirectory= in its unit) or choose another"
                )
            case .unfit(let problem): throw refuse(problem)
            }
        }
        var st = stat()
        if fstatat(directory.fd, settings.name, &st, AT_SYMLINK_NOFOLLOW) == 0, st.st_mode & S_IFMT == S_IFDIR {
            throw refuse("\(settings.path) is a directory; name a file")
        }
        return plan
    }

    /// Why the directory of a token file cannot be used.
    enum DirectoryProblem: Error {
        /// It cannot be opened (missing, not searchable, ...).
        case cannotOpen(SystemError)
        /// Someone else could change it, or it is on a disk: what to say.
        case unfit(String)
    }

    /// The directory of `plan`, opened through a `PathTrust` walk of its
    /// path as given: checked at configuration time and again before every
    /// write, on the descriptor the write then goes through. Refused: a
    /// directory that anyone but root, vaultd's user or the file's owner can
    /// write, sticky bit or not (anyone could create the file's name first
    /// and keep the token vaultd's rename then cannot put there); a
    /// directory above it that anyone but root or vaultd's user could
    /// change; a symlink on the way that another user owns (they could point
    /// it elsewhere); a disk file system, unless `TokenFileOnDisk=yes`.
    static func directory(of plan: TokenFilePlan, vaultdUID: UInt32) throws(DirectoryProblem) -> Directory {
        let settings = plan.settings
        let trust = PathTrust(owners: [vaultdUID], leafOwners: plan.fileOwner.map { [$0] } ?? [])
        let outcome: PathTrust.Outcome
        do { outcome = try trust.open(settings.directory, leaf: .directory) } catch { throw .cannotOpen(error) }
        let directory: Directory
        switch outcome {
        case .opened(let fd): directory = Directory(descriptor: fd, path: settings.directory)
        case .missing: throw .cannotOpen(SystemError("open \(settings.directory)", errno: ENOENT))
        case .refused(let problem):
            throw .unfit(
                "\(problem); choose a directory that only root, vaultd's user or the file's owner can write, below directories only root or vaultd's user can change (for a service, RuntimeDirectory= in its unit)"
            )
        }
        if !settings.onDisk {
            let inMemory: Bool
            let type: Int
            do {
                inMemory = try directory.isInMemory()
                type = try directory.fileSystemType()
            } catch {
                throw .cannotOpen(error)
            }
            if !inMemory {
                throw .unfit(
                    "\(directory.path) is on a disk file system (\(fileSystemName(type))), where the token would outlive a reboot and end up in backups; choose a directory on a memory file system (tmpfs or ramfs, such as vaultd's RuntimeDirectory= under /run, or $XDG_RUNTIME_DIR), or set TokenFileOnDisk=yes"
                )
            }
        }
        return directory
    }

    /// A file system's name for a message.
    static func fileSystemName(_ type: Int) -> String {
        switch type {
        case 0xEF53: return "ext2/ext3/ext4"
        case 0x5846_5342: return "xfs"
        case 0x9123_683E: return "btrfs"
        case 0x794C_7630: return "overlayfs"
        case 0x6969: return "nfs"
        case 0xF2F5_2010: return "f2fs"
        default: return "type 0x" + String(type, radix: 16)
        }
    }
}
