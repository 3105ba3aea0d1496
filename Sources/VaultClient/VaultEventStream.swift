import Glibc
import Varlink
import VaultCore
import VaultProtocol
import VaultSystem

/// A `Subscribe` stream: the snapshot of the sessions, then one `VaultEvent`
/// per `next()` until the stream ends. It ends when vaultd closes the
/// connection or ends the stream with an error (`SubscriberTooSlow` when this
/// reader fell behind); `end` says which. Reads are bounded by the
/// connection's receive timeout, if it has one. A stream subscribed with a
/// `ReconnectPolicy` connects again instead of ending (see
/// `VaultConnection.subscribe(provider:user:kinds:reconnect:)`).
public final class VaultEventStream {
    /// Why a stream ended.
    public enum End: Sendable, Equatable, CustomStringConvertible {
        /// vaultd closed the connection (it stopped, or dropped the subscriber).
        case closed
        /// vaultd ended the stream with this error: `SubscriberTooSlow`, or
        /// vaultd stopping.
        case error(VarlinkErrorReply)
        /// vaultd sent a last reply that does not continue the stream.
        case finished

        /// Why, as a sentence: an error's message and code.
        public var description: String {
            switch self {
            case .closed: return "vaultd closed the connection"
            case .error(let reply): return reply.description
            case .finished: return "vaultd ended the stream"
            }
        }
    }

    /// How this stream connects again, when it does.
    struct Reconnection {
        var schedule: ReconnectSchedule
        let connect: () throws(VaultClientError) -> VarlinkClient

        init(policy: ReconnectPolicy, connect: @escaping () throws(VaultClientError) -> VarlinkClient) {
            schedule = ReconnectSchedule(policy: policy)
            self.connect = connect
        }
    }

    /// The connection the stream holds (a new one after each reconnection).
    public private(set) var raw: VarlinkClient
    /// The sessions the caller could see when the stream started, or when it
    /// last subscribed again after a reconnection.
    public private(set) var snapshot: [Session]
    /// Why the stream ended; nil while it goes on.
    public private(set) var end: End?
    /// How many times the stream connected and subscribed again.
    public private(set) var reconnections = 0
    /// Called as the connection is lost, with why, before the stream
    /// connects again (reconnecting streams only).
    public var onDisconnect: ((_ why: String) -> Void)?
    /// Called after the stream subscribed again, with the new snapshot,
    /// before the events that follow it (reconnecting streams only).
    public var onReconnect: ((_ snapshot: [Session]) -> Void)?
    var reconnection: Reconnection?
    private let filters: [String: JSON]
    /// The receive timeout set through `setReceiveTimeout`, for connections made later.
    private var receiveTimeoutSeconds: Int?

    /// Sends `Subscribe` on `client` and reads the snapshot; a refusal
    /// (`TooManySubscriptions`, a bad filter) throws.
    public init(_ client: VarlinkClient, provider: String? = nil, user: String? = nil, kinds: [EventKind] = [])
        throws(VaultClientError)
    {
        raw = client
        var parameters: [String: JSON] = [:]
        parameters["provider"] = provider.map(JSON.string)
        parameters["user"] = user.map(JSON.string)
        if !kinds.isEmpty { parameters["kinds"] = .array(kinds.map { .string($0.rawValue) }) }
        filters = parameters
        let (sessions, continues) = try Self.subscribe(client, parameters)
        snapshot = sessions
        if !continues { end = .finished }
    }

    /// Sends `Subscribe` and reads the first reply: the snapshot, and whether events follow.
    private static func subscribe(_ client: VarlinkClient, _ parameters: [String: JSON]) throws(VaultClientError)
        -> (sessions: [Session], continues: Bool)
    {
        let reply: VarlinkReply
        do { reply = try client.call(VaultMethod.subscribe.rawValue, parameters, more: true) } catch {
            throw .client(error)
        }
        if let error = VarlinkErrorReply(reply) { throw .reply(error) }
        guard let list = reply.parameters["sessions"]?.arrayValue else {
            throw .unexpectedReply(method: VaultMethod.subscribe.rawValue, detail: "a first reply without sessions")
        }
        var sessions: [Session] = []
        for json in list { sessions.append(try VaultConnection.session(json, of: .subscribe)) }
        return (sessions, reply.continues)
    }

    /// Changes how long a read waits (0: without limit), on this connection
    /// and on those a reconnection makes.
    public func setReceiveTimeout(seconds: Int) {
        receiveTimeoutSeconds = seconds
        raw.setReceiveTimeout(seconds: seconds)
    }

