import VaultCore

/// A change of one session that the store takes in a few writes, as a
/// value: a login's record, a replace's new tokens after the revocation of
/// the old ones, a logout's mark, revocation and delete. Should a write
/// fail, the store is put back as it was, as far as it lets itself be: the
/// revocation is taken back out, and the record written before
/// (`before`) is written again, or, where there was none, what may have
/// landed is removed.
///
/// `perform` is I/O only: it reads nothing of the manager, which decided
/// the write in one step and takes its `Outcome` in another.
struct SessionWrite: Sendable {
    /// One write.
    enum Step: Sendable {
        case save(SessionRecord)
        /// A revocation queued in the store: it must be there before the
        /// provider is asked, and before the store forgets the tokens.
        case queue(PendingRevocation)
        /// The record's removal; a fleet's host leaves the ending behind
        /// for the other hosts (`StoreSharing.deleteRecord`).
        case delete(SessionEnding)
    }

    /// How the write ended.
    enum Outcome: Sendable {
        /// Every step is in the store.
        case written
        /// `error` stopped it. `restored`: the store holds what it held
        /// before (else it must be written again); `stillQueued`: the
        /// revocation that could not be taken back out.
        case failed(VaultError, restored: Bool, stillQueued: PendingRevocation?)
    }

    /// The session written.
    var key: SessionKey
    /// Its record in the store before, put back should a step fail; nil:
    /// there was none, and what may have landed is removed.
    var before: SessionRecord?
    /// The writes, in order.
    var steps: [Step]

    /// The revocation the steps queue, if any.
    var revocation: PendingRevocation? {
        for case .queue(let revocation) in steps { return revocation }
        return nil
    }

    /// Writes the steps to `store`, a removal through `delete`.
    func perform(
        on store: any SessionStore,
        delete: @Sendable (SessionKey, SessionEnding) async throws(VaultError) -> Void
    ) async -> Outcome {
        do throws(VaultError) {
            for step in steps {
                switch step {
                case .save(let record): try await store.apply(.save(record))
                case .queue(let revocation): try await store.apply(.savePendingRevocation(revocation))
                case .delete(let ending): try await delete(key, ending)
                }
            }
        } catch {
            // A write abandoned at its timeout may still land: each is undone.
            var stillQueued: PendingRevocation?
            if let revocation, (try? await store.apply(.deletePendingRevocation(revocation))) == nil {
                stillQueued = revocation
            }
            let restored: Bool
            if let before {
                restored = (try? await store.apply(.save(before))) != nil
            } else {
                restored = (try? await store.apply(.delete(key))) != nil
            }
            return .failed(error, restored: restored, stillQueued: stillQueued)
        }
        return .written
    }
}
