import Testing
import VaultCore

/// Facts of a refreshable session whose tokens were obtained at `at` and expire at `expiresAt`.
private func facts(at: UnixTime, expiresAt: UnixTime?) -> SessionTimers.Facts {
    SessionTimers.Facts(
        expiresAt: expiresAt, refreshedAt: at, createdAt: at, canRefresh: true, maxLifetimeSeconds: nil, jitter: 0.5)
}

@Suite("Tokens without an expiry", .timeLimit(.minutes(5)))
struct NoExpiryTests {
    let now = UnixTime(seconds: 1_700_000_000)

    @Test("Should take expires_in first, then the token's own expiry, then DefaultLifetime=, else none")
    func expiresAtOrder() {
        let embedded = now.adding(seconds: 500)
        #expect(
            RefreshPolicy.expiresAt(issuedAt: now, expiresIn: 60, embedded: embedded, defaultLifetime: 7200)
                == now.adding(seconds: 60))
        #expect(
            RefreshPolicy.expiresAt(issuedAt: now, expiresIn: nil, embedded: embedded, defaultLifetime: 7200)
                == embedded)
        #expect(
            RefreshPolicy.expiresAt(issuedAt: now, expiresIn: nil, defaultLifetime: 7200)
                == now.adding(seconds: 7200))
        #expect(RefreshPolicy.expiresAt(issuedAt: now, expiresIn: nil, defaultLifetime: nil) == nil)
    }

    @Test("Should arm no refresh after a refresh that returned a token without an expiry and no DefaultLifetime=")
    func refreshedWithoutExpiry_armsNoRefresh() {
        // The CometChat case: a session whose record had an hour's expiry (as
        // vaultd used to assume after a refresh) is refreshed by a client once.
        var timers = SessionTimers()
        let before = timers.handle(.stored(facts(at: now, expiresAt: now.adding(seconds: 3600)), now: now))
        #expect(before.contains { if case .schedule(.refresh, _) = $0 { true } else { false } })
        _ = timers.handle(.refreshStarted)
        let later = now.adding(seconds: 60)
        let expiresAt = RefreshPolicy.expiresAt(issuedAt: later, expiresIn: nil, defaultLifetime: nil)
        let actions = timers.handle(.refreshed(facts(at: later, expiresAt: expiresAt), saved: true, now: later))
        #expect(
            actions == [.cancel(.expire), .cancel(.refresh), .cancel(.saveRetry), .connection(.connected)])
        #expect(timers.status.refreshAt == nil)
        #expect(timers.status.lastRefreshAt == later)
    }

    @Test("Should refresh on a schedule a token without an expiry when DefaultLifetime= is set")
    func refreshedWithDefaultLifetime_armsRefresh() throws {
        var timers = SessionTimers()
        let expiresAt = RefreshPolicy.expiresAt(issuedAt: now, expiresIn: nil, defaultLifetime: 1000)
        let actions = timers.handle(.stored(facts(at: now, expiresAt: expiresAt), now: now))
        #expect(actions.first == .schedule(.expire, at: now.adding(seconds: 1000)))
        let refreshAt = try #require(timers.status.refreshAt)
        #expect(refreshAt >= now.adding(seconds: 800) && refreshAt <= now.adding(seconds: 900))
    }

    @Test("Should leave DefaultLifetime= unset unless the section sets it, for oauth2 and exec providers")
    func defaultLifetimeOnlyWhenSet() throws {
        let config = try ConfigParser.parse(
            """
            [Provider o]
            Type=oauth2
            TokenURL=https://x.example/t
            ClientID=c

            [Provider e]
            Type=exec
            Command=/bin/true

            [Provider l]
            Type=exec
            Command=/bin/true
            DefaultLifetime=30d

            [Provider s]
            Type=oauth2
            TokenURL=https://x.example/t
            ClientID=c
            DefaultLifetime=2h
            """, file: "t.conf")
        #expect(config.providers["o"]?.defaultLifetime == nil)
        #expect(config.providers["e"]?.defaultLifetime == nil)
        #expect(config.providers["l"]?.defaultLifetime == Int64(30 * 86400))
        #expect(config.providers["s"]?.defaultLifetime == 7200)
        let refused = #expect(throws: VaultError.self) {
            try ConfigParser.parse("[Provider e]\nType=exec\nCommand=/bin/true\nDefaultLifetime=0\n", file: "t.conf")
        }
        #expect(refused?.message.contains("t.conf:4: key 'DefaultLifetime'") == true, "\(refused?.message ?? "")")
    }
}

