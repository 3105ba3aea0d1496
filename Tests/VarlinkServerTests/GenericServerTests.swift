import Dispatch
import Glibc
import Synchronization
import Testing
import Varlink
import VarlinkServer
import VaultSystem

/// The generic server with a toy interface: proof that it serves any Varlink
/// service, and that streams and transport errors are the service's to shape.
@Suite("Generic Varlink server", .timeLimit(.minutes(5)))
struct GenericServerTests {
    @Test("Should answer calls through the method table, with GetInfo and the org.varlink.service checks")
    func answersThroughTheMethodTable() throws {
        let harness = try Harness()
        let client = try harness.connect()
        #expect(
            try client.call(#"{"method":"org.example.Echo.Say","parameters":{"text":"hi"}}"#)
                == #"{"parameters":{"text":"hi"}}"#)
        #expect(
            try client.call(#"{"method":"org.example.Echo.Say","parameters":{}}"#)
                == #"{"error":"org.varlink.service.InvalidParameter","parameters":{"parameter":"text"}}"#)
        let info = try client.call(#"{"method":"org.varlink.service.GetInfo"}"#)
        #expect(info.contains(#""interfaces":["org.varlink.service","org.example.Echo"]"#))
        close(client.fd)
        #expect(harness.stop() == SIGTERM)
    }

    @Test("Should stream what onLoop jobs push and end a stream with the last reply the owner gives")
    func streamsAndEnds() throws {
        let harness = try Harness()
        let client = try harness.connect()
        #expect(
            try client.call(#"{"method":"org.example.Echo.Watch","more":true}"#)
                == #"{"continues":true,"parameters":{}}"#)
        let stream = try #require(harness.streams.opened.withLock { $0.first })
        harness.server.onLoop { streams in
            streams.push(Array(#"{"continues":true,"parameters":{"text":"one"}}"#.utf8), to: stream)
            _ = streams.send(stream)
            streams.end(stream, with: VarlinkReply(error: "org.example.Echo.Gone"), within: 1000)
        }
        #expect(try client.read() == #"{"continues":true,"parameters":{"text":"one"}}"#)
        #expect(try client.read() == #"{"error":"org.example.Echo.Gone","parameters":{}}"#)
        #expect(try client.read() == nil)
        #expect(harness.stop() == SIGTERM)
        #expect(harness.streams.closed.withLock { $0 } == [stream])
    }

    @Test("Should count a closed connection out of the limits")
    func admissionCountsClosedConnections() throws {
        var limits = ServingLimits()
        limits.maxConnections = 2
        limits.reservedConnections = 0
        let harness = try Harness(limits: limits)
        let first = try harness.connect()
        let second = try harness.connect()
        #expect(try first.call(#"{"method":"org.example.Echo.Who"}"#).hasPrefix(#"{"parameters""#))
        #expect(try second.call(#"{"method":"org.example.Echo.Who"}"#).hasPrefix(#"{"parameters""#))
        let third = try harness.connect()
        #expect(try third.read() == #"{"error":"org.example.Echo.Busy","parameters":{"why":"full"}}"#)
        // Either closing makes room.
        for leaving in [first, second] {
            close(leaving.fd)
            #expect(harness.waitForClose())
            let next = try harness.connect()
            #expect(
                try next.call(#"{"method":"org.example.Echo.Say","parameters":{"text":"in"}}"#)
                    == #"{"parameters":{"text":"in"}}"#)
            let over = try harness.connect()
            #expect(try over.read() == #"{"error":"org.example.Echo.Busy","parameters":{"why":"full"}}"#)
        }
        #expect(harness.stop() == SIGTERM)
    }

    @Test("Should run the handler for every call, the same bytes again included, each parsed and checked")
    func repeatedCalls() throws {
        let harness = try Harness()
        let client = try harness.connect()
        let tick = #"{"method":"org.example.Echo.Tick","parameters":{"step":1}}"#
        // The same bytes again: the handler runs each time and sees the state of now.
        #expect(try client.call(tick) == #"{"parameters":{"count":1}}"#)
        #expect(try client.call(tick) == #"{"parameters":{"count":2}}"#)
        // Other bytes, pipelined between repeats: each parsed and checked on its own.
        try client.send(#"{"method":"org.example.Echo.Tick","parameters":{"step":5}}"#)
        try client.send(#"{"method":"org.example.Echo.Tick","parameters":{"step":"5"}}"#)
        try client.send(tick)
        try client.send(#"{"method":"org.example.Echo.Tick","parameters":{"step":1},"oneway":true}"#)
        try client.send(#"{"method":"org.example.Echo.Tick","parameters":{"step":1},"upgrade":true}"#)
        try client.send(tick)
        #expect(try client.read() == #"{"parameters":{"count":7}}"#)
        #expect(
            try client.read()
                == #"{"error":"org.varlink.service.InvalidParameter","parameters":{"parameter":"step"}}"#)
        #expect(try client.read() == #"{"parameters":{"count":8}}"#)
        // The oneway call ran (count 9) and was not answered.
        #expect(
            try client.read()
                == #"{"error":"org.varlink.service.InvalidParameter","parameters":{"parameter":"upgrade"}}"#)
        #expect(try client.read() == #"{"parameters":{"count":10}}"#)
        // A second connection's calls count on the service's count.
        let other = try harness.connect()
        #expect(try other.call(tick) == #"{"parameters":{"count":11}}"#)
        #expect(try client.call(tick) == #"{"parameters":{"count":12}}"#)
        #expect(harness.stop() == SIGTERM)
    }

    @Test(
        "Should parse a call larger than the inline limit off the loop and answer it in order with the calls around it")
    func largeCallInOrder() throws {
        let harness = try Harness()
        let client = try harness.connect()
        let text = String(repeating: "x", count: 100_000)
        // Pipelined: the large call waits for its parse, the small one behind it waits its turn.
        try client.send(#"{"method":"org.example.Echo.Say","parameters":{"text":"a"}}"#)
        try client.send(#"{"method":"org.example.Echo.Say","parameters":{"text":""# + text + #""}}"#)
        try client.send(#"{"method":"org.example.Echo.Say","parameters":{"text":"c"}}"#)
        #expect(try client.read() == #"{"parameters":{"text":"a"}}"#)
        #expect(try client.read() == #"{"parameters":{"text":""# + text + #""}}"#)
        #expect(try client.read() == #"{"parameters":{"text":"c"}}"#)
        #expect(harness.stop() == SIGTERM)
    }

    @Test("Should refuse a call over its method's size limit with the service's error and keep serving the connection")
    func callOverItsMethodsLimit() throws {
        let harness = try Harness()
        let client = try harness.connect()
        // Large in bytes, not in values: a call of more than VarlinkCall.maximumValues
        // values is not JSON vaultd reads at all, and closes the connection.
        let numbers = (0..<2_000).map { "\"\(String(repeating: "n", count: 40))\($0)\"" }.joined(separator: ",")
        #expect(numbers.utf8.count > VarlinkService.defaultCallSizeLimit)
        let refusal = #"{"error":"org.example.Echo.CallTooLarge","parameters":{"method":"org.example.Echo.Small"}}"#
        // The method named first: refused before the parameters are read.
        #expect(
            try client.call(#"{"method":"org.example.Echo.Small","parameters":{"text":[\#(numbers)]}}"#) == refusal)
        // Not parsed at all: what follows the method may even be broken.
        #expect(try client.call(#"{"method":"org.example.Echo.Small","parameters":{"text":[\#(numbers),,}"#) == refusal)
        // The method named last: refused once read (off the loop).
        #expect(
            try client.call(#"{"parameters":{"text":[\#(numbers)]},"method":"org.example.Echo.Small"}"#) == refusal)
        #expect(
            try client.call(#"{"method":"org.example.Echo.Say","parameters":{"text":"still here"}}"#)
                == #"{"parameters":{"text":"still here"}}"#)
        // Large and not JSON: the service's last word, then the connection
        // is closed (a clean end of file), as for a small one.
        try client.send(#"{"parameters":{"text":[\#(numbers)"#)
        #expect(try client.read()?.hasPrefix(#"{"error":"org.example.Echo.Malformed""#) == true)
        #expect(try client.read() == nil)
        #expect(harness.stop() == SIGTERM)
    }

    @Test("Should name each connection in its caller and tell the service once when it closes, however it closes")
    func tellsTheServiceOfClosedConnections() throws {
        let harness = try Harness()
        let first = try harness.connect()
        let second = try harness.connect()
        let firstID = try #require(UInt64(try first.call(#"{"method":"org.example.Echo.Who"}"#).digits))
        let secondID = try #require(UInt64(try second.call(#"{"method":"org.example.Echo.Who"}"#).digits))
        // The same connection keeps its id; another one has its own.
        #expect(try first.call(#"{"method":"org.example.Echo.Who"}"#).digits == String(firstID))
        #expect(firstID != secondID)
        #expect(harness.streams.closedConnections.withLock { $0 }.isEmpty)
        // The peer leaves: told once, with that connection's id.
        close(first.fd)
        #expect(harness.waitForClose())
        #expect(harness.streams.closedConnections.withLock { $0 } == [firstID])
        // The server closes the other one as it stops: told too.
        #expect(harness.stop() == SIGTERM)
        #expect(harness.streams.closedConnections.withLock { $0 } == [firstID, secondID])
    }

    @Test("Should tell the service of a closed connection only after the deferred call in flight on it finished")
    func closeHookAfterDeferredWork() async throws {
        let harness = try Harness()
        let client = try harness.connect()
        try client.send(#"{"method":"org.example.Echo.Slow"}"#)
        // The call is in flight (its work waits for the gate): the peer leaves.
        // Waited for without holding a thread of the cooperative pool, which
        // the call's work needs (a blocking wait here timed out in a loaded full run).
        #expect(await Harness.wait(for: harness.slowStarted, seconds: 300))
        close(client.fd)
        // Not told while the call's work runs.
        let other = try harness.connect()
        _ = try other.call(#"{"method":"org.example.Echo.Say","parameters":{"text":"x"}}"#)
        #expect(harness.streams.closedConnections.withLock { $0 }.isEmpty)
        harness.slowGate.open()
        #expect(await Harness.wait(for: harness.closed, seconds: 300))
        #expect(harness.streams.closedConnections.withLock { $0 }.count == 1)
        #expect(harness.streams.workFinishedBeforeClose.withLock { $0 } == true)
        #expect(harness.stop() == SIGTERM)
    }

    @Test("Should refuse a connection past the limit with the error the service configured")
    func refusesWithTheConfiguredError() throws {
        var limits = ServingLimits()
        limits.maxConnections = 1
        limits.reservedConnections = 0
        let harness = try Harness(limits: limits)
        let first = try harness.connect()
        #expect(
            try first.call(#"{"method":"org.example.Echo.Say","parameters":{"text":"a"}}"#)
                == #"{"parameters":{"text":"a"}}"#)
        let second = try harness.connect()
        #expect(try second.read() == #"{"error":"org.example.Echo.Busy","parameters":{"why":"full"}}"#)
        #expect(harness.stop() == SIGTERM)
    }
}

/// A server on a socket in a fresh directory, run on its own thread, with
/// a pipe standing in for the signalfd.
private final class Harness: Sendable {
    let server: VarlinkServer
    let path: String
    let streams = Record()
    /// Signalled once per closed connection.
    let closed = DispatchSemaphore(value: 0)
    /// Signalled when a Slow call's work starts; its work ends when `slowGate` opens.
    let slowStarted = DispatchSemaphore(value: 0)
    let slowGate = Gate()
    private let signalWrite: Int32
    private let done = DispatchSemaphore(value: 0)
    private let result = Mutex<Int32>(0)

    init(limits: ServingLimits = ServingLimits()) throws {
        var template = Array("/tmp/varlink-test-XXXXXX".utf8CString)
        let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
        path = directory + "/socket"
        let listenFD = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        try UnixSocket.withAddress(path) { (address, length) throws(SystemError) in
            guard bind(listenFD, address, length) == 0, listen(listenFD, 16) == 0 else { throw SystemError("bind") }
        }
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw SystemError("pipe") }
        signalWrite = pipeFDs[1]
        let streams = self.streams
        var service = VarlinkService(vendor: "test", product: "test", version: "1", url: "https://example.org")
        // Say echoes anything up to the largest message; the others take the default.
        let limit: (VarlinkMethodDeclaration) -> Int = {
            $0.name == "Say" ? VarlinkServer.maximumMessageSize : VarlinkService.defaultCallSizeLimit
        }
        let closed = self.closed
        let slowStarted = self.slowStarted
        let slowGate = self.slowGate
        service.add(Harness.interface, callSizeLimit: limit) { method in
            switch method.name {
            case "Tick":
                return { call, _ in
                    let step = call.parameters["step"]?.integerValue ?? 0
                    let count = streams.ticks.withLock { (total: inout Int64) -> Int64 in
                        total += step
                        return total
                    }
                    return .reply(VarlinkReply(parameters: ["count": .int(count)]))
                }
            case "Say":
                return { call, _ in .reply(VarlinkReply(parameters: ["text": call.parameters["text"]!])) }
            case "Small":
                return { _, _ in .reply(VarlinkReply()) }
            case "Who":
                return { _, caller in
                    .reply(VarlinkReply(parameters: ["connection": .string(caller.connection.map(String.init) ?? "")]))
                }
            case "Slow":
                return { _, _ in
                    .deferred {
                        slowStarted.signal()
                        // Bounded: the test signals the gate well before.
                        // Awaited, not blocked on: the cooperative pool stays free.
                        await slowGate.wait()
                        streams.workFinishedBeforeClose.withLock {
                            $0 = streams.closedConnections.withLock { $0.isEmpty }
                        }
                        return VarlinkReply()
                    }
                }
            default:
                return { _, _ in
                    .stream(
                        StreamStart(
                            first: VarlinkReply(),
                            opened: { id in streams.opened.withLock { $0.append(id) } },
                            closed: { id in streams.closed.withLock { $0.append(id) } }))
                }
            }
        }
        service.connectionClosed = { caller in
            streams.closedConnections.withLock { $0.append(caller.connection ?? 0) }
            closed.signal()
            return nil
        }
        let errors = TransportErrors(
            refused: { admission, _, _ in
                VarlinkReply(error: "org.example.Echo.Busy", parameters: ["why": .string("\(admission)")])
            },
            replyTooLarge: { _, _, _ in VarlinkReply(error: "org.example.Echo.TooLarge") },
            callTooLarge: { method, _, _ in
                VarlinkReply(error: "org.example.Echo.CallTooLarge", parameters: ["method": .string(method)])
            },
            stopping: VarlinkReply(error: "org.example.Echo.Stopping"),
            streamStopping: VarlinkReply(error: "org.example.Echo.Stopping"),
            malformedMessage: { problem in
                VarlinkReply(error: "org.example.Echo.Malformed", parameters: ["problem": .string(problem)])
            })
        server = try VarlinkServer(
            listenFD: listenFD, signalFD: pipeFDs[0], service: service, log: SilentLog(), errors: errors,
            limits: limits)
        DispatchQueue.global().async { [self] in
            let signal = server.run(drainSeconds: 2)
            result.withLock { $0 = signal }
            done.signal()
        }
    }

    static let interface = VarlinkInterfaceDeclaration(
        "org.example.Echo", doc: "Says back what it is told.", types: [],
        methods: [
            VarlinkMethodDeclaration(
                "Say", doc: "Answers the text.", parameters: [VarlinkField("text", .string)],
                output: [VarlinkField("text", .string)]),
            VarlinkMethodDeclaration("Watch", doc: "A stream.", parameters: [], output: [], streams: true),
            VarlinkMethodDeclaration(
                "Small", doc: "Takes anything small.", parameters: [VarlinkField("text", .object)], output: []),
            VarlinkMethodDeclaration(
                "Who", doc: "The caller's connection id.", parameters: [],
                output: [VarlinkField("connection", .string)]),
            VarlinkMethodDeclaration("Slow", doc: "Answers when the test says so.", parameters: [], output: []),
            VarlinkMethodDeclaration(
                "Tick", doc: "Adds step to a count kept by the service and answers the count.",
                parameters: [VarlinkField("step", .int)], output: [VarlinkField("count", .int)]),
        ],
        errors: [])

    func connect() throws -> Client { Client(fd: try UnixSocket.connect(to: path)) }

    /// Waits (at most 60 s: the whole suite may run beside busy builds) until
    /// the server said one more connection closed.
    func waitForClose() -> Bool { closed.wait(timeout: .now() + 60) == .success }

    /// Waits until `semaphore` is signalled, polling every 20 ms without
    /// blocking a thread; false after `seconds`.
    static func wait(for semaphore: DispatchSemaphore, seconds: Int) async -> Bool {
        for _ in 0..<(seconds * 50) {
            if semaphore.wait(timeout: .now()) == .success { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return false
    }

    /// Sends the loop a SIGTERM as signalfd would deliver it; the signal run returned.
    func stop() -> Int32 {
        var info = [UInt8](repeating: 0, count: 128)  // struct signalfd_siginfo; ssi_signo first
        info[0] = UInt8(SIGTERM)
        _ = write(signalWrite, &info, info.count)
        done.wait()
        unlink(path)
        return result.withLock { $0 }
    }
}

/// Holds back whoever waits until it is opened, without blocking a thread.
private final class Gate: Sendable {
    private let state = Mutex<(open: Bool, waiters: [CheckedContinuation<Void, Never>])>((false, []))

    func wait() async {
        await withCheckedContinuation { continuation in
            let resumeNow = state.withLock { state -> Bool in
                if state.open { return true }
                state.waiters.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.open = true
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}

/// The streams opened and closed and the connections closed, as the server
/// reported them.
private final class Record: Sendable {
    let opened = Mutex<[StreamID]>([])
    let closed = Mutex<[StreamID]>([])
    /// The connections the server said closed, in order.
    let closedConnections = Mutex<[UInt64]>([])
    /// Set when a Slow call's work ended before any connection was said closed.
    let workFinishedBeforeClose = Mutex<Bool?>(nil)
    /// What Tick calls added up to.
    let ticks = Mutex<Int64>(0)
}

/// A blocking client that writes a message and reads one back.
private struct Client {
    let fd: Int32

    func call(_ message: String) throws -> String {
        try send(message)
        return try read() ?? ""
    }

    /// Writes `message` and its NUL, whole.
    func send(_ message: String) throws {
        var bytes = Array(message.utf8)
        bytes.append(0)
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes { write(fd, $0.baseAddress! + offset, $0.count - offset) }
            guard n > 0 else { throw SystemError("write") }
            offset += n
        }
    }

    /// The next message, or nil at end of stream.
    func read() throws -> String? {
        var message: [UInt8] = []
        var byte: UInt8 = 0
        while true {
            let n = Glibc.read(fd, &byte, 1)
            if n < 0 { throw SystemError("read") }
            if n == 0 { return nil }
            if byte == 0 { return String(decoding: message, as: UTF8.self) }
            message.append(byte)
        }
    }
}

extension String {
    /// The decimal digits in the text, in order (a connection id out of a reply).
    fileprivate var digits: String { String(filter(\.isNumber)) }
}

/// Logs nothing.
private struct SilentLog: ServerLog {
    func error(_ message: String, _ fields: [String: String]) {}
    func warning(_ message: String, _ fields: [String: String]) {}
    func notice(_ message: String, _ fields: [String: String]) {}
    func info(_ message: String, _ fields: [String: String]) {}
    func debug(_ message: String, _ fields: [String: String]) {}
}
