import VaultCore

/// The store's part of a logout, as a value: the record is marked
/// logging-out with the revocation it needs, that revocation is queued,
/// and the record deleted, so that a crash at any point finishes the
/// logout at the next start and loses no revocation. Should a step fail,
/// the store is put back as it was, as far as it lets itself be.
///
/// `perform` is I/O only: it reads nothing of the manager, which decided
/// the write in one step (`beginLogout`) and takes its `Outcome` in
/// another (`SessionManager.logoutWritten`).
struct LogoutWrite: Sendable {
    /// The session as it was served when the logout began.
    var record: SessionRecord
    /// The revocation of its tokens, when its provider revokes.
    var revocation: PendingRevocation?
    /// What ended the session: the fleet's other hosts send its event.
    var ending: SessionEnding

    /// How the write ended.
    enum Outcome: Sendable {
        /// The store holds neither the record nor its mark; the revocation is queued.
        case written
        /// `error` stopped it. `restored`: the store holds the record as it
        /// was (else it must be written again); `stillQueued`: the revocation
        /// that could not be taken back out of the store.
        case failed(VaultError, restored: Bool, stillQueued: PendingRevocation?)
    }

    /// Writes the logout to `store`, the record's removal through `delete`
    /// (a fleet's host leaves the ending behind for the other hosts).
    func perform(
        on store: any SessionStore,
        delete: @Sendable (SessionKey, SessionEnding) async throws(VaultError) -> Void
    ) async -> Outcome {
        var marked = record
        marked.phase = .loggingOut
        marked.revocationID = revocation?.id
        do throws(VaultError) {
            try await store.apply(.save(marked))
            if let revocation { try await store.apply(.savePendingRevocation(revocation)) }
            try await delete(record.key, ending)
        } catch {
            // A mark left in the store would end the session at the next start.
            var stillQueued: PendingRevocation?
            if let revocation, (try? await store.apply(.deletePendingRevocation(revocation))) == nil {
                stillQueued = revocation
            }
            let restored = (try? await store.apply(.save(record))) != nil
            return .failed(error, restored: restored, stillQueued: stillQueued)
        }
        return .written
    }
}
