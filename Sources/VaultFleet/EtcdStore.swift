import Glibc
import Synchronization
import Varlink
import VaultCore
import VaultDaemon
import VaultSystem

/// Session records in etcd (`[Vault] Store=etcd`), shared by the vaultd hosts
/// of a fleet: every value sealed exactly as the SQLite engine seals its rows
/// (`Sealing`, XChaCha20-Poly1305, bound to its account), under the one data
/// key every host is given as the credential `data-key`, with the key's id
/// beside it. etcd never holds a token, a refresh token or a client secret
/// in clear.
///
/// The keys, under `KeyPrefix=` (`/vaultd/`), each segment with `%` and `/`
/// percent-encoded:
///
///     PREFIX/meta/key-id                              the id of the fleet's data key
///     PREFIX/sessions/PROVIDER/USER/OWNER             a session record
///     PREFIX/endings/PROVIDER/USER/OWNER              why it ended (a tombstone, not sealed)
///     PREFIX/locks/PROVIDER/USER/OWNER                its refresh lock (a key under a lease)
///     PREFIX/revocations/PROVIDER/USER/ID             a queued revocation
///     PREFIX/provider-secrets/PROVIDER                a provider's client secret
///
/// Uids differ between hosts, so a session's owner is named by user name in
/// its key and in its associated data; the record keeps the uid of the host
/// that wrote it, and each host reads the name back as its own uid. A name
/// this host does not know is skipped with a warning and left in etcd.
///
/// The fleet's side (`SharedSessionStore`: revisions, conditional writes,
/// tombstones, refresh locks, the change feed) is in `EtcdStore+Fleet.swift`.
public final class EtcdStore: SessionStore, @unchecked Sendable {
    /// The client of the fleet's etcd members.
    let client: EtcdClient
    /// What every key starts with (`KeyPrefix=`).
    public let prefix: String
    /// The fleet's data key: set at open, never changed.
    private let key: DataKey
    private let keySource: String
    let names: OwnerNames
    let log: Logger
    /// The refresh locks, under `PREFIX/locks/`.
    let locks: EtcdLocks
    /// How long a lock outlives a holder that died, in seconds (`LockTTL=`).
    let lockTTL: Int64
    /// The longest this host keeps renewing a refresh lock it holds: a
    /// refresh's store reads and writes and its provider call (whose own
    /// timeout bounds it). A lock not released by then (refreshed tokens the
    /// store did not take) lapses `lockTTL` later.
    let refreshHoldSeconds: Double
    /// The clock of the locks' ends, the session manager's.
    let clock: any WallClock
    /// How many keys one read of every session asks for at a time.
    let pageSize: Int64
    /// What the fleet's calls share: the feed, its watch, the locks held.
    let fleet = Mutex(FleetFeedState())

    /// The endpoints, the prefix and the key; every call tried each endpoint
    /// within `Timeout=` already, so no second try on a fresh connection.
    public var profile: StoreProfile {
        StoreProfile(
            location:
                "etcd \(client.endpoints.joined(separator: ",")) prefix \(prefix), key \(key.id) from the \(keySource)",
            remedy:
                "check that a quorum of the etcd members at \(client.endpoints.joined(separator: " ")) runs and that this host reaches them (etcdctl endpoint health), then try again",
            retriesOnFreshConnection: false)
    }

    private init(
        client: EtcdClient, settings: EtcdSettings, key: DataKey, keySource: String, names: OwnerNames, log: Logger,
        host: String, refreshHoldSeconds: Double, clock: any WallClock, pageSize: Int64
    ) {
        self.pageSize = pageSize
        self.client = client
        self.prefix = settings.keyPrefix
        self.key = key
        self.keySource = keySource
        self.names = names
        self.log = log
        self.lockTTL = settings.lockTTLSeconds
        self.refreshHoldSeconds = refreshHoldSeconds
        self.clock = clock
        // A held lock's renewals must end well within its TTL: one that waits
        // a whole Timeout= could outlive the lease. Its other calls take Timeout=.
        let renewalTimeout = min(Double(settings.timeoutSeconds), max(1, Double(settings.lockTTLSeconds) / 3))
        locks = EtcdLocks(
            client: client, prefix: Array((settings.keyPrefix + "locks/").utf8), holder: host,
            defaultTTL: settings.lockTTLSeconds,
            renewalClient: EtcdClient(endpoints: client.endpoints, timeoutSeconds: renewalTimeout, tls: client.tls))
    }

    /// `open` as the daemon calls it (`Daemon.main`'s `openShared`).
    public static let opener: SharedStoreOpener = { settings, keys, log, refreshHoldSeconds in
        try await open(settings: settings, keys: keys, log: log, refreshHoldSeconds: refreshHoldSeconds)
    }

