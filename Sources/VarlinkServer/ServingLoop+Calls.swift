import Varlink
import VaultSystem

/// The calls read on a connection, answered one at a time: checked,
/// dispatched to the service, and the handler's outcome carried out.
extension ServingLoop {
    /// Answers the complete messages buffered on `connection`, one at a time,
    /// until a deferred call or a full output queue holds it back.
    func process(_ connection: Connection) {
        answer(connection)
        // Sent right after its call was read, the reply reaches a client
        // still waking from that read (one wakeup, not two).
        sendAndSettle(connection)
    }

    /// The loop of `process`: answers what is buffered, without sending.
    func answer(_ connection: Connection) {
        while !connection.isClosed, !connection.busy, connection.pendingOutput < outputHighWater {
            let message: ArraySlice<UInt8>
            do throws(VarlinkFrameDecoder.Failure) {
                guard let next = try connection.decoder.next() else { break }
                message = next
                connection.partialSince = nil
            } catch {
                let limit = VarlinkServer.maximumMessageSize
                log.warning("message over \(limit) bytes; connection closed", ["pid": String(connection.caller.pid)])
                refuseMalformed(
                    on: connection,
                    problem:
                        "a message grew past \(limit) bytes without its NUL terminator; vaultd closes the connection; end each call with a NUL byte and keep it under \(limit) bytes"
                )
                return
            }
            if message.count > VarlinkServer.inlineParseLimit {
                if refusedUnparsed(message, on: connection) { continue }
                parseAside(message, of: connection)
                break
            }
            do throws(VarlinkCall.DecodingFailure) {
                dispatch(
                    try VarlinkCall(message: message, methods: service.methodNames), size: message.count,
                    on: connection)
            } catch {
                refuse(error, on: connection)
            }
        }
        connection.heldBack = !connection.isClosed && !connection.busy && connection.pendingOutput >= outputHighWater
        // Bytes of an unfinished message start the request timeout while the
        // connection is read; complete messages held back by queued output do not.
        if connection.decoder.hasPartialMessage && connection.wantsInput
            && connection.pendingOutput < outputHighWater
        {
            if connection.partialSince == nil { connection.partialSince = now }
        } else {
            connection.partialSince = nil
        }
    }

    /// Answers a message that is no call: the connection is closed when it
    /// is not JSON, else the wrong field is named.
    func refuse(_ failure: VarlinkCall.DecodingFailure, on connection: Connection) {
        switch failure {
        case .invalidJSON(let reason):
            log.warning("invalid JSON; connection closed", ["pid": String(connection.caller.pid), "reason": reason])
            refuseMalformed(
                on: connection,
                problem:
                    "a message is not JSON (\(reason)); vaultd closes the connection; send each call as one JSON object ended by a NUL byte"
            )
        case .invalidField(let field):
            queue(VarlinkServiceError.invalidParameter(field), on: connection)
        }
    }

    /// Answers one call read from a message of `size` bytes: queues its
    /// reply, starts its stream or its deferred work.
    func dispatch(_ call: VarlinkCall, size: Int, on connection: Connection) {
        if stopping {
            if !call.oneway { queue(errors.stopping, on: connection) }
            return
        }
        // A large call of a method that takes small parameters, parsed because
        // its method was not named first: refused as if it had been.
        if size > VarlinkServer.inlineParseLimit {
            let limit = service.callSizeLimit(of: call.method)
            if size > limit {
                if !call.oneway { queue(errors.callTooLarge(call.method, size, limit), on: connection) }
                return
            }
        }
        switch service.check(call) {
        case .refused(let outcome):
            perform(outcome, of: call, on: connection)
        case .passed(let checked):
            perform(service.run(checked, caller: connection.caller), of: call, on: connection)
        }
    }

