import CSystemd
import Dispatch
import Glibc
import Synchronization
import Varlink
import VarlinkServer
import VaultCore
import VaultSystem

/// Structured logging: to journald (fields `VAULTD_PROVIDER=`, `VAULTD_USER=`,
/// `VAULTD_EVENT=`, `CODE=`, ...) when systemd connected stderr to the journal,
/// else one line per event on stderr: `vaultd: LEVEL: message key=value ...`.
/// Callers pass only names, codes and ids: a secret has no way in, and a
/// `Secret` that slipped into a message would print masked.
public final class Logger: Sendable {
    /// How much is written, most severe first.
    public enum Level: Int, Sendable, Comparable, CaseIterable {
        case error = 3
        case warning = 4
        case notice = 5
        case info = 6
        case debug = 7

        public static func < (lhs: Level, rhs: Level) -> Bool { lhs.rawValue < rhs.rawValue }

        /// The level's name on the command line and in output.
        public var name: String {
            switch self {
            case .error: return "error"
            case .warning: return "warning"
            case .notice: return "notice"
            case .info: return "info"
            case .debug: return "debug"
            }
        }
    }

    /// Where lines go.
    public enum Target: Sendable {
        case stderr
        case journal
        /// Nowhere: for tests that run the session manager in-process.
        case discard
    }

    /// The least severe level written.
    public let level: Level
    /// Where lines go.
    public let target: Target

    /// A logger that writes `level` and more severe to `target`.
    public init(level: Level, target: Target = .stderr) {
        self.level = level
        self.target = target
    }

    /// True when lines of `severity` are written anywhere.
    public func writes(_ severity: Level) -> Bool { severity <= level && target != .discard }

    /// Repeated token handouts, counted for the audit trail (see `Audit`);
    /// counted by the serving loop at every handout.
    private let counts = Mutex(CountState())
    private struct CountState {
        var counts = HandoutCounts()
        var tickScheduled = false
    }
    /// Where the counts are written at each interval's end.
    private let ticks = DispatchQueue(label: "vaultd.audit-ticks")

    /// The audit trail's counts of repeated handouts.
    var handouts: Handouts { Handouts(log: self) }

    /// Counts token handouts for `Audit`, and writes the counts at the end of
    /// each interval and at `flush()`.
    struct Handouts {
        let log: Logger

        /// Counts a handout of `key` to `caller`; true when its line is to be written now.
        func record(_ action: String, _ key: SessionKey, caller: Caller, result: String) -> Bool {
            let (write, schedule) = log.counts.withLock { state -> (Bool, UInt64?) in
                let write = state.counts.record(
                    action, key, caller: caller, result: result, now: Monotonic.milliseconds())
                return (write, write ? Self.tickToSchedule(&state) : nil)
            }
            if let schedule { log.scheduleTick(at: schedule) }
            return write
        }

        private static func tickToSchedule(_ state: inout CountState) -> UInt64? {
            guard !state.tickScheduled, let next = state.counts.nextTick else { return nil }
            state.tickScheduled = true
            return next
        }
    }

    private func scheduleTick(at deadline: UInt64) {
        let now = Monotonic.milliseconds()
        let delay = deadline > now ? deadline - now : 0
        ticks.asyncAfter(deadline: .now() + .milliseconds(Int(delay))) { self.tick() }
    }

    /// Writes the repeats counted in the interval that ended, and schedules
    /// the next tick while any kind is tracked.
    private func tick() {
        let (due, next) = counts.withLock { state -> ([(kind: HandoutCounts.Kind, count: Int)], UInt64?) in
            let due = state.counts.tick(now: Monotonic.milliseconds())
            state.tickScheduled = state.counts.nextTick != nil
            return (due, state.counts.nextTick)
        }
        for (kind, count) in due { Audit.write(self, kind, count: count) }
        if let next { scheduleTick(at: next) }
    }

    /// The journal when systemd connected stderr to it (`JOURNAL_STREAM`) and
    /// journald listens; stderr otherwise. (sd_journal_sendv reports success even
    /// when nothing listens, so the socket is checked first.)
    public static func automaticTarget() -> Target {
        if Environment.get("JOURNAL_STREAM") != nil, Files.exists("/run/systemd/journal/socket") { return .journal }
        return .stderr
    }

    /// Writes one line when `severity` is at or above the logger's level.
    public func log(_ severity: Level, _ message: String, _ fields: [String: String] = [:]) {
        guard severity <= level, target != .discard else { return }
        log(severity, message, sortedFields: fields.sorted(by: { $0.key < $1.key }))
    }