    /// Opens the store of `settings` with the fleet's key from `keys` (the
    /// credential `data-key`; nil when systemd passed none, which refuses).
    /// `host` names this vaultd to the others (in the locks it holds);
    /// `refreshHoldSeconds` bounds how long it renews a refresh lock.
    /// The first host records the key's id under `PREFIX/meta/key-id`; every
    /// later one must hold the same key, or it refuses to start: it could
    /// read none of the fleet's sessions, and its own would be unreadable to
    /// the others.
    public static func open(
        settings: EtcdSettings, keys: CredentialDataKeys?, log: Logger, names: OwnerNames = .system,
        host: String = EtcdStore.defaultHostName(), refreshHoldSeconds: Double = 60,
        clock: any WallClock = SystemWallClock(), pageSize: Int64 = 1000
    ) async throws(VaultError) -> EtcdStore {
        guard let keys else {
            throw VaultError(
                .storeFailed,
                "Store=etcd takes the fleet's data key from the systemd credential \(CredentialDataKeys.name) ($CREDENTIALS_DIRECTORY/\(CredentialDataKeys.name)), which is not there; give every host of the fleet the same 32-byte key with LoadCredentialEncrypted=\(CredentialDataKeys.name):PATH"
            )
        }
        let key = try await keys.keyForNewDatabase()
        let client = EtcdClient(
            endpoints: settings.endpoints, timeoutSeconds: Double(settings.timeoutSeconds), tls: TLSFiles(settings))
        let store = EtcdStore(
            client: client, settings: settings, key: key, keySource: keys.description, names: names, log: log,
            host: host, refreshHoldSeconds: refreshHoldSeconds, clock: clock, pageSize: pageSize)
        try await store.checkKeyID()
        return store
    }

    /// Records the key's id when the prefix holds none yet (atomically: of
    /// two first hosts, one records it and the other compares), else checks it.
    private func checkKeyID() async throws(VaultError) {
        let metaKey = bytes("meta/key-id")
        let result = try await client.txn(
            [.createRevision(metaKey, equals: 0)], success: [.put(metaKey, Array(key.id.utf8))],
            failure: [.range(metaKey)])
        if result.succeeded { return }
        let stored = String(decoding: result.ranges.first?.first?.value ?? [], as: UTF8.self)
        guard stored == key.id else {
            throw VaultError(
                .storeFailed,
                "etcd at \(prefix) holds the sessions of a fleet sealed under data key \(stored), and the \(keySource) holds key \(key.id); every host of a fleet needs the same data key: give this host the fleet's key as the credential \(CredentialDataKeys.name), or use another KeyPrefix="
            )
        }
    }

    // MARK: Keys and values

    /// `path` under the prefix, as etcd key bytes.
    func bytes(_ path: String) -> [UInt8] { Array((prefix + path).utf8) }

    /// `segment` with `%` and `/` percent-encoded, so that it is one segment of a key.
    static func encode(_ segment: String) -> String {
        var out = ""
        for char in segment.unicodeScalars {
            switch char {
            case "%": out += "%25"
            case "/": out += "%2F"
            default: out.unicodeScalars.append(char)
            }
        }
        return out
    }

    /// The segment `encode` made, nil when it is not one.
    static func decode(_ segment: Substring) -> String? {
        var out: [UInt8] = []
        var bytes = segment.utf8[...]
        while let byte = bytes.popFirst() {
            guard byte == UInt8(ascii: "%") else {
                out.append(byte)
                continue
            }
            let digits = String(decoding: bytes.prefix(2), as: UTF8.self)
            guard digits.count == 2, let value = UInt8(digits, radix: 16) else { return nil }
            out.append(value)
            bytes = bytes.dropFirst(2)
        }
        return String(validating: out, as: UTF8.self)
    }

    /// The segments of `key` after `PREFIX/kind/`, decoded; nil when there are not `count` of them.
    func segments(of key: [UInt8], under kind: String, count: Int) -> [String]? {
        let start = Array((prefix + kind + "/").utf8)
        guard key.starts(with: start), let rest = String(validating: key[start.count...], as: UTF8.self) else {
            return nil
        }
        let parts = rest.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == count else { return nil }
        var decoded: [String] = []
        for part in parts {
            guard !part.isEmpty, let text = Self.decode(part) else { return nil }
            decoded.append(text)
        }
        return decoded
    }

    func sessionKey(_ account: Account, owner: String) -> [UInt8] { bytes("sessions/" + path(account, owner: owner)) }

    /// `PROVIDER/USER/OWNER`, encoded: where a session's record, ending and lock are under their kinds.
    func path(_ account: Account, owner: String) -> String {
        "\(Self.encode(account.provider))/\(Self.encode(account.user))/\(Self.encode(owner))"
    }

