import Glibc

/// One line per event on stderr: `LEVEL message key=value ...`. Callers pass
/// only names, codes and ids: a secret has no way in, and a `Secret` that
/// slipped into a message would print masked. (Journald output comes with the
/// systemd integration.)
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

    /// The least severe level written.
    public let level: Level

    /// A logger that writes `level` and more severe.
    public init(level: Level) { self.level = level }

    /// Writes one line when `severity` is at or above the logger's level.
    public func log(_ severity: Level, _ message: String, _ fields: [String: String] = [:]) {
        guard severity <= level else { return }
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
