import Glibc
import VaultClient
import VaultCore

/// `vaultctl connection-state`: a client that is a shell script reports its
/// own connection to the chat server, as a program would with
/// `SetConnectionState`.
extension VaultCtl {
    /// How often a report read from stdin is sent again while no new one
    /// comes: well within vaultd's idle timeout (5 minutes by default), which
    /// would otherwise close the connection and drop the client from the list.
    static let reportKeepAliveMilliseconds: Int32 = 60_000

    /// Reports STATE once, or (STATE `-`) every state read from stdin, one per
    /// line, over one connection that stays open, and so listed, until stdin ends.
    mutating func connectionState(_ command: ParsedCommand) -> ExitCode {
        let (provider, user, word) = (command.arguments[0], command.arguments[1], command.arguments[2])
        let client = command.value("--client")
        if word != "-" {
            guard let state = ClientConnectionState(rawValue: word) else { return badState(word) }
            return run { vault throws(VaultClientError) in
                try vault.setConnectionState(
                    provider: provider, user: user, state: state, client: client, ownerUID: owner)
                return (.object([:]), "reported \(state.rawValue): \(user) @ \(provider)")
            }
        }
        let vault: VaultConnection
        do { vault = try connect() } catch { return report(error) }
        var lines = LineReader(fd: 0)
        var last: ClientConnectionState?
        // Bounded by stdin: the loop ends at its end (or at an error from vaultd).
        while true {
            let line: String?
            switch lines.next(timeoutMilliseconds: VaultCtl.reportKeepAliveMilliseconds) {
            case .line(let text): line = text
            case .timedOut: line = nil
            case .end: return .ok
            }
            var state = last
            if let line {
                let word = line.trimmedLine
                if word.isEmpty { continue }
                guard let parsed = ClientConnectionState(rawValue: word) else {
                    _ = badState(word)
                    continue
                }
                state = parsed
            }
            guard let state else { continue }
            do throws(VaultClientError) {
                try vault.setConnectionState(
                    provider: provider, user: user, state: state, client: client, ownerUID: owner)
            } catch {
                return report(error)
            }
            last = state
        }
    }

    private func badState(_ word: String) -> ExitCode {
        let known = ClientConnectionState.allCases.map(\.rawValue).joined(separator: ", ")
        return usage(
            "connection-state: '\(word)' is not a state (\(known), or - to read them from stdin)",
            command: "connection-state")
    }
}

/// Reads lines from a descriptor, waiting at most a given time for each.
struct LineReader {
    /// What `next` found.
    enum Next {
        case line(String)
        case timedOut
        case end
    }

    let fd: Int32
    private var buffered: [UInt8] = []
    private var ended = false

    init(fd: Int32) { self.fd = fd }

    /// The next line (without its newline), `timedOut` when none came within
    /// `timeoutMilliseconds`, `end` at the end of input (a last line without
    /// a newline is still returned first).
    mutating func next(timeoutMilliseconds: Int32) -> Next {
        // Bounded: each pass reads more input, or returns.
        for _ in 0..<1_000_000 {
            if let newline = buffered.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffered[..<newline], as: UTF8.self)
                buffered.removeSubrange(...newline)
                return .line(line)
            }
            if ended {
                guard !buffered.isEmpty else { return .end }
                let line = String(decoding: buffered, as: UTF8.self)
                buffered.removeAll()
                return .line(line)
            }
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            let ready = poll(&descriptor, 1, timeoutMilliseconds)
            if ready < 0 {
                if errno == EINTR { continue }
                ended = true
                continue
            }
            if ready == 0 { return .timedOut }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let n = read(fd, &chunk, chunk.count)
            if n < 0 && errno == EINTR { continue }
            if n <= 0 {
                ended = true
                continue
            }
            // A line longer than this is no state: drop what came so far.
            if buffered.count > 65536 { buffered.removeAll() }
            buffered.append(contentsOf: chunk[0..<n])
        }
        return .end
    }
}

extension String {
    /// The text without leading and trailing spaces, tabs and carriage returns.
    fileprivate var trimmedLine: String {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" || $0 == "\r" }
        guard let first = firstIndex(where: { !isSpace($0) }), let last = lastIndex(where: { !isSpace($0) }) else {
            return ""
        }
        return String(self[first...last])
    }
}
