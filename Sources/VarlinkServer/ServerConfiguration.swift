import Varlink

/// What the serving loop tells the rest of the program, and asks of it.
public struct ServerHooks: Sendable {
    /// How often to prove liveness to the watchdog, in milliseconds; nil for never.
    public var watchdogIntervalMilliseconds: Int?
    /// Must return promptly when the program is healthy.
    public var watchdogProbe: @Sendable () async -> Void
    /// Called on the loop's thread after a probe returned.
    public var watchdog: @Sendable () -> Void
    /// Called on the loop's thread when SIGTERM or SIGINT arrives.
    public var stopping: @Sendable () -> Void
    /// Called on the loop's thread when SIGHUP arrives, with the server, so that
    /// the reload can hand it new limits (`VarlinkServer.reload`).
    public var reload: @Sendable (VarlinkServer) -> Void
    /// Whether a caller other than root may use the connections kept for
    /// privileged peers.
    public var privileged: @Sendable (Caller) -> Bool
    /// Work of the program's own that runs on the loop's thread: when
    /// `wakeFD` (an eventfd, or an epoll set of its own) becomes readable,
    /// the loop calls `run`.
    public var ownWork: (wakeFD: Int32, run: @Sendable () -> Void)?

    /// Hooks that do nothing.
    public init(
        watchdogIntervalMilliseconds: Int? = nil, watchdogProbe: @escaping @Sendable () async -> Void = {},
        watchdog: @escaping @Sendable () -> Void = {}, stopping: @escaping @Sendable () -> Void = {},
        reload: @escaping @Sendable (VarlinkServer) -> Void = { _ in },
        privileged: @escaping @Sendable (Caller) -> Bool = { _ in false },
        ownWork: (wakeFD: Int32, run: @Sendable () -> Void)? = nil
    ) {
        self.watchdogIntervalMilliseconds = watchdogIntervalMilliseconds
        self.watchdogProbe = watchdogProbe
        self.watchdog = watchdog
        self.stopping = stopping
        self.reload = reload
        self.privileged = privileged
        self.ownWork = ownWork
    }
}

/// The error replies the transport sends on its own, given by the service:
/// the server decides when, the service names the error and its parameters.
public struct TransportErrors: Sendable {
    /// The only reply of a connection the limits refuse (`ServingLimits.admission`).
    public var refused:
        @Sendable (_ admission: ServingLimits.Admission, _ caller: Caller, _ limits: ServingLimits) -> VarlinkReply
    /// Sent in place of a reply of `bytes` bytes to `method` that would take a
    /// connection's queued output past `limit`.
    public var replyTooLarge: @Sendable (_ method: String, _ bytes: Int, _ limit: Int) -> VarlinkReply
    /// Sent in place of an answer to a call of `bytes` bytes to `method`,
    /// whose calls may be at most `limit` bytes (`VarlinkService.callSizeLimit(of:)`).
    public var callTooLarge: @Sendable (_ method: String, _ bytes: Int, _ limit: Int) -> VarlinkReply
    /// The answer to a call read while the server drains.
    public var stopping: VarlinkReply
    /// The last reply of every stream when the server starts to drain.
    public var streamStopping: VarlinkReply
    /// The last reply on a connection that sent something that is no call
    /// (`problem` says what, and that the connection closes): a message past
    /// `VarlinkServer.maximumMessageSize`, or one that is not JSON.
    public var malformedMessage: @Sendable (_ problem: String) -> VarlinkReply

    /// Errors with the given names and parameters.
    public init(
        refused: @escaping @Sendable (ServingLimits.Admission, Caller, ServingLimits) -> VarlinkReply,
        replyTooLarge: @escaping @Sendable (String, Int, Int) -> VarlinkReply,
        callTooLarge: @escaping @Sendable (String, Int, Int) -> VarlinkReply,
        stopping: VarlinkReply, streamStopping: VarlinkReply,
        malformedMessage: @escaping @Sendable (String) -> VarlinkReply = { _ in
            VarlinkServiceError.invalidParameter("")
        }
    ) {
        self.refused = refused
        self.replyTooLarge = replyTooLarge
        self.callTooLarge = callTooLarge
        self.stopping = stopping
        self.streamStopping = streamStopping
        self.malformedMessage = malformedMessage
    }
}

/// Where the server writes its log lines.
public protocol ServerLog: Sendable {
    /// Something failed.
    func error(_ message: String, _ fields: [String: String])
    /// Something was refused or went wrong for one peer.
    func warning(_ message: String, _ fields: [String: String])
    /// A normal but significant step (stopping).
    func notice(_ message: String, _ fields: [String: String])
    /// Routine information.
    func info(_ message: String, _ fields: [String: String])
    /// Detail for debugging.
    func debug(_ message: String, _ fields: [String: String])
}

/// A stream on the server: the connection it runs on. Streams are written
/// to on the loop's thread only, through the `VarlinkServer.Streams` of a job
/// handed to the loop (`VarlinkServer.onLoop(_:)`).
public struct StreamID: Hashable, Sendable {
    let connection: UInt64
}

/// How a handler starts a stream (a call with `more` answered by replies
/// that continue until the connection goes away).
public struct StreamStart: Sendable {
    /// The first reply; it is sent with `continues`.
    public var first: VarlinkReply
    /// Called on the loop's thread once the first reply is queued:
    /// from now on the stream may be written to.
    public var opened: @Sendable (StreamID) -> Void
    /// Called on the loop's thread when the stream's connection is
    /// closed, or, without `opened` before it, when the stream never started
    /// (its first reply was over the connection's output bound): once for
    /// every start handed to the server.
    public var closed: @Sendable (StreamID) -> Void

    /// A stream that begins with `first`.
    public init(
        first: VarlinkReply, opened: @escaping @Sendable (StreamID) -> Void,
        closed: @escaping @Sendable (StreamID) -> Void
    ) {
        self.first = first
        self.opened = opened
        self.closed = closed
    }
}

extension ServerLog {
    func error(_ message: String) { error(message, [:]) }
    func warning(_ message: String) { warning(message, [:]) }
    func info(_ message: String) { info(message, [:]) }
}
