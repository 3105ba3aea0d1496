import Testing
import VaultCore
import VaultDaemon

extension ManagerHarness {
    /// Waits (bounded) until background work is settled and no change of the
    /// store's availability waits to be acted on.
    func settleStore() async {
        for _ in 0..<10_000 {
            if await manager.backgroundWork == 0, !manager.storeChangePending { return }
            await Task.yield()
        }
    }

    /// The reasons of the storeChanged events of `user`, in order.
    func storeEvents(_ user: String) -> [String] {
        events.all.filter { $0.account.user == user && $0.kind == .storeChanged }.compactMap(\.reason)
    }
}

@Suite("SessionManager: the store gone, locked and back, in process", .timeLimit(.minutes(5)))
struct StoreOutageManagerTests {
    @Test(
        "Should refuse changes while the store is gone, keep refreshed tokens, and write them through when it returns")
    func goneAndBack() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        try await h.login("w")
        h.store.goDown(locked: false)

        // The provider rotated: the new tokens are served, held only in memory.
        let refreshed = try await h.manager.refresh(h.key("u"), caller: ManagerHarness.alice)
        await h.settleStore()
        #expect(h.manager.storeState == .unavailable)
        #expect(h.manager.table.view(of: h.key("u"))?.refresh?.unsaved == true)
        #expect(h.storeEvents("u") == ["unavailable"])
        #expect(h.storeEvents("w") == ["unavailable"])

        // Changes are refused without reaching the store; reads go on.
        let callsBefore = h.store.callsDuringOutage
        await #expect(throws: VaultError(.storeUnavailable, "")) { try await h.login("x") }
        await #expect(throws: VaultError(.storeUnavailable, "")) {
            try await h.manager.logout(h.key("w"), caller: ManagerHarness.alice)
        }
        #expect(h.store.callsDuringOutage == callsBefore)
        #expect(h.manager.table.view(of: h.key("w"))?.record != nil, "a refused logout forgets nothing")
        #expect(!h.kinds("w").contains(.logoutSuccess), "no logoutSuccess for a logout that did not happen")
        let served = try await h.manager.freshToken(h.key("u"), minValidSeconds: 0, caller: ManagerHarness.alice)
        #expect(served.tokens == refreshed.tokens)

        // Back: the next probe (at most StoreHealth.longestProbeSeconds away) finds it and writes through.
        h.store.comeBack()
        await h.advance(by: StoreHealth.longestProbeSeconds + 1)
        await h.settleStore()
        #expect(h.manager.storeState == .available)
        #expect(h.store.contents.records[h.key("u")]?.tokens == refreshed.tokens)
        #expect(h.manager.table.view(of: h.key("u"))?.refresh?.unsaved != true)
        #expect(h.storeEvents("u") == ["unavailable", "available"])
        try await h.login("x")
        try await h.manager.logout(h.key("w"), caller: ManagerHarness.alice)
        #expect(h.store.contents.records[h.key("w")] == nil)
    }

    @Test("Should report a locked store as locked, refuse with StoreLocked and forget no session")
    func locked() async throws {
        let h = try ManagerHarness()
        try await h.login("u")
        h.store.goDown(locked: true)
        await #expect(throws: VaultError(.storeLocked, "")) { try await h.login("x") }
        await h.settleStore()
        #expect(h.manager.storeState == .locked)
        #expect(h.storeEvents("u") == ["locked"])
        await #expect(throws: VaultError(.storeLocked, "")) {
            try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
        }
        #expect(h.manager.table.view(of: h.key("u"))?.record != nil)
        // Still locked at the next probes: no new report, still refused.
        await h.advance(by: 60)
        await h.settleStore()
        #expect(h.manager.storeState == .locked)
        #expect(h.storeEvents("u") == ["locked"])
        h.store.comeBack()
        await h.advance(by: StoreHealth.longestProbeSeconds + 1)
        await h.settleStore()
        #expect(h.manager.storeState == .available)
        try await h.manager.logout(h.key("u"), caller: ManagerHarness.alice)
    }
}
