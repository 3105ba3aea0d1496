import CHTTP
import Synchronization
import Varlink
import VaultCore
import VaultDaemon
import VaultSystem

/// One key of etcd with its value and revisions, as a range or a transaction returns it.
struct EtcdKeyValue: Sendable, Equatable {
    var key: [UInt8]
    var value: [UInt8]
    /// The revision of the key's creation (0 for a key that does not exist).
    var createRevision: Int64
    /// The revision of the key's last change.
    var modRevision: Int64
    /// How many times the key changed since its creation.
    var version: Int64
    /// The lease the key is attached to, 0 for none.
    var lease: Int64
}

/// What a range read found, at the store's `revision`.
struct EtcdRange: Sendable, Equatable {
    var kvs: [EtcdKeyValue]
    /// The store's revision when the range was read.
    var revision: Int64
    /// True when `limit` cut the answer short.
    var more: Bool
}

/// A condition of a transaction, on one key's revision.
enum EtcdCompare: Sendable, Equatable {
    /// The key's last change is at `revision` (0: the key does not exist).
    case modRevision([UInt8], equals: Int64)
    /// The key was created at `revision` (0: the key does not exist).
    case createRevision([UInt8], equals: Int64)
}

/// One operation of a transaction's branch.
enum EtcdOperation: Sendable, Equatable {
    case put([UInt8], [UInt8], lease: Int64 = 0)
    case delete([UInt8])
    case range([UInt8])
}

/// What a transaction did: which branch ran, at which revision, and the keys
/// its range operations read (one list per operation, empty for the others).
struct EtcdTxnResult: Sendable, Equatable {
    var succeeded: Bool
    var revision: Int64
    var ranges: [[EtcdKeyValue]]
}

/// A lease etcd granted: its id and time to live in seconds.
struct EtcdLease: Sendable, Equatable {
    var id: Int64
    var ttl: Int64
}

/// etcd's v3 API through its JSON gateway (grpc-gateway: `POST /v3/...`, keys
/// and values in base64, 64-bit numbers as strings), over vaultd's libcurl
/// client on `WorkerPool`'s HTTP workers (never the cooperative pool).
///
/// A call tries the endpoints in turn, starting at the last one that answered,
/// and moves to the next when one cannot be reached, does not answer within
/// its share of the time left, or answers that it is unavailable (no leader,
/// no quorum); the whole call ends within `timeout`. A request that timed out
/// may still have been applied: a retried put writes again, a retried
/// transaction's compare then fails; callers re-read before concluding.
/// When no endpoint answers, the call fails with `storeUnavailable`; when etcd
/// refuses the request, with `storeFailed`. Values never appear in errors.
///
/// Over `https://` endpoints, `tls` names the CA that signed the members'
/// certificates and this host's client certificate and key (`[Etcd]
/// CAFile=`, `CertFile=`, `KeyFile=`), handed to libcurl as they are.
///
/// Not in this slice: watches (`/v3/watch`, a streaming answer the libcurl
/// client does not read yet).
final class EtcdClient: Sendable {
    /// The members' client URLs (`http://127.0.0.1:2379`), without a trailing slash.
    let endpoints: [String]
    /// The longest one call takes, all endpoints tried included.
    let timeoutSeconds: Double
    /// The TLS files of every request, nil for none.
    let tls: TLSFiles?
    /// The endpoint that answered last, tried first next time.
    private let preferred = Mutex(0)

    /// A client of the members at `endpoints`, each call ending within `timeoutSeconds`.
    init(endpoints: [String], timeoutSeconds: Double = 5, tls: TLSFiles? = nil) {
        self.endpoints = endpoints.map { $0.hasSuffix("/") ? String($0.dropLast()) : $0 }
        self.timeoutSeconds = timeoutSeconds
        self.tls = tls
    }

    /// The largest answer read: a page of `rangeAll` (1,000 sealed sessions
    /// of about a kilobyte each, in base64 inside JSON) with room to spare.
    static let maximumAnswer = 8 * 1024 * 1024

    // MARK: Key-value

    /// Every key starting with `prefix`, read in pages of `pageSize` keys,
    /// all at the revision of the first page (a consistent snapshot however
    /// many pages it takes); that revision is the answer's.
    func rangeAll(_ prefix: [UInt8], pageSize: Int64 = 1000) async throws(VaultError) -> EtcdRange {
        let end = Base64.encode(Self.prefixEnd(prefix))
        var start = prefix
        var kvs: [EtcdKeyValue] = []
        var revision: Int64 = 0
        // Bounded: each page moves past its last key; 100,000 pages of 1,000 is past any fleet.
        for _ in 0..<100_000 {
            var request: [String: JSON] = [
                "key": .string(Base64.encode(start)), "range_end": .string(end),
                "limit": .string(String(max(1, pageSize))),
            ]
            if revision > 0 { request["revision"] = .string(String(revision)) }
            let answer = try await call("/v3/kv/range", .object(request))
            let page = try Self.keyValues(answer["kvs"])
            if revision == 0 { revision = Self.int(answer["header"]?["revision"]) }
            kvs += page
            guard answer["more"]?.boolValue == true, let last = page.last else { break }
            start = last.key + [0]
        }
        return EtcdRange(kvs: kvs, revision: revision, more: false)
    }