    private func revocationKey(_ revocation: PendingRevocation) -> [UInt8] {
        let account = revocation.record.account
        return bytes(
            "revocations/\(Self.encode(account.provider))/\(Self.encode(account.user))/\(Self.encode(revocation.id))")
    }

    private func providerSecretKey(_ provider: String) -> [UInt8] {
        bytes("provider-secrets/\(Self.encode(provider))")
    }

    /// A stored value: the id of the key and the sealed bytes, in a JSON document.
    private func seal(_ plaintext: [UInt8], associatedData: [UInt8]) -> [UInt8] {
        let sealed = Sealing.seal(plaintext, associatedData: associatedData, key: key)
        return JSON.object(["keyId": .string(key.id), "sealed": .string(Base64.encode(sealed))]).serialized()
    }

    /// The plaintext of a stored value, nil when it is not one, was sealed
    /// under another key or bound to another place, or was changed. The caller wipes it.
    func open(_ value: [UInt8], associatedData: [UInt8]) -> [UInt8]? {
        guard let document = try? JSON.parse(value), let keyID = document["keyId"]?.stringValue,
            let sealed = document["sealed"]?.stringValue.flatMap(Base64.decode)
        else { return nil }
        return sealed.withUnsafeBytes {
            Sealing.open($0, keyID: keyID, associatedData: associatedData, key: key)
        }
    }

    /// The user name of the owner `uid` on this host, or an error: a fleet
    /// names owners by name, and a uid without one cannot be shared.
    func ownerName(_ uid: UInt32) throws(VaultError) -> String {
        guard let name = names.name(uid) else {
            throw VaultError(
                .storeFailed,
                "uid \(uid) has no user name on this host, and a fleet's store names a session's owner by user name (uids differ between hosts); give the user a name in /etc/passwd or the user database"
            )
        }
        return name
    }

    // MARK: Calls

    public func loadAll() async throws(VaultError) -> StoreContents {
        let range = try await client.rangeAll(bytes("sessions/"), pageSize: pageSize)
        var contents = StoreContents(records: [], unreadable: [])
        for item in range.kvs {
            switch decodeSession(item) {
            case .record(let record): contents.records.append(record)
            case .unreadable(let label): contents.unreadable.append(label)
            case .unknownOwner(let account, let owner): warnOfUnknownOwner(account, owner)
            }
        }
        if contents.records.isEmpty, !contents.unreadable.isEmpty {
            throw VaultError(
                .storeFailed,
                "none of the \(contents.unreadable.count) sessions in etcd under \(prefix) could be opened with data key \(key.id) (first: \(contents.unreadable[0])); vaultd will not start over sessions it cannot read"
            )
        }
        // The change feed of a fleet's host starts after what it restored.
        noteLoaded(range.revision)
        return contents
    }

    /// What a key and value under `PREFIX/sessions/` hold.
    enum DecodedSession {
        /// A session this host serves, its owner's uid this host's own.
        case record(SessionRecord)
        /// A session owned by a user this host does not know.
        case unknownOwner(Account, String)
        /// Not a session vaultd wrote, damaged, or sealed under another key: a label for the log.
        case unreadable(String)
    }

    /// The session of a key and value under `PREFIX/sessions/`.
    func decodeSession(_ item: EtcdKeyValue) -> DecodedSession {
        guard let parts = segments(of: item.key, under: "sessions", count: 3),
            let account = try? Account.validate(provider: parts[0], user: parts[1])
        else {
            return .unreadable(
                "a key under \(prefix)sessions/ that is not PROVIDER/USER/OWNER (written by another program)")
        }
        let ownerName = parts[2]
        guard let uid = names.uid(ownerName) else { return .unknownOwner(account, ownerName) }
        guard var plaintext = open(item.value, associatedData: Sealing.sessionData(account, owner: ownerName)) else {
            return .unreadable(
                "session \(account) of \(ownerName) in etcd (damaged, or sealed under another key than \(key.id))")
        }
        defer { plaintext.wipe() }
        guard let json = try? JSON.parse(plaintext), var record = try? SessionRecord(storedJSON: json),
            record.account == account
        else {
            return .unreadable("session \(account) of \(ownerName) in etcd (not a session record)")
        }
        record.ownerUID = uid
        return .record(record)
    }

    func warnOfUnknownOwner(_ account: Account, _ owner: String) {
        log.warning(
            "a session of the fleet is owned by a user this host does not know; it is left in etcd and not served here",
            ["account": account.description, "owner": owner])
    }

    /// The sealed value of `record`, stored under `owner`'s name.
    func sealedValue(_ record: SessionRecord, owner: String) -> [UInt8] {
        var document = record.storedJSON().serialized()
        defer { document.wipe() }
        return seal(document, associatedData: Sealing.sessionData(record.account, owner: owner))
    }

