import Glibc
import Testing
import Varlink
import VaultCore
import VaultDaemon
import VaultSystem

/// Where the seeding plan is: `VAULTD_BENCH_SEED` (a suite's traits cannot
/// refer to the suite's own members).
enum BenchSeedPlan {
    /// The plan file, or nil when no seeding was asked for.
    static let path: String? = {
        guard let value = Environment.get("VAULTD_BENCH_SEED"), !value.isEmpty else { return nil }
        return value
    }()
}

/// Seeds SQLite session databases for `scripts/bench --only storescale`
/// (issue 16): logging 100,000 sessions in one `Login` at a time costs one
/// fsync'd write each, so the benchmark writes them with
/// `SQLiteStore.importContents`, in one transaction per database, sealed
/// under the data key vaultd is then given as its credential.
///
/// Runs only when `VAULTD_BENCH_SEED` names a plan (JSON):
///
///     {"credentials": DIR,            // holds data-key (32 bytes)
///      "now": UNIX_SECONDS,           // optional: the time refreshes count from
///      "seeds": [{"path": DB, "count": N, "provider": "bench",
///                 "prefix": "s", "clientId": "vaultd-bench",
///                 "lifetime": SECONDS, "firstRefresh": SECONDS,
///                 "spread": SECONDS, "accessBytes": 180,
///                 "refreshBytes": 100, "append": false}]}
///
/// A seed with `append` adds to the database the seed before it wrote (other
/// users, another `prefix`); without, the file is written anew.
///
/// Every record looks like one an oauth2 `Login` makes (an access token and
/// a refresh token of real sizes, `Bearer`, the client id, a profile), issued
/// in the past and expiring in the future; record `i`'s refresh falls due
/// `firstRefresh + spread * (i + 0.5) / count` seconds from now (vaultd's own
/// `RefreshPolicy.refreshAt` with the account's jitter gives that time back),
/// so start-up schedules every one and the benchmark knows when they come.
@Suite("Benchmark seeding", .ownThreads, .timeLimit(.minutes(5)), .enabled(if: BenchSeedPlan.path != nil))
struct BenchSeed {
    /// One database to write.
    struct Seed {
        var path: String
        var count: Int
        var provider: String
        var prefix: String
        var clientID: String
        var lifetime: Int64
        var firstRefresh: Int64
        var spread: Int64
        var accessBytes: Int
        var refreshBytes: Int
        var append: Bool

        init(_ json: JSON) throws {
            path = try #require(json["path"]?.stringValue)
            count = Int(try #require(json["count"]?.integerValue))
            provider = json["provider"]?.stringValue ?? "bench"
            prefix = json["prefix"]?.stringValue ?? "s"
            clientID = json["clientId"]?.stringValue ?? "vaultd-bench"
            lifetime = json["lifetime"]?.integerValue ?? 13500
            firstRefresh = json["firstRefresh"]?.integerValue ?? 7200
            spread = json["spread"]?.integerValue ?? 3600
            accessBytes = Int(json["accessBytes"]?.integerValue ?? 180)
            refreshBytes = Int(json["refreshBytes"]?.integerValue ?? 100)
            append = json["append"]?.boolValue ?? false
        }
    }

    /// Characters of base64url, as in OAuth2 tokens.
    static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// A random run of token characters that tokens are cut from (each token
    /// is unique by its index; its bytes are sealed, so their randomness does
    /// not change the file's size).
    static func pool(_ size: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<size).map { _ in alphabet[Int(generator.next() % UInt64(alphabet.count))] }
    }

    /// A token of exactly `bytes` characters: `head`, the index, then pool characters.
    static func token(_ head: String, _ index: Int, bytes: Int, pool: [UInt8]) -> String {
        var text = Array("\(head)\(index)_".utf8)
        let start = (index &* 7919) % (pool.count - bytes)
        if text.count < bytes { text += pool[start..<(start + bytes - text.count)] }
        return String(decoding: text.prefix(bytes), as: UTF8.self)
    }

    /// The records of `seed`, their refresh times spread as the plan says.
    static func records(_ seed: Seed, now: UnixTime, owner: UInt32) throws -> [SessionRecord] {
        let pool = pool(8192)
        var mistimed = 0
        var records: [SessionRecord] = []
        records.reserveCapacity(seed.count)
        for index in 0..<seed.count {
            let account = Account(provider: seed.provider, user: "\(seed.prefix)\(index)")
            let refreshOffset = seed.firstRefresh + seed.spread * Int64(2 * index + 1) / Int64(2 * seed.count)
            let refreshAt = now.adding(seconds: refreshOffset)
            let fraction = 0.8 + 0.1 * min(max(RefreshPolicy.jitter(for: account), 0), 0.999)
            let issued = refreshAt.adding(seconds: -Int64((Double(seed.lifetime) * fraction).rounded(.down)))
            let expires = issued.adding(seconds: seed.lifetime)
            try #require(issued <= now, "record \(index) would be issued in the future: raise lifetime")
            try #require(expires > now, "record \(index) would have expired: lower lifetime or firstRefresh")
            var tokens = TokenSet(accessToken: Secret(token("ya29.a0", index, bytes: seed.accessBytes, pool: pool)))
            tokens.refreshToken = Secret(token("1//0g", index, bytes: seed.refreshBytes, pool: pool))
            tokens.tokenType = "Bearer"
            tokens.clientID = seed.clientID
            tokens.issuedAt = issued
            var profile = UserProfile(uid: account.user)
            profile.name = "Bench User \(index)"
            records.append(
                SessionRecord(
                    account: account, user: profile, tokens: tokens, createdAt: issued, expiresAt: expires,
                    ownerUID: owner))
            // What vaultd will compute when it restores the record.
            let planned = RefreshPolicy.refreshAt(
                issuedAt: issued, expiresAt: expires, jitter: RefreshPolicy.jitter(for: account))
            if planned != refreshAt { mistimed += 1 }
        }
        #expect(mistimed == 0, "records whose refresh vaultd would not schedule when planned")
        return records
    }

    @Test("Should write each planned database, every record readable with the credential's key")
    func seed() async throws {
        let plan = try JSON.parse(try Files.read(try #require(BenchSeedPlan.path), limit: 1 << 20))
        let keys = CredentialDataKeys(directory: try #require(plan["credentials"]?.stringValue))
        let log = Logger(level: .notice, target: .discard)
        let now = UnixTime(seconds: plan["now"]?.integerValue ?? Int64(time(nil)))
        var written: [String: Int] = [:]
        for item in try #require(plan["seeds"]?.arrayValue) {
            let seed = try Seed(item)
            if !seed.append {
                for suffix in ["", "-wal", "-shm"] { unlink(seed.path + suffix) }
                written[seed.path] = 0
            }
            written[seed.path, default: 0] += seed.count
            let records = try Self.records(seed, now: now, owner: getuid())
            do {
                let store = try await SQLiteStore.open(path: seed.path, keys: keys, timeoutSeconds: 600, log: log)
                try await store.importContents(records: records, revocations: [], providerSecrets: [:])
                await store.close()
            }  // the writer and its lock go here, as a process's would at its exit
            // Read back through a new connection, as vaultd will.
            let reopened = try await SQLiteStore.openForReading(path: seed.path, keys: keys, timeoutSeconds: 600)
            let contents = try await reopened.loadAll()
            #expect(contents.unreadable.isEmpty)
            #expect(contents.records.count == written[seed.path])
            #expect(Set(contents.records.map(\.account.user)).count == written[seed.path])
            print("seeded \(seed.count) sessions into \(seed.path)")
        }
    }
}
