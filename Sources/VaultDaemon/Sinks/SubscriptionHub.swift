import Synchronization
import Varlink
import VarlinkServer
import VaultCore
import VaultProtocol

/// The subscriptions of `io.vaultd.Vault.Subscribe`: who watches what, how
/// many each user holds, and the events streamed to them. The server gives
/// the streams; the hub decides what goes on them and when a subscriber that
/// does not read is dropped. Each serving loop's subscriptions and pending
/// events are its own (`LoopShare`), touched by that loop's thread alone
/// (handlers answered there, and jobs handed to it); only the per-uid counts
/// are shared, under a lock.
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

    /// An event on its way to the loops, encoded by the first that needs it.
    private final class Published: Sendable {
        let event: VaultEvent
        private let encoded = Mutex<[UInt8]?>(nil)

        init(_ event: VaultEvent) { self.event = event }

        /// The event's stream message (without its NUL), encoded once for all loops.
        var message: [UInt8] {
            encoded.withLock { message in
                if let message { return message }
                let made = VarlinkReply(parameters: ["event": event.json()], continues: true).encoded()
                message = made
                return made
            }
        }
    }

    /// What one serving loop holds of the hub.
    private final class LoopShare: @unchecked Sendable {
        /// Events not streamed on this loop yet, in the order they were published.
        let pending = Mutex<[Published]>([])
        /// This loop's open subscriptions that still receive events; its thread only.
        var subscriptions: [StreamID: Subscription] = [:]
    }

    private let log: Logger
    /// The server and a share per loop, once attached.
    private let attached = Mutex<(server: VarlinkServer, loops: [LoopShare])?>(nil)
    /// Open subscriptions per uid, dropped ones included until their
    /// connection closes, and those being opened (reserved by `subscribe`).
    private let perUID = Mutex<[UInt32: Int]>([:])

    /// A hub that logs dropped subscribers to `log`.
    public init(log: Logger) { self.log = log }

    /// Streams through `server` from now on; events published before have
    /// no subscriber anyway.
    public func attach(_ server: VarlinkServer) {
        let loops = (0..<server.loopCount).map { _ in LoopShare() }
        attached.withLock { $0 = (server, loops) }
    }

    /// The share of `loop`.
    private func share(_ loop: Int) -> LoopShare? {
        attached.withLock { $0?.loops[loop] }
    }

    /// Streams `event` to every subscriber whose filter passes it. Thread-safe;
    /// events reach each subscriber in the order they were published.
    public func publish(_ event: VaultEvent) {
        guard let (server, loops) = attached.withLock({ $0 }) else { return }
        let published = Published(event)
        // A loop that no longer serves has no subscriber left, and would never deliver.
        for (index, share) in loops.enumerated() where server.isServing(index) {
            let first = share.pending.withLock { list in
                list.append(published)
                return list.count == 1
            }
            // One job per loop streams everything pending there when it runs.
            if first { server.onLoop(index) { [self] streams in deliver(streams, share) } }
        }
    }

    /// The outcome of a Subscribe call of `caller`: the stream, starting with
    /// `snapshot`, or `TooManySubscriptions`. On the caller's loop thread.
    func subscribe(
        _ caller: Caller, snapshot: VarlinkReply, filter: @escaping @Sendable (VaultEvent) -> Bool
    ) -> HandlerOutcome {
        let uid = caller.uid
        // Reserved now, so that two loops cannot both open the last one.
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
                    share(stream.loop)?.subscriptions[stream] = Subscription(caller: caller, filter: filter)
                },
                closed: { [self] stream in
                    share(stream.loop)?.subscriptions[stream] = nil
                    perUID.withLock { counts in
                        counts[uid, default: 1] -= 1
                        if counts[uid] == 0 { counts[uid] = nil }
                    }
                }))
    }

    /// Appends each event pending on `share`'s loop, encoded once for all
    /// loops, to the loop's subscribers that want it, and drops a subscriber
    /// whose unsent bytes pass the limit, with a final error. On that loop's thread.
    private func deliver(_ streams: VarlinkServer.Streams, _ share: LoopShare) {
        let events: [Published] = share.pending.withLock { list in
            let taken = list
            list.removeAll(keepingCapacity: true)
            return taken
        }
        var touched: Set<StreamID> = []
        for published in events {
            var message: [UInt8]?
            for (stream, subscription) in share.subscriptions where subscription.filter(published.event) {
                if message == nil { message = published.message }
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
