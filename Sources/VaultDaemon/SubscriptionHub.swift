import Synchronization
import VarlinkServer
import VaultCore
import VaultProtocol

/// The subscriptions of `io.vaultd.Vault.Subscribe`: who watches what, how
/// many each user holds, and the events streamed to them. The server gives
/// the streams; the hub decides what goes on them and when a subscriber that
/// does not read is dropped. Apart from `publish` and `attach`, every method
/// runs on the server's loop thread (handlers answered there, and jobs
/// handed to it), so the hub's tables need no lock.
public final class SubscriptionHub: @unchecked Sendable {
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

    private let log: Logger
    private let server = Mutex<VarlinkServer?>(nil)
    /// Events not streamed yet, in the order they were published.
    private let pending = Mutex<[VaultEvent]>([])
    /// Open subscriptions that still receive events; loop thread only.
    private var subscriptions: [StreamID: Subscription] = [:]
    /// Open subscriptions per uid, dropped ones included until their connection closes.
    private var perUID: [UInt32: Int] = [:]

    /// A hub that logs dropped subscribers to `log`.
    public init(log: Logger) { self.log = log }

    /// Streams through `server` from now on; events published before have
    /// no subscriber anyway.
    public func attach(_ server: VarlinkServer) { self.server.withLock { $0 = server } }

    /// Streams `event` to every subscriber whose filter passes it. Thread-safe;
    /// events reach each subscriber in the order they were published.
    public func publish(_ event: VaultEvent) {
        guard let server = server.withLock({ $0 }) else { return }
        let first = pending.withLock { list in
            list.append(event)
            return list.count == 1
        }
        // One job streams everything pending when it runs.
        if first { server.onLoop { [self] streams in deliver(streams) } }
    }

    /// The outcome of a Subscribe call of `caller`: the stream, starting with
    /// `snapshot`, or `TooManySubscriptions`. Loop thread.
    func subscribe(
        _ caller: Caller, snapshot: VarlinkReply, filter: @escaping @Sendable (VaultEvent) -> Bool
    ) -> HandlerOutcome {
        let uid = caller.uid
        let open = perUID[uid, default: 0]
        guard uid == 0 || open < SubscriptionHub.maximumPerUID else {
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
                    perUID[uid, default: 0] += 1
                    subscriptions[stream] = Subscription(caller: caller, filter: filter)
                },
                closed: { [self] stream in
                    subscriptions[stream] = nil
                    perUID[uid, default: 1] -= 1
                    if perUID[uid] == 0 { perUID[uid] = nil }
                }))
    }

    /// Appends each pending event, encoded once, to the subscribers that want
    /// it, and drops a subscriber whose unsent bytes pass the limit, with a
    /// final error. Loop thread.
    private func deliver(_ streams: VarlinkServer.Streams) {
        let events: [VaultEvent] = pending.withLock { list in
            let taken = list
            list.removeAll(keepingCapacity: true)
            return taken
        }
        var touched: Set<StreamID> = []
        for event in events {
            var message: [UInt8]?
            for (stream, subscription) in subscriptions where subscription.filter(event) {
                if message == nil {
                    message = VarlinkReply(parameters: ["event": event.json()], continues: true).encoded()
                }
                streams.push(message!, to: stream)
                touched.insert(stream)
            }
        }
        for stream in touched {
            guard let queued = streams.send(stream), queued > SubscriptionHub.queueLimit,
                let subscription = subscriptions.removeValue(forKey: stream)
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
