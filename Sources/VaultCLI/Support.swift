import Glibc
import VaultSystem

/// Human formatting of times and tables.
enum Format {
    /// A Unix time as `2026-11-29 14:05:00 UTC`, or `-` when absent.
    static func time(_ seconds: Int64?) -> String {
        guard let seconds else { return "-" }
        var t = time_t(seconds)
        var parts = tm()
        gmtime_r(&t, &parts)
        var buffer = [CChar](repeating: 0, count: 64)
        let n = strftime(&buffer, buffer.count, "%Y-%m-%d %H:%M:%S UTC", &parts)
        return String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// `text` padded with spaces to `width` characters.
    static func pad(_ text: String, _ width: Int) -> String {
        text.count >= width ? text + " " : text + String(repeating: " ", count: width - text.count)
    }

    /// Rows as aligned columns.
    static func table(_ rows: [[String]]) -> [String] {
        guard let columns = rows.first?.count else { return [] }
        let widths = (0..<columns).map { c in rows.map { $0[c].count }.max() ?? 0 }
        return rows.map { row in
            row.enumerated().map { c, cell in c == columns - 1 ? cell : pad(cell, widths[c] + 2) }.joined()
        }
    }
}

/// Turns terminal echo off while a secret is typed.
enum Terminal {
    static func withoutEcho<T>(_ body: () throws(SystemError) -> T) throws(SystemError) -> T {
        var saved = termios()
        guard tcgetattr(0, &saved) == 0 else { return try body() }
        var quiet = saved
        quiet.c_lflag &= ~tcflag_t(ECHO)
        tcsetattr(0, TCSANOW, &quiet)
        defer { tcsetattr(0, TCSANOW, &saved) }
        return try body()
    }
}
