import Varlink
import VaultCore
import VaultProtocol

// This file is compiled twice: into VaultProtocolTests, where the corpus
// replay test calls it, and by scripts/fuzz into libFuzzer binaries (with
// Fuzz/Drivers/*.swift), so the short and the long form run the same code.
// It imports VaultCore and VaultProtocol only, never Testing.

/// The entry functions of the fuzz targets `framing` and `params`. Each takes
/// one input, runs it through the code under test and checks what must hold
/// whatever the input; it answers nil, or what did not hold.
enum ProtocolFuzzEntry {
    /// `framing`: the NUL decoder. The first byte of the input picks the size
    /// cap (1 to 256) and the second how many bytes each read brings (1 to
    /// 256); the rest is the stream. The decoder must hand out exactly the
    /// stream's NUL-terminated pieces, in order, none holding a NUL, until
    /// the first piece longer than the cap, which it must refuse instead.
    static func framing(_ input: [UInt8]) -> String? {
        guard input.count >= 2 else { return nil }
        let cap = Int(input[0]) + 1
        let step = Int(input[1]) + 1
        let stream = Array(input[2...])
        let pieces = stream.split(separator: 0, omittingEmptySubsequences: false).map(Array.init)
        // What must come out: the complete pieces up to the first one over the
        // cap; then a refusal if any piece, the unfinished last one included, is over.
        let complete = pieces.dropLast()
        let firstTooLong = pieces.firstIndex { $0.count > cap }
        let expected = Array(complete.prefix(firstTooLong ?? complete.count))

        var decoder = VarlinkFrameDecoder(maximumSize: cap)
        var received: [[UInt8]] = []
        var refused = false
        var offset = 0
        var reads = 0
        reading: while offset < stream.count {
            let end = min(stream.count, offset + step)
            reads += 1
            // Both ways of appending: a collection, and raw bytes as read(2) gives them.
            if reads % 2 == 0 {
                decoder.append(stream[offset..<end])
            } else {
                stream[offset..<end].withUnsafeBytes { decoder.append($0) }
            }
            offset = end
            do {
                while let message = try decoder.next() {
                    if message.contains(0) { return "a message holds a NUL" }
                    received.append(Array(message))
                    // Calls are decoded where they are read: the next input path.
                    _ = try? VarlinkCall(message: message)
                }
            } catch {
                refused = true
                break reading
            }
        }
        if received != expected {
            return "handed out \(received.count) messages, expected \(expected.count) (cap \(cap), step \(step))"
        }
        if refused != (firstTooLong != nil) {
            return refused ? "refused a stream with no piece over the cap" : "took a piece over the cap"
        }
        if !refused && decoder.hasPartialMessage != !(pieces.last ?? []).isEmpty {
            return "hasPartialMessage is wrong"
        }
        decoder.wipe()
        if decoder.hasPartialMessage { return "a wiped decoder still holds a message" }
        return nil
    }

    /// The signature of every method vaultd serves, by full name.
    static let signatures = VaultInterface.declaration.signatures.merging(
        VarlinkServiceInterface.declaration.signatures
    ) { first, _ in first }

    /// Five sessions as `ListSessions` pages them, sorted.
    static let sessions: [JSON] = (0..<5).map { i in
        ["provider": "demo", "user": .string("u\(i)"), "ownerUid": .int(1000)]
    }