    /// The key `key`, or with `prefix` every key starting with it, at most `limit` (0: all).
    func range(_ key: [UInt8], prefix: Bool = false, limit: Int64 = 0) async throws(VaultError) -> EtcdRange {
        var request: [String: JSON] = ["key": .string(Base64.encode(key))]
        if prefix { request["range_end"] = .string(Base64.encode(Self.prefixEnd(key))) }
        if limit > 0 { request["limit"] = .string(String(limit)) }
        let answer = try await call("/v3/kv/range", .object(request))
        return EtcdRange(
            kvs: try Self.keyValues(answer["kvs"]), revision: Self.int(answer["header"]?["revision"]),
            more: answer["more"]?.boolValue ?? false)
    }

    /// Sets `key` to `value`, attached to `lease` when not 0; the store's new revision.
    @discardableResult
    func put(_ key: [UInt8], _ value: [UInt8], lease: Int64 = 0) async throws(VaultError) -> Int64 {
        let answer = try await call("/v3/kv/put", Self.putRequest(key, value, lease: lease))
        return Self.int(answer["header"]?["revision"])
    }

    /// Deletes `key`, or with `prefix` every key starting with it; how many were deleted.
    @discardableResult
    func delete(_ key: [UInt8], prefix: Bool = false) async throws(VaultError) -> Int64 {
        var request: [String: JSON] = ["key": .string(Base64.encode(key))]
        if prefix { request["range_end"] = .string(Base64.encode(Self.prefixEnd(key))) }
        let answer = try await call("/v3/kv/deleterange", .object(request))
        return Self.int(answer["deleted"])
    }

    /// Runs `success` when every compare holds, else `failure`, atomically.
    func txn(_ compares: [EtcdCompare], success: [EtcdOperation], failure: [EtcdOperation] = [])
        async throws(VaultError) -> EtcdTxnResult
    {
        let compare: [JSON] = compares.map { condition in
            switch condition {
            case .modRevision(let key, let revision):
                return [
                    "key": .string(Base64.encode(key)), "target": "MOD", "result": "EQUAL",
                    "mod_revision": .string(String(revision)),
                ]
            case .createRevision(let key, let revision):
                return [
                    "key": .string(Base64.encode(key)), "target": "CREATE", "result": "EQUAL",
                    "create_revision": .string(String(revision)),
                ]
            }
        }
        let request: JSON = [
            "compare": .array(compare), "success": .array(success.map(Self.operation)),
            "failure": .array(failure.map(Self.operation)),
        ]
        let answer = try await call("/v3/kv/txn", request)
        var ranges: [[EtcdKeyValue]] = []
        for response in answer["responses"]?.arrayValue ?? [] {
            ranges.append(try Self.keyValues(response["response_range"]?["kvs"]))
        }
        return EtcdTxnResult(
            succeeded: answer["succeeded"]?.boolValue ?? false, revision: Self.int(answer["header"]?["revision"]),
            ranges: ranges)
    }

    // MARK: Leases

    /// A new lease living `ttl` seconds unless kept alive.
    func grantLease(ttl: Int64) async throws(VaultError) -> EtcdLease {
        let answer = try await call("/v3/lease/grant", ["TTL": .string(String(ttl)), "ID": "0"])
        let id = Self.int(answer["ID"])
        guard id != 0 else {
            throw VaultError(
                .storeFailed, "etcd granted no lease (\(answer["error"]?.stringValue ?? "no ID in its answer"))")
        }
        return EtcdLease(id: id, ttl: Self.int(answer["TTL"]))
    }

    /// Renews lease `id`; its time to live now, 0 when it has expired or was revoked.
    func keepAlive(_ id: Int64) async throws(VaultError) -> Int64 {
        let answer = try await call("/v3/lease/keepalive", ["ID": .string(String(id))])
        return Self.int(answer["result"]?["TTL"])
    }

    /// The seconds lease `id` has left (etcd rounds them down), -1 when it
    /// has expired or was revoked.
    func leaseTimeToLive(_ id: Int64) async throws(VaultError) -> Int64 {
        let answer = try await call("/v3/lease/timetolive", ["ID": .string(String(id))])
        guard let ttl = answer["TTL"] else { return -1 }
        return Self.int(ttl)
    }