    /// Carries out a handler's (or the service's refusal's) outcome for `call`.
    private func perform(_ outcome: HandlerOutcome, of call: VarlinkCall, on connection: Connection) {
        switch outcome {
        case .reply(let reply):
            if !call.oneway { queueBounded(on: connection, method: call.method) { reply.encode(into: &$0) } }
        case .encoded(let writer):
            if !call.oneway { queueBounded(on: connection, method: call.method) { writer.write(into: &$0) } }
        case .stream(let start):
            var first = start.first
            first.continues = true
            let stream = StreamID(connection: connection.id)
            guard queueBounded(on: connection, method: call.method, { first.encode(into: &$0) }) else {
                start.closed(stream)
                return
            }
            connection.state = .streaming
            connection.streamClosed = start.closed
            start.opened(stream)
        case .deferred(let work):
            log.debug("call in flight", ["method": call.method, "pid": String(connection.caller.pid)])
            connection.state = .waiting
            let id = connection.id
            let oneway = call.oneway
            startWork(id) { [self] in
                let reply = await work()
                self.complete(id, oneway ? nil : reply)
            }
        }
    }

    /// Has a message over `inlineParseLimit` bytes parsed off the loop, so
    /// that no other client's call waits behind it (a megabyte of nested
    /// JSON takes tens of milliseconds, many times that on a busy machine).
    /// The connection waits as for a deferred call; large calls are parsed
    /// one at a time, oldest first, on the cooperative pool, and each comes
    /// back to the loop as a job (`parsedAside`).
    private func parseAside(_ message: ArraySlice<UInt8>, of connection: Connection) {
        connection.state = .waiting
        asideParses.append((connection.id, Array(message)))
        startParseAside()
    }

    /// The id of the large parse in `offLoopWork` (no connection's: those start at 16).
    static let asideParseID: UInt64 = 4

    /// Starts the oldest waiting large parse, unless one runs.
    private func startParseAside() {
        guard !parsingAside, !asideParses.isEmpty else { return }
        parsingAside = true
        let (id, message) = asideParses.removeFirst()
        let methods = service.methodNames
        offLoopWork[Self.asideParseID] = Task.detached(priority: .low) { [self] in
            var message = message
            let parsed = Result { () throws(VarlinkCall.DecodingFailure) in
                try VarlinkCall(message: message[...], methods: methods)
            }
            let size = message.count
            // A Login's message holds tokens.
            message.wipe()
            self.onLoop { _ in self.parsedAside(id, parsed, size: size) }
        }
    }

    /// Answers a large call parsed off the loop, then what its connection
    /// sent after it, and starts the next large parse.
    private func parsedAside(_ id: UInt64, _ parsed: Result<VarlinkCall, VarlinkCall.DecodingFailure>, size: Int) {
        offLoopWork[Self.asideParseID] = nil
        parsingAside = false
        startParseAside()
        guard let connection = connections[id], case .waiting = connection.state else { return }
        connection.state = .open
        switch parsed {
        case .success(let call): dispatch(call, size: size, on: connection)
        case .failure(let failure): refuse(failure, on: connection)
        }
        if !connection.isClosed { process(connection) }
    }

    /// Refuses a message over `inlineParseLimit` bytes at once, without a
    /// parse, when it names first a method whose calls may not be that large;
    /// false when it does not (it is then parsed as any other).
    private func refusedUnparsed(_ message: ArraySlice<UInt8>, on connection: Connection) -> Bool {
        if let method = VarlinkCall.leadingMethod(of: message, methods: service.methodNames) {
            let limit = service.callSizeLimit(of: method)
            if message.count > limit {
                // Oneway or not is unknown without a parse: the refusal is always sent.
                queue(errors.callTooLarge(method, message.count, limit), on: connection)
                if now >= nextCallTooLargeLog {
                    log.warning(
                        "call over its method's size limit refused",
                        [
                            "method": method, "bytes": String(message.count), "uid": String(connection.caller.uid),
                            "pid": String(connection.caller.pid),
                        ])
                    nextCallTooLargeLog = now + 10_000
                }
                return true
            }
        }
        return false
    }
}