    /// `params`: one message as the server reads it. It is decoded into a
    /// call, which encodes back to the same call; a call of a known method is
    /// checked against the interface, and one that passes is read the way the
    /// handlers read it (requests, account names, credentials, JWT expiry,
    /// pages). A refusal is always one of the declared kinds, naming a
    /// declared parameter. The same bytes are read as a reply too (the
    /// client's side).
    static func params(_ input: [UInt8]) -> String? {
        if let reply = try? VarlinkReply(message: input[...]) {
            guard let again = try? VarlinkReply(message: reply.encoded()[...]), again == reply else {
                return "a reply does not survive encoding"
            }
        }
        let call: VarlinkCall
        do {
            call = try VarlinkCall(message: input[...])
        } catch {
            switch error {
            case .invalidJSON(let reason): return reason.hasPrefix("invalid JSON at byte ") ? nil : "bad reason"
            case .invalidField(let field):
                return ["message", "method", "parameters"].contains(field) ? nil : "invalid field \(field)"
            }
        }
        guard let again = try? VarlinkCall(message: call.encoded()[...]), again == call else {
            return "a call does not survive encoding"
        }
        guard let signature = signatures[call.method] else { return nil }
        if let parameter = signature.invalidParameter(in: call.parameters) {
            // A declared parameter, or one the call sent (its name may be anything, "" included).
            let declared = VaultMethod(rawValue: call.method)?.declaration.parameters.map(\.name) ?? ["interface"]
            return declared.contains(parameter) || call.parameters[parameter] != nil
                ? nil : "InvalidParameter names \(parameter), neither declared nor sent"
        }
        let declared = Set(call.parameters.names)
        do throws(ParameterReader.Invalid) {
            try read(call, ParameterReader(call.parameters))
        } catch {
            // A valid call is refused only for a value the types cannot say
            // (a negative minValidSeconds, a uid past 32 bits, a bad cursor).
            if !declared.contains(error.parameter) && !["ownerUid", "limit"].contains(error.parameter) {
                return "refused the undeclared or absent parameter \(error.parameter)"
            }
        }
        return nil
    }

    /// Reads a checked call as its handler does, up to where the session
    /// manager would take over.
    static func read(_ call: VarlinkCall, _ p: ParameterReader) throws(ParameterReader.Invalid) {
        let now = UnixTime(seconds: 1_700_000_000)
        switch VaultMethod(rawValue: call.method) {
        case .login?:
            let request = try LoginRequest(p)
            _ = try? Account.validate(provider: request.provider, user: request.user)
            if let token = request.token, let credential = try? LoginCredential(token: token) {
                _ = credential.expiry(explicit: request.expiresAt.map(UnixTime.init(seconds:)), now: now)
            }
            if let response = request.tokenResponse, let credential = try? LoginCredential(tokenResponse: response) {
                _ = credential.expiry(explicit: nil, now: now)
            }
        case .getToken?:
            let request = try GetTokenRequest(p)
            _ = try? Account.validate(provider: request.provider, user: request.user)
        case .listSessions?:
            let page = try SessionPage(sessions, parameters: p)
            if page.sessions.count > SessionPage.maximumLimit { throw ParameterReader.Invalid(parameter: "limit") }
        case .logout?, .getSession?, .refresh?, .forceLogout?:
            let (provider, user) = try p.account()
            _ = try p.optionalUID("ownerUid")
            _ = try? Account.validate(provider: provider, user: user)
        case .subscribe?:
            _ = try p.optionalString("provider")
            _ = try p.optionalString("user")
            _ = p.parameters["kinds"]?.arrayValue?.map { $0.stringValue.flatMap(EventKind.init(rawValue:)) }
        case .setProviderSecret?:
            _ = try LoginCredential.trimmed(p.string("secret"))
        case .reportRejected?:
            let (provider, user) = try p.account()
            _ = try p.optionalUID("ownerUid")
            _ = try? Account.validate(provider: provider, user: user)
            if SHA256.digest(hex: try p.string("tokenHash")) == nil {
                throw ParameterReader.Invalid(parameter: "tokenHash")
            }
        case .setConnectionState?:
            let (provider, user) = try p.account()
            _ = try p.optionalUID("ownerUid")
            _ = try? Account.validate(provider: provider, user: user)
            _ = ClientConnectionState(rawValue: try p.string("state"))
            _ = try? ClientConnections.validate(name: try p.optionalString("client") ?? "x")
        case .startDeviceLogin?:
            let (provider, user) = try p.account()
            _ = try p.optionalUID("ownerUid")
            _ = try p.optionalBool("replace")
            _ = try? Account.validate(provider: provider, user: user)
        case .pollDeviceLogin?:
            _ = try p.string("login")
        case .beginBrowserLogin?:
            let (provider, user) = try p.account()
            _ = try p.optionalUID("ownerUid")
            _ = try p.string("redirectUri")
            _ = try p.optionalBool("replace")
            _ = try? Account.validate(provider: provider, user: user)
        case .finishBrowserLogin?:
            _ = (try p.string("login"), try p.string("code"), try p.string("state"))
        case nil:
            _ = try p.optionalString("interface")
        }
    }
}
