import Testing
import VaultCore

@testable import VaultDaemon

/// An entry keeps its work in flight out of line; it must still behave as a value.
@Suite("AccountEntry", .timeLimit(.minutes(5)))
struct AccountEntryTests {
    static func entry() -> AccountEntry {
        AccountEntry(id: 1, machine: AccountStateMachine(account: Account(provider: "p", user: "u")))
    }

    @Test("Should keep a copy's work in flight apart from the original's")
    func copiesAreIndependent() {
        var original = Self.entry()
        original.endCause = EndCause(VaultError(.grantRevoked, "a"))
        var copy = original
        copy.endCause = EndCause(VaultError(.invalidClient, "b"))
        copy.replacedAwaitingSave = []
        #expect(original.endCause?.code == .grantRevoked)
        #expect(copy.endCause?.code == .invalidClient)
        copy.endCause = nil
        #expect(original.endCause?.code == .grantRevoked)
        #expect(copy.endCause == nil)
    }

    @Test("Should hold nothing out of line once its work is done")
    func emptiesWhenDone() {
        var entry = Self.entry()
        #expect(entry.login == nil && entry.endCause == nil && entry.replacedAwaitingSave.isEmpty)
        entry.endCause = EndCause(VaultError(.grantRevoked, "a"))
        entry.endCause = nil
        #expect(entry.endCause == nil)
        // 272 since RefreshStatus.lastAttemptAt (a failed refresh counts toward
        // MinRefreshInterval=); 288 since the provider's code and words of the last
        // failure (one pointer each in the refresh status and the login backoff).
        #expect(MemoryLayout<AccountEntry>.size <= 288)
    }
}
