import Synchronization
import Varlink
import VarlinkServer
import VaultCore
import VaultProtocol

/// The subscriptions of `io.vaultd.Vault.Subscribe`: who watches what, how
/// many each user holds, and the events streamed to them. The server gives
/// the streams; the hub decides what goes on them and when a subscriber that
/// does not read is dropped. The subscriptions are touched by the serving
/// loop's thread alone (handlers answered there, and jobs handed to it);
/// the pending events and the per-uid counts are shared, under locks.
public final class SubscriptionHub: Sendable {
    /// Open subscriptions per non-root uid, past which Subscribe is refused:
    /// with the queue limit, what one user can make vaultd hold for it.
    public static let maximumPerUID = 64
    /// Unsent bytes past which a subscriber is dropped.
    static let queueLimit = 1 << 20
    /// How long a dropped subscriber's final error may take to go out. Its
    /// queued events are dropped at once (`Streams.end`), so the wait holds
    /// only the message in flight, the error and a descriptor; 5 s lost the
    /// error for a subscriber that a loaded machine kept from reading that long.
    static let dropGraceMilliseconds: UInt64 = 30_000

    /// One open subscription.
    private struct Subscription {
        var caller: Caller
        var filter: @Sendable (VaultEvent) -> Bool
    }

    /// What the serving loop holds of the hub.
    private final class LoopShare: @unchecked Sendable {
        /// Events not streamed yet, in the order they were published.
        let pending = Mutex<[VaultEvent]>([])
        /// The open subscriptions that still receive events; the loop's thread only.
        var subscriptions: [StreamID: Subscription] = [:]
    }

    private let log: Logger
    /// The server, once attached.
    private let attached = Mutex<VarlinkServer?>(nil)
    private let share = LoopShare()
    /// Open subscriptions per uid, dropped ones included until their
    /// connection closes, and those being opened (reserved by `subscribe`).
    private let perUID = Mutex<[UInt32: Int]>([:])

    /// A hub that logs dropped subscribers to `log`.
    public init(log: Logger) { self.log = log }

    /// Streams through `server` from now on; events published before have
    /// no subscriber anyway.
    public func attach(_ server: VarlinkServer) {
        attached.withLock { $0 = server }
    }

    /// Streams `event` to every subscriber whose filter passes it. Thread-safe;
    /// events reach each subscriber in the order they were published.
    public func publish(_ event: VaultEvent) {
        guard let server = attached.withLock({ $0 }) else { return }
        let first = share.pending.withLock { list in
            list.append(event)
            return list.count == 1
        }
        // One job streams everything pending when it runs.
        if first { server.onLoop { [self] streams in deliver(streams) } }
    }

    /// The outcome of a Subscribe call of `caller`: the stream, starting with
    /// `snapshot`, or `TooManySubscriptions`. On the loop's thread.
    func subscribe(
        _ caller: Caller, snapshot: VarlinkReply, filter: @escaping @Sendable (VaultEvent) -> Bool
    ) -> HandlerOutcome {
        let uid = caller.uid
        // Reserved now: the count includes streams not opened yet.
        let refused: Int? = perUID.withLock { counts in
            let open = counts[uid, default: 0]
            guard uid == 0 || open < SubscriptionHub.maximumPerUID else { return open }
            counts[uid] = open + 1
            return nil
        }
        if let open = refused {
            return .reply(
                VaultError(
                    .tooManySubscriptions,
                    "uid \(uid) already has \(open) subscriptions open, the most one user may; close one (one subscription can watch every account, narrowed by provider, user and kinds)"
                ).varlinkReply)
        }
        return .stream(
            StreamStart(
                first: snapshot,
                opened: { [self] stream in
                    share.subscriptions[stream] = Subscription(caller: caller, filter: filter)
                },
                closed: { [self] stream in
                    share.subscriptions[stream] = nil
                    perUID.withLock { counts in
                        counts[uid, default: 1] -= 1
                        if counts[uid] == 0 { counts[uid] = nil }
                    }
                }))
    }

    /// Appends each pending event, encoded once, to the subscribers that
    /// want it, and drops a subscriber whose unsent bytes pass the limit,
    /// with a final error. On the loop's thread.
    private func deliver(_ streams: VarlinkServer.Streams) {
        let events: [VaultEvent] = share.pending.withLock { list in
            let taken = list
            list.removeAll(keepingCapacity: true)
            return taken
        }
        var touched: Set<StreamID> = []
        for event in events {
            var message: [UInt8]?
            for (stream, subscription) in share.subscriptions where subscription.filter(event) {
                if message == nil {
                    message = VarlinkReply(parameters: ["event": event.json()], continues: true).encoded()
                }
                streams.push(message!, to: stream)
                touched.insert(stream)
            }
        }
        for stream in touched {
            guard let queued = streams.send(stream), queued > SubscriptionHub.queueLimit,
                let subscription = share.subscriptions.removeValue(forKey: stream)
            else { continue }
            log.warning(
                "a subscriber did not read its events and was dropped",
                ["pid": String(subscription.caller.pid), "uid": String(subscription.caller.uid)])
            streams.end(
                stream,
                with: VaultError(
                    .subscriberTooSlow,
                    "this subscriber did not read its events and was dropped; read events as they come and subscribe again"
                ).varlinkReply, within: SubscriptionHub.dropGraceMilliseconds)
        }
    }
}
