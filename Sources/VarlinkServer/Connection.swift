import Glibc
import Varlink
import VaultSystem

/// One client connection; touched only by the loop's thread.
///
/// Its mutable state is marked `@exclusivity(unchecked)`: it is touched by
/// the loop thread alone and never through overlapping accesses, and the
/// runtime's dynamic exclusivity checks on class properties cost about a
/// tenth of vaultd's own instructions per GetToken.
final class Connection {
    /// Where a connection is in its life. A plain value (no references), so
    /// that the checks made on every call cost no reference counting.
    enum State {
        /// Reading calls and answering them in order.
        case open
        /// A deferred call is in flight; calls behind it wait.
        case waiting
        /// A stream runs; `streamClosed` is told when the connection goes away.
        case streaming
        /// The stream was ended with a final reply, which is being sent; the
        /// connection closes once it is out, or at `deadline`.
        case ending(deadline: UInt64)
        /// The peer sent something that is no call; its error reply is being
        /// sent. Once it is out, the write side is shut (the peer reads the
        /// error, then an end of file) and what the peer still sends is read
        /// and dropped until it closes or `deadline`: closing with its bytes
        /// unread would reach it as a reset, before it read the error.
        case lingering(deadline: UInt64)
        /// Closed; nothing more happens.
        case closed
    }

    let id: UInt64
    let fd: Int32
    let caller: Caller
    @exclusivity(unchecked) var state: State = .open
    /// Told when the connection of a stream (streaming or ending) is closed.
    @exclusivity(unchecked) var streamClosed: (@Sendable (StreamID) -> Void)?
    @exclusivity(unchecked) var decoder: VarlinkFrameDecoder
    @exclusivity(unchecked) var output: [UInt8] = []
    @exclusivity(unchecked) var outputOffset = 0
    /// The peer sent end-of-file: it sends nothing more (it may still read).
    @exclusivity(unchecked) var peerClosedInput = false
    /// The caller is root or privileged: it may use the reserved connections.
    @exclusivity(unchecked) var privileged = false
    /// When bytes last went either way (monotonic milliseconds).
    @exclusivity(unchecked) var lastActivity: UInt64 = 0
    /// When the unfinished message buffered now began to arrive.
    @exclusivity(unchecked) var partialSince: UInt64?
    /// The connection's entry in the server's deadline heap, if any.
    @exclusivity(unchecked) var scheduledAt: UInt64?
    /// The write side was shut (lingering after a malformed message).
    @exclusivity(unchecked) var writeShut = false
    /// Queued output stopped the answering of buffered calls.
    @exclusivity(unchecked) var heldBack = false
    /// The events epoll watches for; nil once the descriptor is no longer
    /// registered (the peer hung up while a call was in flight).
    @exclusivity(unchecked) var interest: UInt32? = 0
    /// Room made in `output` before a reply is written, so that a reply of up
    /// to this size (the hot replies are about 150 bytes) never makes Array
    /// grow it and free the old storage, secret and all, unzeroed.
    static let replyReserve = 1024

    init(id: UInt64, fd: Int32, caller: Caller, maximumMessageSize: Int) {
        self.id = id
        self.fd = fd
        self.caller = caller
        self.decoder = VarlinkFrameDecoder(maximumSize: maximumMessageSize)
    }

    var pendingOutput: Int { output.count - outputOffset }
    var isClosed: Bool {
        if case .closed = state { return true }
        return false
    }
    /// A stream runs (or is ending) on this connection.
    var isStream: Bool {
        switch state {
        case .streaming, .ending: return true
        case .open, .waiting, .lingering, .closed: return false
        }
    }
    /// The connection is being closed after a malformed message.
    var isLingering: Bool {
        if case .lingering = state { return true }
        return false
    }
    /// Calls are not answered now: one is in flight, or a stream runs.
    var busy: Bool {
        switch state {
        case .waiting, .streaming, .ending, .lingering: return true
        case .open, .closed: return false
        }
    }
    /// More input is useful: the peer has not closed, and no call is held back.
    var wantsInput: Bool { !peerClosedInput && !busy }
}
