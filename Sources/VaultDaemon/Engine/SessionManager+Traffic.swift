import VaultCore
import VaultSystem

/// What the session manager keeps to bound the requests it sends a provider:
/// each user's `ProviderBudget`, and the queued revocations (`RevocationQueue`
/// decides which goes next and when; the revocations themselves are here).
struct ProviderTraffic {
    /// A revocation waiting in the queue, with the provider that takes it
    /// and the uid its request is charged to (nil: nobody's budget).
    struct Queued {
        var revocation: PendingRevocation
        var provider: any TokenProvider
        var chargedTo: UInt32?
    }

    var budget: ProviderBudget
    var queue = RevocationQueue()
    var queued: [String: Queued] = [:]
    /// The background work sending the queued revocations, one at a time.
    var worker: UInt64?
    /// When the next revocation may go, while no worker sends: a deadline of
    /// the manager's alarm, which starts the worker (`runDueWork`).
    var wakeAt: Double?
}

/// What a step of the manager leaves for the store once it made its
/// change of state: performed in order by `perform(_:)`, after the step,
/// so that the step itself waits for nothing.
enum StoreEffect {
    /// Queue `revocation` in the store (a store that cannot take it is
    /// logged as `event`, naming `what`), then start it, charged to
    /// `chargedTo`'s budget.
    case queueRevocation(
        PendingRevocation, provider: any TokenProvider, chargedTo: UInt32?, event: String, what: String)
    /// Write `record` again, as the store held it before a write that
    /// turned out to belong to no session (best effort).
    case restore(SessionRecord)
}

/// Bounding the provider requests local users can cause (see issue 28):
/// each uid's requests come out of its `ProviderBudget`, and revocations go
/// out one at a time from one queue, paced and backed off.
extension SessionManager {
    /// The uid whose budget a request `principal` causes on `owner`'s session
    /// is charged to: the caller's, unless it is root or an admin; for
    /// vaultd's own requests (a revocation at an expiry), the owner's unless
    /// that is root. Nil: not limited.
    func chargedUID(_ principal: Principal, owner: UInt32) -> UInt32? {
        guard let caller = principal.caller else { return owner == 0 ? nil : owner }
        return policy.policy.isAdmin(caller) ? nil : caller.uid
    }

    /// Takes one request from `uid`'s budget, or throws the refusal naming
    /// `what` and when to try again.
    func chargeProviderRequest(_ uid: UInt32?, _ what: String) throws(VaultError) {
        guard let uid, let retryAt = traffic.budget.take(uid, now: clock.preciseNow()) else { return }
        throw traffic.budget.refusal(what, retryAt: retryAt)
    }

    /// Why `owner` may not log in a new session (or replace tokens, which
    /// queues the old ones' revocation): its revocations still queued count
    /// with its sessions (`RevocationQueue.refusal`).
    func revocationRefusal(owner: UInt32) -> VaultError? {
        traffic.queue.refusal(owner: owner, sessions: table.sessionCount(of: owner), limits: config.limits)
    }

    /// Queues `revocation` (already in the store) for the provider, charged
    /// to `chargedTo`'s budget when its request goes out, and wakes the worker.
    func startRevocation(_ revocation: PendingRevocation, provider: any TokenProvider, chargedTo: UInt32?) {
        guard !stopping else { return }
        let owner = revocation.record.ownerUID
        traffic.queued[revocation.id] = ProviderTraffic.Queued(
            revocation: revocation, provider: provider, chargedTo: chargedTo)
        // Its size as stored; the document holds the tokens, so it is wiped.
        var document = revocation.record.storedJSON().serialized()
        traffic.queue.add(revocation.id, owner: owner, bytes: document.count, now: clock.preciseNow())
        document.wipe()
        // A worker sending now takes it in turn; else one starts now, not at
        // a later one's time.
        if traffic.worker == nil { startRevocationWorker() }
    }

    /// Starts the background work that sends the queued revocations (in
    /// shutdown's grace too, `evenWhenStopping`).
    func startRevocationWorker(evenWhenStopping: Bool = false) {
        traffic.wakeAt = nil
        traffic.worker = spawn(evenWhenStopping: evenWhenStopping) { await self.sendRevocations() }
    }

    /// Queues `revocation` in the store, then starts it, charged as a request
    /// of `principal` on its owner's session. A store that cannot take it is
    /// logged (`event`, naming `what` could not be queued), and the revocation
    /// is attempted all the same.
    func queueRevocation(
        _ revocation: PendingRevocation, provider: any TokenProvider, by principal: Principal = .vaultd,
        event: String, what: String = "a revocation"
    ) async {
        await perform([
            .queueRevocation(
                revocation, provider: provider, chargedTo: chargedUID(principal, owner: revocation.record.ownerUID),
                event: event, what: what)
        ])
    }

    /// Performs, in order, what steps left for the store (`StoreEffect`).
    func perform(_ effects: [StoreEffect]) async {
        for effect in effects {
            switch effect {
            case .queueRevocation(let revocation, let provider, let chargedTo, let event, let what):
                do throws(VaultError) {
                    try await store.apply(.savePendingRevocation(revocation))
                } catch {
                    log.warning(
                        "\(what) could not be queued in the store; it is attempted all the same",
                        fields(revocation.record.key, event: event, code: error.code))
                }
                startRevocation(revocation, provider: provider, chargedTo: chargedTo)
            case .restore(let record):
                try? await store.apply(.save(record))
            }
        }
    }

    /// `startRevocation` charged to the owner (vaultd's own, or restored at start).
    func startRevocation(_ revocation: PendingRevocation, provider: any TokenProvider) {
        startRevocation(
            revocation, provider: provider, chargedTo: chargedUID(.vaultd, owner: revocation.record.ownerUID))
    }

    /// Sends the queued revocations, one at a time, each when the queue says
    /// (`RevocationQueue.next`) and its uid's budget allows, until the queue
    /// is empty, the next is not due yet (the alarm starts the worker again
    /// then), or the worker is cancelled (vaultd is stopping: every
    /// revocation is in the store already).
    func sendRevocations() async {
        let me = traffic.worker
        // Bounded by the queue: every pass sends or postpones one, or ends.
        while !Task.isCancelled, let (id, at) = traffic.queue.next() {
            if at > clock.preciseNow() {
                traffic.wakeAt = at
                rearmTimer()
                break
            }
            guard let item = traffic.queued[id] else {
                traffic.queue.remove(id)
                continue
            }
            let now = clock.preciseNow()
            if let uid = item.chargedTo, let retryAt = traffic.budget.take(uid, now: now) {
                traffic.queue.postpone(id, until: retryAt)
                continue
            }
            traffic.queue.sent(id, now: now)
            if await Revocations.attempt(item.revocation, provider: item.provider, store: store, log: log) {
                traffic.queue.remove(id)
                traffic.queued[id] = nil
            } else {
                traffic.queue.failed(id, random: random(), now: clock.preciseNow())
                let entry = traffic.queue[id]
                if entry?.failures == 1 || (entry?.failures ?? 0) % 10 == 0 {
                    var logFields = fields(item.revocation.record.key, event: "revokeFailed")
                    logFields["failures"] = String(entry?.failures ?? 0)
                    logFields["queued"] = String(traffic.queue.count)
                    log.warning("the provider did not take a revocation; it stays queued and is retried", logFields)
                }
            }
        }
        if traffic.worker == me { traffic.worker = nil }
    }
}
