import Testing
import VaultCore

@testable import VaultDaemon

@Suite("SessionWrite: a session's writes, and their undoing")
struct SessionWriteTests {
    let record = Rows.record("oauth", "alice")
    var key: SessionKey { record.key }

    /// A logout's writes: the mark, the revocation, the delete.
    func logout() -> (SessionWrite, PendingRevocation) {
        let revocation = PendingRevocation(queueing: record)
        var marked = record
        marked.phase = .loggingOut
        marked.revocationID = revocation.id
        let write = SessionWrite(
            key: key, before: record,
            steps: [.save(marked), .queue(revocation), .delete(SessionEnding(kind: .logoutSuccess))])
        return (write, revocation)
    }

    func delete(_ store: FaultyStore) -> @Sendable (SessionKey, SessionEnding) async throws(VaultError) -> Void {
        { key, _ throws(VaultError) in try await store.apply(.delete(key)) }
    }

    @Test("Should make every step, in order, when the store takes them")
    func written() async throws {
        let store = FaultyStore(StoreSnapshot(records: [key: record]))
        let (write, revocation) = logout()
        guard case .written = await write.perform(on: store, delete: delete(store)) else {
            Issue.record("the write failed")
            return
        }
        #expect(store.contents.records[key] == nil)
        #expect(store.contents.pending[revocation.id] != nil)
        #expect(store.writes == 3)
    }

    @Test("Should take the revocation back and put the record back when a later step fails", arguments: [0, 1, 2])
    func undone(failingStep: Int) async throws {
        let store = FaultyStore(StoreSnapshot(records: [key: record]))
        let (write, revocation) = logout()
        store.failWrites(1, after: failingStep)
        guard case .failed(_, let restored, let stillQueued) = await write.perform(on: store, delete: delete(store))
        else {
            Issue.record("the write did not fail")
            return
        }
        #expect(restored)
        #expect(stillQueued == nil)
        #expect(store.contents.records[key] == record)
        #expect(store.contents.pending[revocation.id] == nil)
    }

    @Test("Should say what it could not undo")
    func notUndone() async throws {
        let store = FaultyStore(StoreSnapshot(records: [key: record]))
        let (write, revocation) = logout()
        // The delete fails, and so do both writes that would undo the others.
        store.failWrites(3, after: 2)
        guard case .failed(_, let restored, let stillQueued) = await write.perform(on: store, delete: delete(store))
        else {
            Issue.record("the write did not fail")
            return
        }
        #expect(!restored)
        #expect(stillQueued == revocation)
        #expect(store.contents.records[key]?.phase == .loggingOut)
    }

    @Test("Should remove what may have landed when there was no record before")
    func removedWhenNew() async throws {
        let store = FaultyStore()
        let write = SessionWrite(key: key, before: nil, steps: [.save(record)])
        store.failWrites(1)
        guard case .failed(_, let restored, _) = await write.perform(on: store, delete: delete(store)) else {
            Issue.record("the write did not fail")
            return
        }
        #expect(restored)
        #expect(store.contents.records[key] == nil)
        #expect(store.writes == 2)
    }
}
