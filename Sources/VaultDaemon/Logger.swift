import CSystemd
import Glibc
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

    /// The journal when systemd connected stderr to it (`JOURNAL_STREAM`) and
    /// journald listens; stderr otherwise. (sd_journal_sendv reports success even
    /// when nothing listens, so the socket is checked first.)
    public static func automaticTarget() -> Target {
        if Environment.get("JOURNAL_STREAM") != nil, Files.exists("/run/systemd/journal/socket") { return .journal }
        return .stderr
    }

    /// Writes one line when `severity` is at or above the logger's level.
    public func log(_ severity: Level, _ message: String, _ fields: [String: String] = [:]) {
        guard severity <= level else { return }
        if target == .journal {
            sendToJournal(severity, message, fields)
            return
        }
        var line = "vaultd: \(severity.name): \(message)"
        for key in fields.keys.sorted() {
            line += " \(key)=\(Logger.quoted(fields[key]!))"
        }
        line += "\n"
        var bytes = Array(line.utf8)
        _ = bytes.withUnsafeMutableBytes { write(2, $0.baseAddress, $0.count) }
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

    private func sendToJournal(_ severity: Level, _ message: String, _ fields: [String: String]) {
        var entries = [
            "MESSAGE=\(message)", "PRIORITY=\(severity.rawValue)", "SYSLOG_IDENTIFIER=vaultd",
        ]
        for key in fields.keys.sorted() {
            let name =
                Logger.journalFieldNames[key] ?? "VAULTD_" + key.uppercased().filter { $0.isLetter || $0.isNumber }
            entries.append("\(name)=\(fields[key]!)")
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

    static func quoted(_ value: String) -> String {
        let plain =
            !value.isEmpty
            && value.unicodeScalars.allSatisfy { $0.value > 0x20 && $0.value < 0x7F && $0 != "\"" && $0 != "\\" }
        if plain { return value }
        var out = "\""
        for scalar in value.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            default: out += scalar.value < 0x20 ? "?" : String(scalar)
            }
        }
        return out + "\""
    }
}
