/// How a vaultd of a fleet reaches etcd (`[Etcd]`, read with `Store=etcd`).
public struct EtcdSettings: Sendable, Equatable {
    /// The members' client URLs (`Endpoints=`), tried in turn.
    public var endpoints: [String] = []
    /// What every key of this fleet starts with (`KeyPrefix=`).
    public var keyPrefix = "/vaultd/"
    /// The CA certificate that signed the members' certificates (`CAFile=`).
    public var caFile: String?
    /// This host's client certificate (`CertFile=`), with its key `keyFile`.
    public var certFile: String?
    /// The client certificate's private key (`KeyFile=`).
    public var keyFile: String?
    /// How long one etcd call may take, every endpoint tried included (`Timeout=`), in seconds.
    public var timeoutSeconds: Int64 = 5
    /// How long an account's refresh lock outlives a host that died holding
    /// it (`LockTTL=`), in seconds: the lease under the lock's key.
    public var lockTTLSeconds: Int64 = 10

    /// The defaults: no endpoint, prefix `/vaultd/`, 5 s, locks of 10 s.
    public init() {}
}

extension ConfigParser {
    /// The keys `[Etcd]` accepts.
    static let etcdKeys = ["Endpoints", "KeyPrefix", "CAFile", "CertFile", "KeyFile", "Timeout", "LockTTL"]

    /// The settings of the merged `[Etcd]` section. Whether there must be an
    /// endpoint depends on the engine, which the environment may still
    /// change: the daemon checks that (`StoreSelection`).
    static func etcdSettings(_ entries: [String: Entry]) throws(VaultError) -> EtcdSettings {
        var settings = EtcdSettings()
        if let entry = entries["Endpoints"] {
            let urls = entry.value.split(whereSeparator: { $0 == " " || $0 == "," || $0 == "\t" }).map(String.init)
            guard !urls.isEmpty else {
                throw entry.error("key 'Endpoints': expected one or more http:// or https:// URLs")
            }
            for url in urls {
                let rest =
                    url.hasPrefix("https://") ? url.dropFirst(8) : url.hasPrefix("http://") ? url.dropFirst(7) : ""
                guard !rest.isEmpty, !rest.hasPrefix("/") else {
                    throw entry.error(
                        "key 'Endpoints': expected http:// or https:// URLs of etcd members, separated by spaces or commas, such as http://127.0.0.1:2379"
                    )
                }
            }
            settings.endpoints = urls
        }
        if let entry = entries["KeyPrefix"] {
            let value = entry.value
            guard !value.isEmpty, value.utf8.count <= 256, value.hasSuffix("/"), !value.contains(" ") else {
                throw entry.error(
                    "key 'KeyPrefix': expected 1 to 256 bytes without spaces, ending in '/', such as /vaultd/")
            }
            settings.keyPrefix = value
        }
        for key in ["CAFile", "CertFile", "KeyFile"] {
            guard let entry = entries[key] else { continue }
            guard entry.value.hasPrefix("/"), !entry.value.hasSuffix("/") else {
                throw entry.error("key '\(key)': expected an absolute path to a PEM file")
            }
            switch key {
            case "CAFile": settings.caFile = entry.value
            case "CertFile": settings.certFile = entry.value
            default: settings.keyFile = entry.value
            }
        }
        if (settings.certFile == nil) != (settings.keyFile == nil) {
            let entry = entries["CertFile"] ?? entries["KeyFile"]!
            throw entry.error("keys 'CertFile' and 'KeyFile': a client certificate needs both, its file and its key's")
        }
        if let entry = entries["Timeout"] { settings.timeoutSeconds = try timeout(entry, key: "Timeout") }
        if let entry = entries["LockTTL"] {
            // etcd grants leases of 2 s and more; a lock of over 5 min would
            // keep a fleet's account from refreshing long after its holder died.
            guard let seconds = DurationParser.seconds(entry.value), (2...300).contains(seconds) else {
                throw entry.error("key 'LockTTL': expected a duration from 2s to 5min, e.g. 10 or 10s")
            }
            settings.lockTTLSeconds = seconds
        }
        return settings
    }
}
