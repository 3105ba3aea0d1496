import Glibc
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// Finds a user's uid by name without glibc's NSS, so that it works in the
/// statically linked vaultctl: a static glibc cannot load NSS modules
/// (`libnss_systemd` and friends) except from the very glibc build it was
/// linked with, which the installed system need not have.
///
/// Looks where `passwd: files systemd` (Debian's `nsswitch.conf`) looks:
/// `/etc/passwd` first, then systemd's user database over Varlink, the
/// service nss-systemd itself asks. There live the `DynamicUser=` users, such
/// as `vaultd` while the system instance runs (PID 1 answers as
/// `io.systemd.DynamicUser`), and, where systemd-userdbd runs, every user NSS
/// knows (its `io.systemd.Multiplexer` asks NSS too: LDAP, SSSD).
public enum UserLookup {
    /// The password file, read first.
    public static let passwdPath = "/etc/passwd"
    /// The directory of systemd's user-record services (one socket each).
    public static let userDatabaseDirectory = "/run/systemd/userdb"
    /// The service of systemd-userdbd that asks all the others.
    static let multiplexer = "io.systemd.Multiplexer"

    /// The uid of the user called `name`, or nil when neither the password
    /// file nor the user database knows it. Each user-database service gets
    /// at most `timeoutSeconds` to answer.
    public static func uid(
        named name: String, passwd: String = passwdPath, userDatabase: String = userDatabaseDirectory,
        timeoutSeconds: Int = 5
    ) -> uid_t? {
        guard !name.isEmpty, !name.contains(":"), !name.contains("\n") else { return nil }
        if let bytes = try? Files.read(passwd, limit: 64 << 20),
            let uid = uid(named: name, inPasswd: String(decoding: bytes, as: UTF8.self))
        {
            return uid
        }
        return uidFromUserDatabase(named: name, directory: userDatabase, timeoutSeconds: timeoutSeconds)
    }

    /// The name of the user with `uid`, or nil when neither the password file
    /// nor the user database knows one; looked up as `uid(named:)` is.
    public static func name(
        uid: uid_t, passwd: String = passwdPath, userDatabase: String = userDatabaseDirectory,
        timeoutSeconds: Int = 5
    ) -> String? {
        if let bytes = try? Files.read(passwd, limit: 64 << 20),
            let name = name(uid: uid, inPasswd: String(decoding: bytes, as: UTF8.self))
        {
            return name
        }
        return askUserDatabase(
            ["uid": .int(Int64(uid))], directory: userDatabase, timeoutSeconds: timeoutSeconds
        )?.userName
    }

    /// The name on the first line of a password file's text whose uid is `uid`.
    static func name(uid: uid_t, inPasswd text: String) -> String? {
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 3, omittingEmptySubsequences: false)
            if fields.count >= 3, !fields[0].isEmpty, UInt32(fields[2]) == uid { return String(fields[0]) }
        }
        return nil
    }

    /// The uid on the line of `name` in a password file's text
    /// (`name:password:uid:gid:gecos:home:shell`).
    static func uid(named name: String, inPasswd text: String) -> uid_t? {
        for line in text.split(separator: "\n") {
            let fields = line.split(separator: ":", maxSplits: 3, omittingEmptySubsequences: false)
            if fields.count >= 3, fields[0] == name, let uid = UInt32(fields[2]) { return uid }
        }
        return nil
    }

    /// Asks systemd's user-record services in `directory` for `name`'s uid.
    static func uidFromUserDatabase(named name: String, directory: String, timeoutSeconds: Int) -> uid_t? {
        askUserDatabase(["userName": .string(name)], directory: directory, timeoutSeconds: timeoutSeconds)?.uid
    }

    /// Asks systemd's user-record services in `directory` for the record that
    /// `query` names (`userName` or `uid`): the multiplexer alone when it runs,
    /// else each service in turn (at most 16), as nss-systemd does. Only
    /// services served by root are asked.
    static func askUserDatabase(_ query: [String: JSON], directory: String, timeoutSeconds: Int)
        -> (userName: String, uid: uid_t)?
    {
        let services: [String]
        if Files.exists(directory + "/" + multiplexer) {
            services = [multiplexer]
        } else {
            services = Array(((try? Files.list(directory)) ?? []).prefix(16))
        }
        for service in services {
            if let record = askUserDatabase(
                service: service, path: directory + "/" + service, query: query, timeoutSeconds: timeoutSeconds)
            {
                return record
            }
        }
        return nil
    }

    /// One `io.systemd.UserDatabase.GetUserRecord` call; nil on any error
    /// (`NoRecordFound`, a service that is not running, a record without a
    /// uid, or one that does not match the query).
    private static func askUserDatabase(service: String, path: String, query: [String: JSON], timeoutSeconds: Int)
        -> (userName: String, uid: uid_t)?
    {
        // Trusted: root (PID 1, systemd-userdbd, systemd-homed) or this user.
        guard
            let client = try? VarlinkClient(
                path: path, timeoutSeconds: timeoutSeconds, connectTimeoutSeconds: timeoutSeconds,
                serviceUID: { nil }),
            let reply = try? client.call(
                "io.systemd.UserDatabase.GetUserRecord", query.merging(["service": .string(service)]) { $1 }),
            reply.error == nil,
            let record = reply.parameters["record"], let userName = record["userName"]?.stringValue,
            let uid = record["uid"]?.integerValue, uid >= 0, uid < Int64(UInt32.max)
        else { return nil }
        for (key, value) in query where record[key] != value { return nil }
        return (userName, uid_t(uid))
    }
}