    /// Writes one line whose fields are already in the order to write them
    /// (sorted by key, as `log(_:_:_:)` writes them), when `severity` is at
    /// or above the logger's level.
    public func log(_ severity: Level, _ message: String, sortedFields fields: [(key: String, value: String)]) {
        guard severity <= level, target != .discard else { return }
        if target == .journal {
            let size = message.utf8.count + fields.reduce(64) { $0 + $1.key.utf8.count + $1.value.utf8.count }
            enqueue(size: size) { self.sendToJournal(severity, message, fields) }
            return
        }
        var line: [UInt8] = []
        line.reserveCapacity(192)
        line.append(contentsOf: "vaultd: ".utf8)
        line.append(contentsOf: severity.name.utf8)
        line.append(contentsOf: ": ".utf8)
        line.append(contentsOf: message.utf8)
        for (key, value) in fields {
            line.append(UInt8(ascii: " "))
            line.append(contentsOf: key.utf8)
            line.append(UInt8(ascii: "="))
            Logger.appendQuoted(value, to: &line)
        }
        line.append(UInt8(ascii: "\n"))
        enqueue(size: line.count) { [line] in Logger.writeAll(line) }
    }

    /// Lines go out on this queue, in the order they were handed over, so that
    /// a slow reader of stderr or of the journal blocks it and not the thread
    /// that logged (the serving loop above all).
    private let writer = DispatchQueue(label: "vaultd.log-writer")
    /// Bytes handed to the writer and not written yet.
    private let queuedBytes = Atomic<Int>(0)
    /// Queued bytes past which the caller waits for the writer, so that memory
    /// stays bounded when stderr or the journal is stuck.
    static let queueLimit = 16 << 20

    private func enqueue(size: Int, _ write: @escaping @Sendable () -> Void) {
        let queued = queuedBytes.wrappingAdd(size, ordering: .relaxed).newValue
        writer.async {
            write()
            self.queuedBytes.wrappingSubtract(size, ordering: .relaxed)
        }
        if queued > Logger.queueLimit { writer.sync {} }
    }

    /// Returns once every line handed over so far, and every handout counted
    /// and not yet written, is written: at exit.
    public func flush() {
        let due = counts.withLock { $0.counts.drain() }
        for (kind, count) in due { Audit.write(self, kind, count: count) }
        writer.sync {}
    }

    /// Writes `bytes` whole to stderr.
    private static func writeAll(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { raw in
            var offset = 0
            while offset < raw.count {
                let n = write(2, raw.baseAddress! + offset, raw.count - offset)
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { return }
                offset += n
            }
        }
    }

    public func error(_ message: String, _ fields: [String: String] = [:]) { log(.error, message, fields) }
    public func warning(_ message: String, _ fields: [String: String] = [:]) { log(.warning, message, fields) }
    public func notice(_ message: String, _ fields: [String: String] = [:]) { log(.notice, message, fields) }
    public func info(_ message: String, _ fields: [String: String] = [:]) { log(.info, message, fields) }
    public func debug(_ message: String, _ fields: [String: String] = [:]) { log(.debug, message, fields) }

    /// The journal field names of vaultd's common log fields.
    static let journalFieldNames = [
        "provider": "VAULTD_PROVIDER", "user": "VAULTD_USER", "event": "VAULTD_EVENT", "code": "CODE",
    ]

    private func sendToJournal(_ severity: Level, _ message: String, _ fields: [(key: String, value: String)]) {
        var entries = [
            "MESSAGE=\(message)", "PRIORITY=\(severity.rawValue)", "SYSLOG_IDENTIFIER=vaultd",
        ]
        for (key, value) in fields {
            let name =
                Logger.journalFieldNames[key] ?? "VAULTD_" + key.uppercased().filter { $0.isLetter || $0.isNumber }
            entries.append("\(name)=\(value)")
        }
        let buffers = entries.map { entry -> UnsafeMutableRawBufferPointer in
            let bytes = Array(entry.utf8)
            let buffer = UnsafeMutableRawBufferPointer.allocate(byteCount: bytes.count, alignment: 1)
            buffer.copyBytes(from: bytes)
            return buffer
        }
        defer { buffers.forEach { $0.deallocate() } }
        var vectors = buffers.map { iovec(iov_base: $0.baseAddress, iov_len: $0.count) }
        _ = sd_journal_sendv(&vectors, Int32(vectors.count))
    }

    /// Appends `value` as a field value: as it is when plain printable ASCII
    /// without quotes or backslashes, else quoted with those escaped and other
    /// control characters shown as `?`.
    static func appendQuoted(_ value: String, to line: inout [UInt8]) {
        let plain = !value.isEmpty && value.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F && $0 != 0x22 && $0 != 0x5C }
        if plain {
            line.append(contentsOf: value.utf8)
            return
        }
        line.append(0x22)
        for byte in value.utf8 {
            switch byte {
            case 0x22: line.append(contentsOf: [0x5C, 0x22])
            case 0x5C: line.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: line.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0..<0x20, 0x7F: line.append(UInt8(ascii: "?"))
            default: line.append(byte)
            }
        }
        line.append(0x22)
    }
}

/// The serving loop logs through vaultd's logger.
extension Logger: ServerLog {}
