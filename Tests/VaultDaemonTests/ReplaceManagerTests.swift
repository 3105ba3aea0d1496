import Testing
import Varlink
import VaultCore
import VaultDaemon

@Suite("SessionManager: replace in place and rejected tokens, in process", .timeLimit(.minutes(5)))
struct ReplaceManagerTests {
    /// A replacing login of `user` for alice with a fresh grant; the grant's access token and the result.
    func replace(_ h: ManagerHarness, _ user: String, caller: Caller = ManagerHarness.alice, ownerUID: UInt32? = nil)
        async throws(VaultError) -> (access: String, record: SessionRecord)
    {
        let (_, response) = h.provider.grant(lifetime: 300)
        let request = LoginRequest(
            provider: "oauth", user: user, tokenResponse: response, ownerUID: ownerUID, replace: true)
        let (record, created) = try await h.manager.login(request, caller: caller)
        #expect(created)
        return (response["access_token"]?.stringValue ?? "", record)
    }

    func served(_ h: ManagerHarness, _ user: String) -> String? {
        h.manager.table.view(of: h.key(user))?.record?.tokens.accessToken.revealed
    }

    @Test("Should store and serve the new tokens at once, tell subscribers, and revoke the replaced refresh token")
    func replaceInPlace() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        let (access, record) = try await replace(h, "u")
        #expect(record.tokens.accessToken.revealed == access)
        #expect(served(h, "u") == access, "the new token is served as soon as the call returns")
        #expect(h.store.contents.records[h.key("u")]?.tokens == record.tokens, "and it is in the store")
        let event = try #require(h.events.all.last)
        #expect(event.kind == .tokenRefreshed && event.reason == "replaced")
        await h.settle()
        let oldGrant = try #require(h.provider.state.withLock { $0.grantOfToken[old.tokens.refreshToken!.revealed] })
        #expect(h.provider.state.withLock { $0.revokedGrants.contains(oldGrant) }, "the old grant is revoked")
        #expect(h.store.contents.pending.isEmpty, "and its revocation left the queue")
    }

    @Test("Should answer a plain login of a logged-in session with the old session, as before")
    func plainLoginKeeps() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        let (_, response) = h.provider.grant(lifetime: 300)
        let (record, created) = try await h.manager.login(
            LoginRequest(provider: "oauth", user: "u", tokenResponse: response), caller: ManagerHarness.alice)
        #expect(!created && record.tokens == old.tokens)
        #expect(served(h, "u") == old.tokens.accessToken.revealed)
    }

    @Test("Should keep serving the old tokens, and queue no revocation, when the replace cannot be stored")
    func replaceWriteFails() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        // The revocation is queued, the record's write fails.
        h.store.failWrites(1, after: 1)
        await #expect(throws: VaultError.self) { try await replace(h, "u") }
        #expect(served(h, "u") == old.tokens.accessToken.revealed)
        #expect(h.store.contents.records[h.key("u")]?.tokens == old.tokens)
        #expect(h.store.contents.pending.isEmpty, "the revocation was taken back")
        await h.settle()
        #expect(h.provider.state.withLock { $0.revokeCalls } == 0)
        #expect(h.events.all.allSatisfy { $0.reason != "replaced" })
    }

    @Test("Should go on with the old session, unchanged, when the replace brings tokens that cannot be used")
    func replaceRefusedBeforeTheWrite() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        let writes = h.store.writes
        // Expired already: refused before anything is written.
        let expired = LoginRequest(
            provider: "oauth", user: "u", token: "expired-" + String(repeating: "x", count: 16),
            expiresAt: h.clock.now().seconds - 1, replace: true)
        await #expect(throws: VaultError(.tokenExpired, "")) {
            _ = try await h.manager.login(expired, caller: ManagerHarness.alice)
        }
        #expect(h.store.writes == writes, "nothing was written")
        #expect(served(h, "u") == old.tokens.accessToken.revealed)
        #expect(h.manager.table.view(of: h.key("u"))?.state == .logged)
        // The session is not left mid-replace: the next replace and a logout go ahead.
        let (access, _) = try await replace(h, "u")
        #expect(served(h, "u") == access)
        try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        #expect(h.manager.table.view(of: h.key("u"))?.record == nil)
    }

    @Test(
        "Should store the tokens served now, not those read before, when a write retry waited on a revocation's removal while a refresh stored newer ones"
    )
    func retryAfterRefreshKeepsNewerTokens() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        // The revocation is queued, the new record's write fails, so does the
        // revocation's removal: the old record is written back, the revocation
        // kept back, and a write retry scheduled (the store is stale).
        h.store.failWrites(2, after: 1)
        await #expect(throws: VaultError.self) { try await replace(h, "u") }
        #expect(h.store.contents.pending.count == 1)

        // The retry comes due and waits in the revocation's removal.
        h.store.holdRevocationDeletes()
        h.clock.advance(by: Double(SessionTimers.saveRetrySeconds))
        await h.manager.runDueWork()
        await yieldUntil { h.store.heldRevocationDeletes > 0 }
        try #require(h.store.heldRevocationDeletes == 1, "the retry is waiting in the removal")

        // Meanwhile the session is refreshed: the newer tokens are stored and served.
        let refreshed = try await h.manager.refresh(h.key("u"), caller: nil)
        #expect(h.store.contents.records[h.key("u")]?.tokens == refreshed.tokens)

        // The retry goes on: it must not put the tokens it read before back.
        h.store.releaseRevocationDeletes()
        await h.settle()
        #expect(served(h, "u") == refreshed.tokens.accessToken.revealed)
        #expect(
            h.store.contents.records[h.key("u")]?.tokens == refreshed.tokens,
            "the store holds what is served (a crash now would restart with a rotated-away refresh token otherwise)")
    }

    @Test("Should refuse another uid's replace of a session with AccessDenied, changing nothing")
    func otherUIDDenied() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        let bob = Caller(uid: 1001, gid: 1001, pid: 43)
        do {
            _ = try await replace(h, "u", caller: bob, ownerUID: 1000)
            Issue.record("bob replaced alice's tokens")
        } catch {
            #expect(error.code == .accessDenied)
        }
        #expect(served(h, "u") == old.tokens.accessToken.revealed)
    }

    @Test("Should refresh once for twenty concurrent reports of the current token, then answer stale reports at once")
    func reportRejectedOnce() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        let hash = SHA256.hash(Array(old.tokens.accessToken.revealed.utf8))
        let manager = h.manager
        let key = h.key("u")
        let outcomes = await withTaskGroup(of: RejectedOutcome?.self) { group in
            for _ in 0..<20 {
                group.addTask { try? await manager.reportRejected(key, tokenHash: hash, caller: ManagerHarness.alice) }
            }
            var all: [RejectedOutcome?] = []
            for await outcome in group { all.append(outcome) }
            return all
        }
        #expect(h.provider.state.withLock { $0.refreshCalls } == 1, "one refresh for all reporters")
        #expect(outcomes.allSatisfy { $0 == .refreshed || $0 == .alreadyReplaced }, "\(outcomes)")
        #expect(outcomes.contains(.refreshed))
        #expect(served(h, "u") != old.tokens.accessToken.revealed)
        let late = try await manager.reportRejected(key, tokenHash: hash, caller: ManagerHarness.alice)
        #expect(late == .alreadyReplaced)
        #expect(h.provider.state.withLock { $0.refreshCalls } == 1)
    }

    @Test(
        "Should end a session whose provider cannot refresh as tokenInvalid, reason rejected, with a code and message")
    func reportRejectedStatic() async throws {
        let h = try ManagerHarness()
        let key = SessionKey(owner: 1000, account: Account(provider: "demo", user: "s"))
        _ = try await h.manager.login(
            LoginRequest(provider: "demo", user: "s", token: "tok_static_abcdefghijkl"), caller: ManagerHarness.alice)
        let wrong = SHA256.hash(Array("tok_other_abcdefghijkl".utf8))
        #expect(
            try await h.manager.reportRejected(key, tokenHash: wrong, caller: ManagerHarness.alice) == .alreadyReplaced)
        #expect(h.manager.table.view(of: key)?.record != nil, "a token that is not the current one ends nothing")
        let hash = SHA256.hash(Array("tok_static_abcdefghijkl".utf8))
        #expect(try await h.manager.reportRejected(key, tokenHash: hash, caller: ManagerHarness.alice) == .ended)
        #expect(h.manager.table.view(of: key)?.record == nil)
        let event = try #require(h.events.all.last)
        #expect(event.kind == .tokenInvalid && event.reason == "rejected")
        // Like a refused refresh's, the event says what happened and what to do.
        #expect(event.code == VaultError.Code.invalidCredential.seedCode)
        #expect(event.message?.contains("rejected") == true && event.message?.contains("log") == true)
        #expect(h.store.contents.records[key] == nil)
    }

    @Test("Should refuse a report from a uid that may neither read nor manage the session")
    func reportRejectedDenied() async throws {
        let h = try ManagerHarness()
        let old = try await h.login("u")
        let hash = SHA256.hash(Array(old.tokens.accessToken.revealed.utf8))
        let bob = Caller(uid: 1001, gid: 1001, pid: 43)
        do {
            _ = try await h.manager.reportRejected(h.key("u"), tokenHash: hash, caller: bob)
            Issue.record("bob's report was taken")
        } catch {
            #expect(error.code == .accessDenied)
        }
        #expect(h.provider.state.withLock { $0.refreshCalls } == 0)
    }
}