@Suite("Provider failures", .timeLimit(.minutes(5)))
struct ProviderFailureTests {
    @Test("Should keep a plausible provider code beside vaultd's, and none that repeats it")
    func providerCode() {
        #expect(
            ProviderFailure.providerCode("AUTH_ERR_APIKEY_NOT_FOUND", kind: .invalidClient)
                == "AUTH_ERR_APIKEY_NOT_FOUND")
        #expect(ProviderFailure.providerCode("invalid_grant", kind: .grantRevoked) == "invalid_grant")
        #expect(ProviderFailure.providerCode("ERR_INVALID_CLIENT", kind: .invalidClient) == nil)
        #expect(ProviderFailure.providerCode("ERR x", kind: .networkError) == nil)
        #expect(ProviderFailure.providerCode(String(repeating: "E", count: 65), kind: .networkError) == nil)
        #expect(ProviderFailure.providerCode(nil, kind: .networkError) == nil)
    }

    @Test(
        "Should sort a failure into one of vaultd's kinds: its own codes, a revoked grant, a refused client, else invalidCredential or networkError"
    )
    func kinds() {
        #expect(ProviderFailure.permanentKind("ERR_UID_NOT_FOUND") == .uidNotFound)
        #expect(ProviderFailure.permanentKind("ERR_USER_DEACTIVATED") == .userDeactivated)
        #expect(ProviderFailure.permanentKind("AUTH_ERR_AUTH_TOKEN_NOT_FOUND") == .invalidCredential)
        #expect(ProviderFailure.permanentKind("AUTH_ERR_APIKEY_NOT_FOUND") == .invalidClient)
        #expect(ProviderFailure.permanentKind("invalid_client") == .invalidClient)
        #expect(ProviderFailure.permanentKind("unauthorized_client") == .invalidClient)
        #expect(ProviderFailure.permanentKind("invalid_grant") == .grantRevoked)
        #expect(ProviderFailure.permanentKind("ERR_CANNOT_REFRESH") == .cannotRefresh)
        #expect(ProviderFailure.permanentKind("ERR_SOMETHING_ELSE") == .invalidCredential)
        #expect(ProviderFailure.transientKind(nil) == .networkError)
        #expect(ProviderFailure.transientKind("ERR_INVALID_API_KEY") == .networkError)
        #expect(ProviderFailure.transientKind("ERR_HELPER_UNAVAILABLE") == .helperUnavailable)
    }

    @Test("Should carry vaultd's code and the provider's code and words side by side")
    func refusalPair() {
        let error = ProviderFailure.refusal(
            code: "AUTH_ERR_APIKEY_NOT_FOUND", reason: "API key not found", message: "the provider refused")
        #expect(error.code == .invalidClient)
        #expect(error.providerCode == "AUTH_ERR_APIKEY_NOT_FOUND")
        #expect(error.providerMessage == "API key not found")
        #expect("\(error)" == "ERR_INVALID_CLIENT: the provider refused (provider: AUTH_ERR_APIKEY_NOT_FOUND)")
        #expect(error == VaultError(.invalidClient, "other"), "equal on the kind")
        #expect(VaultError.Code.helperUnavailable.declaration.varlinkName == "HelperUnavailable")
    }
}

@Suite("Tokens without an expiry: failures", .timeLimit(.minutes(5)))
struct NoExpiryFailureTests {
    let now = UnixTime(seconds: 1_700_000_000)

    @Test("Should not retry on a schedule a failed refresh of a token without an expiry, and keep its backoff")
    func failedRefreshWithoutExpiry_noRetry() {
        var timers = SessionTimers()
        _ = timers.handle(.stored(facts(at: now, expiresAt: nil), now: now))
        _ = timers.handle(.refreshStarted)
        let actions = timers.handle(
            .refreshFailed(
                VaultError(.networkError, "ERR_NETWORK_ERROR: down"), retryAfter: nil, random: 0.5, now: now,
                expired: false))
        #expect(actions == [.connection(.connectFailed, failure: VaultError(.networkError, "ERR_NETWORK_ERROR: down"))])
        // No timer, but a client asking again waits the backoff out (ClientRefresh).
        #expect(timers.status.nextRetryAt == now.adding(seconds: 1))
        #expect(timers.status.consecutiveFailures == 1)
        #expect(!timers.refreshing)
    }
}