    /// The next event, waiting for it; nil once the stream has ended (see
    /// `end`). Events of kinds this client does not know are skipped. A
    /// reconnecting stream waits through a restart of vaultd here, and throws
    /// only when subscribing again fails in a way another attempt would not
    /// mend, or when a read times out.
    public func next() throws(VaultClientError) -> VaultEvent? {
        // Bounded by the connection: each turn reads one reply, or reconnects
        // (bounded by the policy's attempts, or by the reader's patience).
        while true {
            while end == nil {
                let reply: VarlinkReply?
                do { reply = try raw.nextReply() } catch {
                    if case .timedOut = error { throw .client(error) }
                    guard reconnection != nil else { throw .client(error) }
                    end = .closed
                    if try reconnect(why: error.description) { continue }
                    return nil
                }
                guard let reply else {
                    end = .closed
                    break
                }
                if let error = VarlinkErrorReply(reply) {
                    end = .error(error)
                    break
                }
                if !reply.continues { end = .finished }
                guard let json = reply.parameters["event"], json != .null else { continue }
                if let event = try VaultEventStream.event(json) { return event }
            }
            guard reconnection != nil, let why = end, why != .finished else { return nil }
            guard try reconnect(why: why.description) else { return nil }
        }
    }

    /// Connects and subscribes again on the policy's schedule, until it
    /// works (true), fails for good (throws), or the policy gives up (false);
    /// after either of the last two the stream stays ended (`end`).
    private func reconnect(why: String) throws(VaultClientError) -> Bool {
        guard var reconnection else { return false }
        // Given up unless it worked; put back below when it did.
        self.reconnection = nil
        onDisconnect?(why)
        shutdown(raw.fileDescriptor, Int32(SHUT_RDWR))
        reconnection.schedule.lost(now: ReconnectSchedule.now())
        // Bounded by the policy's maxAttempts, or kept up for as long as the reader waits.
        while reconnection.schedule.nextAttemptAt != nil {
            let wait = reconnection.schedule.waitMilliseconds(now: ReconnectSchedule.now())
            if wait > 0 { _ = poll(nil, 0, wait) }
            guard reconnection.schedule.isDue(now: ReconnectSchedule.now()) else { continue }
            do {
                let client = try reconnection.connect()
                // The subscription itself is bounded by the connection's timeout, as the first was.
                let (sessions, continues) = try Self.subscribe(client, filters)
                if let receiveTimeoutSeconds { client.setReceiveTimeout(seconds: receiveTimeoutSeconds) }
                raw = client
                snapshot = sessions
                end = continues ? nil : .finished
                reconnections += 1
                reconnection.schedule.connected()
                self.reconnection = reconnection
                onReconnect?(sessions)
                return true
            } catch {
                guard ReconnectPolicy.isWorthRetrying(error) else {
                    if case .reply(let reply) = error { end = .error(reply) }
                    throw error
                }
                reconnection.schedule.failed(now: ReconnectSchedule.now())
            }
        }
        return false
    }

    /// Reads an event object; nil for a kind this client does not know.
    static func event(_ json: JSON) throws(VaultClientError) -> VaultEvent? {
        guard let o = json.objectValue else {
            throw .unexpectedReply(method: VaultMethod.subscribe.rawValue, detail: "an event that is not an object")
        }
        let p = ParameterReader(o)
        do throws(ParameterReader.Invalid) {
            guard let kind = EventKind(rawValue: try p.string("kind")) else { return nil }
            guard let owner = try p.optionalUID("ownerUid"), let time = try p.optionalInt("time") else {
                throw ParameterReader.Invalid(parameter: "ownerUid or time")
            }
            return VaultEvent(
                kind: kind, account: Account(provider: try p.string("provider"), user: try p.string("user")),
                ownerUID: owner, time: UnixTime(seconds: time), reason: try p.optionalString("reason"),
                code: try p.optionalString("code"),
                expiresAt: try p.optionalInt("expiresAt").map(UnixTime.init(seconds:)),
                message: try p.optionalString("message"),
                source: try p.optionalString("source").flatMap(ConnectionSource.init(rawValue:)),
                client: try p.optionalString("client"), providerCode: try p.optionalString("providerCode"),
                providerMessage: try p.optionalString("providerMessage"))
        } catch {
            throw .unexpectedReply(
                method: VaultMethod.subscribe.rawValue, detail: "an event with a bad '\(error.parameter)'")
        }
    }
}
