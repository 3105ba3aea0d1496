import Testing
import VaultCore

/// SessionRecord is a value, even though its copies share their storage.
@Suite("SessionRecord copies", .timeLimit(.minutes(5)))
struct SessionRecordCopyTests {
    @Test("Should leave a copy untouched when the original changes, field by field and nested")
    func copiesAreIndependent() {
        let original = Fixtures.fullRecord()
        var changed = original
        #expect(changed == original)
        changed.tokens.accessToken = Secret("tok_new_value_abcdefghijklmn")
        changed.expiresAt = nil
        changed.phase = .loggingOut
        changed.user.name = "Someone Else"
        #expect(original.tokens.accessToken.revealed == "00Dxx0000001gPL!AQ4AQFhz_access")
        #expect(original.expiresAt == UnixTime(seconds: 1_700_007_200))
        #expect(original.phase == .active)
        #expect(original.user.name == "Alice Liddell")
        #expect(changed.tokens.accessToken.revealed == "tok_new_value_abcdefghijklmn")
        #expect(changed.phase == .loggingOut)
        #expect(changed != original)
    }

    @Test("Should compare by content, whether or not two records share storage")
    func equalityByContent() {
        // Separate storage, same content.
        #expect(Fixtures.fullRecord() == Fixtures.fullRecord())
        #expect(Fixtures.record(owner: 1) != Fixtures.record(owner: 2))
        // Shared storage until one copy changes; set back, equal again.
        let original = Fixtures.record(owner: 1)
        let shared = original
        var changed = original
        changed.ownerUID = 2
        #expect(shared == original)
        #expect(changed != shared)
        #expect(shared.ownerUID == 1)
        changed.ownerUID = 1
        #expect(changed == original)
    }
}