    /// Revokes lease `id`, deleting every key attached to it. A lease etcd
    /// no longer knows counts as revoked: a revoke that timed out on one
    /// member may have been applied before it was tried on the next.
    func revokeLease(_ id: Int64) async throws(VaultError) {
        do {
            _ = try await call("/v3/lease/revoke", ["ID": .string(String(id))])
        } catch  where error.code == .storeFailed && error.message.contains("lease not found") {
            return
        }
    }

    // MARK: Transport

    /// POSTs `request` to `path` on the endpoints in turn until one answers;
    /// its parsed answer.
    private func call(_ path: String, _ request: JSON) async throws(VaultError) -> JSON {
        let body = request.serialized()
        let deadline = Monotonic.milliseconds() + UInt64(max(0, timeoutSeconds) * 1000)
        let first = preferred.withLock { $0 }
        var reasons: [String] = []
        for step in 0..<endpoints.count {
            let index = (first + step) % endpoints.count
            let endpoint = endpoints[index]
            let now = Monotonic.milliseconds()
            guard now < deadline else {
                reasons.append(
                    "\(HTTPClient.host(of: endpoint)): not tried, the \(Self.seconds(timeoutSeconds)) were up")
                continue
            }
            // A member that hangs (its leader just died, its proposal is lost)
            // gets its share of the time left, not all of it: the members not
            // tried yet may answer. The last one gets whatever is left.
            let left = Double(deadline - now) / 1000 / Double(endpoints.count - step)
            let response: HTTPResponse
            do {
                response = try await HTTPClient.postJSON(
                    endpoint + path, body, timeoutSeconds: left, cap: 4, tls: tls, maximumBody: Self.maximumAnswer)
            } catch {
                reasons.append(error.reason)
                continue
            }
            let answer = try? JSON.parse(response.body)
            if response.status == 200, let answer {
                preferred.withLock { $0 = index }
                return answer
            }
            let message =
                answer?["message"]?.stringValue ?? answer?["error"]?.stringValue
                ?? "HTTP \(response.status) without an etcd answer"
            // 503 and 504: the member has no leader or no quorum, or timed out
            // waiting for one; another member may have both.
            if response.status >= 500 {
                reasons.append("\(HTTPClient.host(of: endpoint)): \(message)")
                continue
            }
            throw VaultError(
                .storeFailed,
                "etcd at \(HTTPClient.host(of: endpoint)) refused \(path): \(message) (HTTP \(response.status))")
        }
        throw VaultError(
            .storeUnavailable,
            "no etcd endpoint answered \(path) within \(Self.seconds(timeoutSeconds)) (\(reasons.joined(separator: "; "))): check that a quorum of the etcd members runs and that [Etcd] Endpoints= names them"
        )
    }

    private static func seconds(_ value: Double) -> String {
        value == value.rounded() ? "\(Int(value))s" : "\(value)s"
    }

    private static func putRequest(_ key: [UInt8], _ value: [UInt8], lease: Int64) -> JSON {
        var request: [String: JSON] = ["key": .string(Base64.encode(key)), "value": .string(Base64.encode(value))]
        if lease != 0 { request["lease"] = .string(String(lease)) }
        return .object(request)
    }

    private static func operation(_ operation: EtcdOperation) -> JSON {
        switch operation {
        case .put(let key, let value, let lease):
            return ["request_put": putRequest(key, value, lease: lease)]
        case .delete(let key):
            return ["request_delete_range": ["key": .string(Base64.encode(key))]]
        case .range(let key):
            return ["request_range": ["key": .string(Base64.encode(key))]]
        }
    }

    /// The end of the range of every key starting with `prefix`: the prefix
    /// with its last byte below 0xFF incremented ("\0", every key, for none).
    static func prefixEnd(_ prefix: [UInt8]) -> [UInt8] {
        var end = prefix
        while let last = end.last {
            if last < 0xFF {
                end[end.count - 1] = last + 1
                return end
            }
            end.removeLast()
        }
        return [0]
    }

    /// A 64-bit number of the gateway's answer (a string; absent means 0).
    static func int(_ value: JSON?) -> Int64 {
        if let text = value?.stringValue { return Int64(text) ?? 0 }
        return value?.integerValue ?? 0
    }

    static func keyValues(_ value: JSON?) throws(VaultError) -> [EtcdKeyValue] {
        var out: [EtcdKeyValue] = []
        for item in value?.arrayValue ?? [] {
            guard let key = Base64.decode(item["key"]?.stringValue ?? ""),
                let value = Base64.decode(item["value"]?.stringValue ?? "")
            else {
                throw VaultError(.storeFailed, "etcd answered a key or value that is not base64")
            }
            out.append(
                EtcdKeyValue(
                    key: key, value: value, createRevision: int(item["create_revision"]),
                    modRevision: int(item["mod_revision"]), version: int(item["version"]), lease: int(item["lease"])))
        }
        return out
    }
}
