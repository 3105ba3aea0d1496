import Testing
import Varlink
import VaultCore

@testable import VaultDaemon

/// The device authorization grant's parsing (RFC 8628 sections 3.2 and 3.5)
/// and its classification of poll answers (the table of pending logins:
/// PendingLoginsTests).
@Suite("Device flow")
struct DeviceFlowTests {
    func parse(_ status: Int, _ body: String) -> Result<DeviceAuthorization, VaultError> {
        DeviceAuthorization.parse(status: status, body: Array(body.utf8))
    }

    @Test("Should read a device authorization response with every field")
    func fullResponse() throws {
        let made = try parse(
            200,
            #"{"device_code":"dc-1","user_code":"WDJB-MJHT","verification_uri":"https://example.com/device","verification_uri_complete":"https://example.com/device?user_code=WDJB-MJHT","expires_in":1800,"interval":7}"#
        ).get()
        #expect(made.deviceCode.revealed == "dc-1")
        #expect(made.userCode == "WDJB-MJHT")
        #expect(made.verificationURI == "https://example.com/device")
        #expect(made.verificationURIComplete == "https://example.com/device?user_code=WDJB-MJHT")
        #expect(made.expiresIn == 1800)
        #expect(made.interval == 7)
    }

    @Test("Should take 5 s without an interval, Google's verification_url, and keep the numbers in range")
    func defaultsAndClamps() throws {
        let made = try parse(
            200,
            #"{"device_code":"d","user_code":"1234","verification_url":"https://g.example/device","expires_in":999999}"#
        ).get()
        #expect(made.interval == 5)
        #expect(made.verificationURI == "https://g.example/device")
        #expect(made.verificationURIComplete == nil)
        #expect(made.expiresIn == DeviceAuthorization.longestLifetime)
        let tiny = try parse(
            200, #"{"device_code":"d","user_code":"1","verification_uri":"http://127.0.0.1/d","interval":0}"#
        ).get()
        #expect(tiny.interval == 1)
        #expect(tiny.expiresIn == DeviceAuthorization.defaultLifetime)
    }

    @Test(
        "Should refuse answers it cannot show safely or that lack a field",
        arguments: [
            #"{"user_code":"A","verification_uri":"https://e.example/d"}"#,
            #"{"device_code":"d","verification_uri":"https://e.example/d"}"#,
            #"{"device_code":"d","user_code":"A"}"#,
            #"{"device_code":"d","user_code":"A\u001b[2J","verification_uri":"https://e.example/d"}"#,
            #"{"device_code":"d","user_code":"A","verification_uri":"javascript:alert(1)"}"#,
            #"{"device_code":"d","user_code":"A","verification_uri":"https://e.example/a b"}"#,
            "not json",
        ])
    func refused(_ body: String) {
        guard case .failure(let error) = parse(200, body) else {
            Issue.record("accepted \(body)")
            return
        }
        #expect(error.code == .networkError)
        #expect(!error.message.contains("\"d\""))
    }

    @Test("Should report the endpoint's refusal with the provider's code, and a 5xx as a network error")
    func endpointErrors() {
        guard case .failure(let refused) = parse(401, #"{"error":"invalid_client"}"#) else {
            Issue.record("a 401 accepted")
            return
        }
        #expect(refused.code == .invalidClient)
        #expect(refused.providerCode == "invalid_client")
        guard case .failure(let down) = parse(503, "") else {
            Issue.record("a 503 accepted")
            return
        }
        #expect(down.code == .networkError)
    }

    func classify(_ status: Int, _ body: String) -> DevicePollAnswer {
        DevicePollAnswer.classify(status: status, body: Array(body.utf8), retryAfter: nil)
    }

    @Test("Should sort the token endpoint's answers to a device code poll")
    func pollAnswers() {
        guard case .tokens(let response) = classify(200, #"{"access_token":"at","token_type":"Bearer"}"#) else {
            Issue.record("no tokens")
            return
        }
        #expect(response["access_token"]?.stringValue == "at")
        guard case .pending = classify(400, #"{"error":"authorization_pending"}"#) else {
            Issue.record("not pending")
            return
        }
        guard case .slowDown = classify(400, #"{"error":"slow_down"}"#) else {
            Issue.record("not slow_down")
            return
        }
        for (body, code, providerCode) in [
            (#"{"error":"access_denied"}"#, VaultError.Code.loginDenied, "access_denied"),
            (#"{"error":"expired_token"}"#, .loginExpired, "expired_token"),
            (#"{"error":"invalid_grant"}"#, .grantRevoked, "invalid_grant"),
            (#"{"error":"invalid_client"}"#, .invalidClient, "invalid_client"),
        ] {
            guard case .failed(let error) = classify(400, body) else {
                Issue.record("\(body) not a failure")
                continue
            }
            #expect(error.code == code, "\(body)")
            #expect(error.providerCode == providerCode, "\(body)")
        }
        for (status, body) in [(503, ""), (200, "{}"), (429, "")] {
            guard case .transient(let error) = classify(status, body) else {
                Issue.record("\(status) \(body) not transient")
                continue
            }
            #expect(error.code == .networkError)
        }
    }
}
