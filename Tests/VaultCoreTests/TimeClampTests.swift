import Glibc
import Testing
import VaultCore

/// Every time and duration stays in range where it is converted: no trap on a
/// huge lifetime, Retry-After or stored expiry.
@Suite("Clamped times", .timeLimit(.minutes(5)))
struct TimeClampTests {
    @Test("Should saturate UnixTime.adding at the ends of Int64 instead of trapping")
    func addingSaturates() {
        #expect(UnixTime(seconds: 1_700_000_000).adding(seconds: .max).seconds == .max)
        #expect(UnixTime(seconds: -5).adding(seconds: .min).seconds == .min)
        #expect(UnixTime(seconds: 10).adding(seconds: 5).seconds == 15)
    }

    @Test("Should cap Retry-After at an hour in the backoff")
    func retryAfterCapped() {
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0, retryAfter: .max) == RefreshPolicy.longestRetryAfter)
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0, retryAfter: 120) == 120)
        #expect(RefreshPolicy.backoff(attempt: 1, random: 0, retryAfter: -9) == 1)
    }

    @Test("Should clamp the times of a stored record to the epoch...year 9999")
    func storedTimesClamped() throws {
        var record = Fixtures.record()
        record.expiresAt = UnixTime(seconds: 8_999_999_999_999_999)
        record.tokens.issuedAt = UnixTime(seconds: -8_999_999_999_999_999)
        record.createdAt = UnixTime(seconds: -42)
        let decoded = try SessionRecord(storedJSON: record.storedJSON())
        #expect(decoded.expiresAt == UnixTime.latestExpiry)
        #expect(decoded.tokens.issuedAt == UnixTime(seconds: 0))
        #expect(decoded.createdAt == UnixTime(seconds: 0))
        let normal = Fixtures.record()
        #expect(try SessionRecord(storedJSON: normal.storedJSON()) == normal)
    }
}

@Suite("Times in messages", .timeLimit(.minutes(5)))
struct TimeTextTests {
    /// Should show times as ISO 8601 UTC, matching the C library's gmtime on
    /// many instants, and fall back to @SECONDS outside years 1970 to 9999.
    @Test func iso8601() {
        #expect(UnixTime(seconds: 0).description == "1970-01-01T00:00:00Z")
        #expect(UnixTime(seconds: 951_782_400).description == "2000-02-29T00:00:00Z")
        #expect(UnixTime(seconds: 1_796_051_471).description == "2026-11-30T15:11:11Z")
        #expect(UnixTime.latestExpiry.description == "9999-12-31T23:59:59Z")
        #expect(UnixTime(seconds: -1).description == "@-1")
        #expect(UnixTime(seconds: .max).description == "@\(Int64.max)")
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<2000 {
            let seconds = Int64.random(in: 0...UnixTime.latestExpiry.seconds, using: &generator)
            var t = time_t(seconds)
            var parts = tm()
            gmtime_r(&t, &parts)
            var buffer = [CChar](repeating: 0, count: 32)
            let n = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%SZ", &parts)
            let expected = String(decoding: buffer[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self)
            #expect(UnixTime(seconds: seconds).description == expected, "\(seconds)")
        }
    }
}
