import Foundation
import Testing
import VaultCore

/// The repository's root, found from this file's path: Tests/VaultProtocolTests/<file>.
private let root = URL(fileURLWithPath: #filePath)
    .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

/// The table of vaultd's error codes, as README.md and vaultd(8) show it:
/// rendered from `VaultError.Code`, the one place the codes are declared
/// (the interface definition's errors come from it too).
enum ErrorTable {
    static let begin = "error codes: generated from VaultError.Code by ErrorTableTests"
    static let end = "end of the error codes"

    /// A declaration's doc on one line.
    static func text(_ code: VaultError.Code) -> String {
        code.declaration.doc.split(separator: "\n").joined(separator: " ")
    }

    /// The Markdown table, between HTML comments.
    static var markdown: String {
        var lines = ["<!-- \(begin) -->", "| Code | Varlink error | Meaning |", "| --- | --- | --- |"]
        for code in VaultError.Code.allCases {
            lines.append("| `\(code.seedCode)` | `\(code.varlinkErrorName)` | \(text(code)) |")
        }
        lines.append("<!-- \(end) -->")
        return lines.joined(separator: "\n")
    }

    /// The scdoc list, between scdoc comments.
    static var scdoc: String {
        var lines = ["; \(begin)"]
        for code in VaultError.Code.allCases {
            lines += ["*\(code.seedCode)* (\(code.varlinkErrorName))", "\t\(text(code))", ""]
        }
        lines.append("; \(end)")
        return lines.joined(separator: "\n")
    }

    /// `file`'s text with its table replaced by `table`.
    static func replacing(in file: String, with table: String, comment: String) -> String? {
        guard let start = file.range(of: "\(comment)\(begin)"),
            let stop = file.range(of: "\(comment)\(end)", range: start.upperBound..<file.endIndex)
        else { return nil }
        var lineEnd = stop.upperBound
        while lineEnd < file.endIndex, file[lineEnd] != "\n" { lineEnd = file.index(after: lineEnd) }
        return file.replacingCharacters(in: start.lowerBound..<lineEnd, with: table)
    }
}

@Suite("The table of error codes", .timeLimit(.minutes(5)))
struct ErrorTableTests {
    /// Run with `VAULTD_REGENERATE_DOCS=1` to write the tables instead.
    @Test(
        "Should list every error code once, in README.md and vaultd(8), as VaultError.Code declares it",
        arguments: [("README.md", "<!-- "), ("man/vaultd.8.scd", "; ")])
    func tableMatches(path: String, comment: String) throws {
        let url = root.appendingPathComponent(path)
        let file = try String(contentsOf: url, encoding: .utf8)
        let table = comment == "; " ? ErrorTable.scdoc : ErrorTable.markdown
        let updated = try #require(
            ErrorTable.replacing(in: file, with: table, comment: comment), "\(path) has no table of error codes")
        if ProcessInfo.processInfo.environment["VAULTD_REGENERATE_DOCS"] == "1" {
            try updated.write(to: url, atomically: true, encoding: .utf8)
        }
        #expect(
            updated == file,
            "\(path)'s table of error codes differs from VaultError.Code; regenerate it with VAULTD_REGENERATE_DOCS=1 swift test --filter ErrorTableTests"
        )
        for code in VaultError.Code.allCases {
            #expect(file.components(separatedBy: code.seedCode).count >= 2, "\(path) names \(code.seedCode)")
        }
    }
}
