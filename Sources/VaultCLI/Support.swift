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

/// The help texts of vaultctl and its commands.
enum Help {
    static let tool = """
        Usage: vaultctl [--json] [--socket PATH] [--owner USER] COMMAND [ARGS]

        The command-line client of vaultd, which keeps chat and messaging
        sessions in the Linux secret store.

        Commands:
          login PROVIDER USER [--token-file F]   log in; the token comes on stdin or from F
                              [--from-provider]  (or the provider obtains it)
          logout PROVIDER USER                   log out and delete the stored session
          status [PROVIDER USER]                 one session in detail, or all of them
          list                                   every session you may see
          token PROVIDER USER                    print the access token (for $(vaultctl token ...))
          refresh PROVIDER USER                  refresh the tokens now (oauth2 providers)
          provider-secret PROVIDER               store an oauth2 client secret, read from stdin
          watch [PROVIDER USER] [--kind K]...    print session events as they happen
          kick PROVIDER USER [--reason R]        force a logout (the chat server kicked the client)
          help [COMMAND]                         show help

        Options:
          --json          print stable JSON instead of tables
          --socket PATH   vaultd's socket (default: $VAULTD_SOCKET, else
                          $XDG_RUNTIME_DIR/vaultd/socket, else /run/vaultd/socket for root)
          --owner USER    address USER's (a name or uid) session instead of your own:
                          for root and the admin group
          --help          show help (also after a command)
          --version       show the version

        Exit status: 0 ok, 1 vaultd answered with an error (code and message on
        stderr), 2 bad usage, 3 vaultd is not reachable.
        """

    static let commands: [String: String] = [
        "login": """
        Usage: vaultctl login PROVIDER USER [--token-file FILE] [--expires-at UNIX_SECONDS]
               vaultctl login PROVIDER USER --from-provider

        Logs USER in at PROVIDER (a [Provider] section of vaultd.conf). The
        credential is read from stdin, or from FILE: either a bare token
        (CometChat authToken, OpenIM token) or an OAuth 2.0 token response as
        JSON (access_token, refresh_token, expires_in, instance_url, ...), so
        `curl ... | vaultctl login PROVIDER USER` works. Never pass a token as an
        argument. An account that is already logged in keeps its session.
        With --from-provider nothing is read: the provider obtains the tokens
        itself (oauth2: client credentials; exec: its helper's login).
        """,
        "logout": """
        Usage: vaultctl logout PROVIDER USER

        Logs USER out at PROVIDER and deletes the stored session. Fails with
        ERR_NOT_LOGGED_IN when the account is not logged in.
        """,
        "status": """
        Usage: vaultctl status [PROVIDER USER]

        Shows one session in detail (the token masked), or lists every session.
        """,
        "list": """
        Usage: vaultctl list

        Lists every session you may see: provider, user, state, expiry, owner.
        """,
        "token": """
        Usage: vaultctl token PROVIDER USER [--min-valid SECONDS]

        Prints the access token and nothing else, for $(vaultctl token P U).
        With --min-valid, fails unless the token stays valid that long.
        """,
        "watch": """
        Usage: vaultctl watch [PROVIDER USER] [--kind KIND]...

        Prints events as they happen, one line each, until interrupted: login,
        logout, kicks and (with refreshing providers) token changes, for the
        sessions you may see. --json prints one JSON object per line: first
        {"sessions":[...]}, then one {"event":{...}} per event. Kinds:
        loginSuccess, loginFailed, logoutSuccess, logoutFailed, tokenRefreshed,
        tokenExpired, tokenInvalid, kickedOffline, connectionChanged.
        """,
        "refresh": """
        Usage: vaultctl refresh PROVIDER USER

        Refreshes the account's tokens now at its provider's token endpoint,
        joining a refresh already under way, and shows the session afterwards.
        vaultd refreshes by itself ahead of expiry; this is for when you know
        the token went bad early.
        """,
        "provider-secret": """
        Usage: vaultctl provider-secret PROVIDER

        Reads an OAuth 2.0 client secret from stdin (without echo on a
        terminal) and stores it in the secret store for the oauth2 provider
        PROVIDER; vaultd uses it from then on. A client secret never goes into
        vaultd.conf or onto a command line.
        """,
        "kick": """
        Usage: vaultctl kick PROVIDER USER [--reason REASON]

        Logs the account out at once, as when its chat server kicked the client
        offline; subscribers get kickedOffline with REASON (default: kicked).
        The owner, root and members of the configured AdminGroup may do this.
        """,
        "help": """
        Usage: vaultctl help [COMMAND]
        """,
    ]
}