    /// A saved record's session lives again (`save`: its ending goes).
    public func apply(_ change: StoreChange) async throws(VaultError) {
        switch change {
        case .save(let record): _ = try await save(record, ifRevision: nil)
        case .delete(let key): try await client.delete(sessionKey(key.account, owner: try ownerName(key.owner)))
        case .saveProviderSecret(let provider, let secret):
            var plaintext = Array(secret.revealed.utf8)
            defer { plaintext.wipe() }
            let value = seal(plaintext, associatedData: Sealing.providerSecretData(provider))
            try await client.put(providerSecretKey(provider), value)
        case .savePendingRevocation(let revocation):
            var document = revocation.storedJSON().serialized()
            defer { document.wipe() }
            let value = seal(
                document, associatedData: Sealing.revocationData(revocation.id, revocation.record.account))
            try await client.put(revocationKey(revocation), value)
        case .deletePendingRevocation(let revocation): try await client.delete(revocationKey(revocation))
        }
    }

    public func loadProviderSecret(_ provider: String) async throws(VaultError) -> Secret? {
        guard let item = try await client.range(providerSecretKey(provider)).kvs.first else { return nil }
        guard var plaintext = open(item.value, associatedData: Sealing.providerSecretData(provider)) else {
            throw VaultError(
                .storeFailed,
                "the client secret of \(provider) in etcd under \(prefix) cannot be opened (damaged, or sealed under another key); store it again with vaultctl"
            )
        }
        defer { plaintext.wipe() }
        return Secret(String(decoding: plaintext, as: UTF8.self))
    }

    /// Every queued revocation the fleet's key opens; one that does not open
    /// is left in place and skipped.
    public func loadPendingRevocations() async throws(VaultError) -> [PendingRevocation] {
        let range = try await client.rangeAll(bytes("revocations/"), pageSize: pageSize)
        var revocations: [PendingRevocation] = []
        for item in range.kvs {
            guard let parts = segments(of: item.key, under: "revocations", count: 3),
                let account = try? Account.validate(provider: parts[0], user: parts[1])
            else { continue }
            let id = parts[2]
            guard var plaintext = open(item.value, associatedData: Sealing.revocationData(id, account)) else {
                continue
            }
            defer { plaintext.wipe() }
            guard let json = try? JSON.parse(plaintext), let revocation = try? PendingRevocation(storedJSON: json),
                revocation.id == id, revocation.record.account == account
            else { continue }
            revocations.append(revocation)
        }
        return revocations
    }

    /// Available when a quorum answers a linearizable read (etcd's default,
    /// `serializable=false`: the member asks the leader); unavailable when no
    /// endpoint gets one within the timeout.
    public func probe() async -> StoreProbe {
        do {
            _ = try await client.range(bytes("meta/key-id"))
            return .available
        } catch {
            return .unavailable(error.message)
        }
    }
}

/// Turns uids into user names and back on this host (the password file and
/// NSS, as the access policy resolves `Owner=` and `TokenReadUsers=`).
public struct OwnerNames: Sendable {
    /// The name of the user `uid`, nil when there is none.
    public var name: @Sendable (UInt32) -> String?
    /// The uid of the user called `name`, nil when there is none.
    public var uid: @Sendable (String) -> UInt32?

    /// Lookups from the given functions (tests name users of their own).
    public init(name: @escaping @Sendable (UInt32) -> String?, uid: @escaping @Sendable (String) -> UInt32?) {
        self.name = name
        self.uid = uid
    }

    /// This host's users, through `getpwuid_r` and `getpwnam_r`.
    public static let system = OwnerNames(
        name: { uid in
            lookup { entry, buffer, result in getpwuid_r(uid, &entry, buffer.baseAddress!, buffer.count, &result) }?
                .name
        },
        uid: { name in
            lookup { entry, buffer, result in getpwnam_r(name, &entry, buffer.baseAddress!, buffer.count, &result) }?
                .uid
        })

    /// The name and uid of the entry a `getpw*_r` call finds, read while its
    /// buffer lives; nil when there is none.
    private static func lookup(
        _ call: (inout passwd, UnsafeMutableBufferPointer<CChar>, inout UnsafeMutablePointer<passwd>?) -> Int32
    ) -> (name: String, uid: UInt32)? {
        var buffer = [CChar](repeating: 0, count: 16 * 1024)
        return buffer.withUnsafeMutableBufferPointer { buffer in
            var entry = passwd()
            var result: UnsafeMutablePointer<passwd>?
            guard call(&entry, buffer, &result) == 0, result != nil, let name = entry.pw_name else { return nil }
            return (String(cString: name), entry.pw_uid)
        }
    }
}
