import Testing
import VaultCore

@testable import VaultDaemon

/// How token endpoint answers are sorted (RFC 6749 sections 5.1 and 5.2).
@Suite("OAuth2 answers", .ownThreads, .timeLimit(.minutes(5)))
struct OAuth2ClassifyTests {
    func body(_ text: String) -> [UInt8] { Array(text.utf8) }

    @Test("Should take a token response, keeping expires_in")
    func success() {
        let outcome = OAuth2Client.classify(
            status: 200, body: body(#"{"access_token":"at_1","expires_in":60,"refresh_token":"rt_2"}"#),
            retryAfter: nil)
        guard case .refreshed(let tokens, let expiresIn, _) = outcome else {
            Issue.record("expected refreshed, got \(outcome)")
            return
        }
        #expect(tokens.accessToken.revealed == "at_1")
        #expect(tokens.refreshToken?.revealed == "rt_2")
        #expect(expiresIn == 60)
    }

    @Test("Should retry on 5xx, 429 (with Retry-After) and garbage; give up on a refused grant")
    func failures() {
        #expect(
            OAuth2Client.classify(status: 503, body: body("{}"), retryAfter: nil)
                == .transient(reason: "the token endpoint answered 503", retryAfter: nil))
        #expect(
            OAuth2Client.classify(status: 429, body: body(""), retryAfter: "7")
                == .transient(reason: "the token endpoint answered 429", retryAfter: 7))
        if case .transient = OAuth2Client.classify(status: 200, body: body("<html>oops"), retryAfter: nil) {
        } else {
            Issue.record("garbage must be transient")
        }
        for error in ["invalid_grant", "invalid_client", "unauthorized_client"] {
            if case .permanent(let code, _) = OAuth2Client.classify(
                status: 400, body: body(#"{"error":"\#(error)"}"#), retryAfter: nil)
            {
                #expect(code == error)
            } else {
                Issue.record("\(error) must be permanent")
            }
        }
        if case .permanent = OAuth2Client.classify(status: 401, body: body(""), retryAfter: nil) {
        } else {
            Issue.record("401 must be permanent")
        }
    }

    @Test("Should form-encode every byte but the unreserved ones, in the order given")
    func formEncoding() {
        let encoded = HTTPClient.formEncoded([
            ("grant_type", "refresh_token"), ("refresh_token", "a+b/c=d&e f"), ("scope", "é~x_y.z-1"),
        ])
        #expect(
            String(decoding: encoded, as: UTF8.self)
                == "grant_type=refresh_token&refresh_token=a%2Bb%2Fc%3Dd%26e%20f&scope=%C3%A9~x_y.z-1")
    }

    @Test("Should keep Retry-After in 0 s...1 h and ignore one that is no number")
    func retryAfterClamped() {
        for (header, expected): (String, Int64?) in [
            ("86400000", 3600), ("-5", 0), ("99999999999999999999999", nil), ("30", 30),
        ] {
            #expect(
                OAuth2Client.classify(status: 503, body: [], retryAfter: header)
                    == .transient(reason: "the token endpoint answered 503", retryAfter: expected), "\(header)")
        }
    }
}
