import Glibc
import Varlink
import VaultClient
import VaultCore

/// What `vaultctl watch` and `vaultctl exec` say on stderr as they lose
/// vaultd and find it again; both reconnect on `ReconnectPolicy.standard`.
enum Reconnecting {
    /// The line printed when the connection is lost: why, with vaultd's code
    /// when it gave one.
    static func lostLine(_ why: String) -> String { "vaultctl: lost the connection to vaultd: \(why); reconnecting" }

    /// The line printed once connected (and subscribed) again.
    static let backLine = "vaultctl: connected to vaultd again"
}

/// The sessions `vaultctl watch` has shown, so that after a reconnection it
/// can say how each is now and which are gone: events that happened while
/// vaultd was away are not replayed.
struct WatchCatchUp {
    /// The accounts of the last snapshot and of the events since.
    private var known: Set<Account>

    init(_ snapshot: [Session]) { known = Set(snapshot.map(\.account)) }

    /// An event about `account` was shown.
    mutating func saw(_ account: Account) { known.insert(account) }

    /// The lines that catch a reader up after a reconnection, from the new
    /// snapshot: a header, one `session` line per session with its state, one
    /// `gone` line per account shown before that is no longer there. With
    /// `json`, one object: `{"reconnected":{"sessions":[...],"gone":[...]}}`.
    mutating func catchUp(_ sessions: [Session], json: Bool, now: Int64 = Int64(time(nil))) -> [String] {
        let present = Set(sessions.map(\.account))
        let gone = known.subtracting(present).sorted()
        known = present
        if json {
            let goneJSON = gone.map { JSON.object(["provider": .string($0.provider), "user": .string($0.user)]) }
            return [
                JSON.object([
                    "reconnected": .object(["sessions": .array(sessions.map(\.json)), "gone": .array(goneJSON)])
                ]).text
            ]
        }
        let count = sessions.count
        var lines = ["caught up: \(count) session\(count == 1 ? "" : "s") now; events follow"]
        for session in sessions {
            var line = Self.prefix(now, "session", session.account) + "  state=\(session.state.rawValue)"
            if let expires = session.expiresAt { line += "  expires=\(Format.time(expires.seconds))" }
            if let connection = session.connection { line += "  connection=\(connection)" }
            if let code = session.lastErrorCode { line += "  code=\(code)" }
            lines.append(line)
        }
        for account in gone { lines.append(Self.prefix(now, "gone", account)) }
        return lines
    }

    /// Time, the word in the kind column, and the account, as `watch` prints an event.
    private static func prefix(_ now: Int64, _ word: String, _ account: Account) -> String {
        "\(Format.time(now))  " + Format.pad(word, VaultCtl.kindColumn) + "\(account.user) @ \(account.provider)"
    }
}
