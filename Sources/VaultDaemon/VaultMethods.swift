import VarlinkServer
import VaultCore
import VaultProtocol

/// Binds the methods of `io.vaultd.Vault` to the session manager. Reads are
/// answered from the session table on the serving thread; changes are awaited
/// off it.
public enum VaultMethods {
    /// The version vaultd reports.
    public static let version = VaultdVersion.current

    /// The service with every method of `io.vaultd.Vault` bound; `hub` holds
    /// the subscriptions.
    public static func service(manager: SessionManager, clock: any WallClock, hub: SubscriptionHub) -> VarlinkService {
        var service = VarlinkService(
            vendor: "vaultd", product: "vaultd", version: version, url: "https://github.com/vaultd/vaultd")
        let table = manager.table
        let policy = manager.policy

        /// A GetToken answered off the serving loop: `token` gets the session's
        /// record, and its handout (or refusal) is audited.
        @Sendable func deferredToken(
            _ key: SessionKey, _ caller: Caller,
            _ token: @escaping @Sendable () async throws(VaultError) -> SessionRecord
        ) -> HandlerOutcome {
            .deferred {
                do throws(VaultError) {
                    let record = try await token()
                    manager.audit("GetToken", key, caller: caller, result: "ok")
                    return VarlinkReply(parameters: tokenReply(record))
                } catch {
                    manager.audit("GetToken", key, caller: caller, result: error.code.seedCode)
                    return error.varlinkReply
                }
            }
        }

        /// Answers a GetToken call read into `r`, with what the connection's
        /// earlier calls of it left in `memo` (a prepared call keeps it; the
        /// first call of a connection starts from an empty one).
        @Sendable func getToken(_ r: GetTokenRequest, _ caller: Caller, memo: inout GetTokenMemo) -> HandlerOutcome {
            // Loaded before anything is read: a change published after this
            // load makes the next call read again.
            let policyGeneration = policy.generation
            let tableGeneration = table.generation
            if let served = memo.served, served.policyGeneration == policyGeneration,
                served.tableGeneration == tableGeneration
            {
                // Neither the access policy nor any session changed since this
                // connection's last call was served: the same decisions hold,
                // but for the time (the token may have come close to its expiry).
                if case .serve = TokenHandout.decide(
                    served.handout, minValidSeconds: r.minValidSeconds, now: clock.now())
                {
                    memo.audit(manager, served.key, caller)
                    return .encoded(served.reply)
                }
            }
            memo.served = nil
            let account = Account(provider: r.provider, user: r.user)
            let access = policy.policy
            let key: SessionKey
            do throws(VaultError) {
                key = SessionKey(
                    owner: try access.owner(of: account, for: caller, requested: r.ownerUID),
                    account: account)
            } catch {
                return .reply(error.varlinkReply)
            }
            func refuse(_ error: VaultError) -> HandlerOutcome {
                manager.audit("GetToken", key, caller: caller, result: error.code.seedCode)
                return .reply(error.varlinkReply)
            }
            // Asked before the table: whether another user holds a session is theirs to know.
            guard access.mayReadToken(caller, key) else {
                return refuse(
                    VaultError(
                        .accessDenied,
                        "the token of \(account) is handed only to its owner and to whom [Account \(account.provider) \(account.user)] names"
                    ))
            }
            let facts = table.tokenFacts(of: key, at: &memo.position)
            guard let facts, let record = facts.record else {
                if facts == nil, manager.isFleetHost, r.waitSeconds == 0 {
                    // Another host may have logged it in a moment ago: the store says.
                    return deferredToken(key, caller) { () async throws(VaultError) in
                        try await manager.catchUpShared(key)
                        return try await manager.freshToken(key, minValidSeconds: r.minValidSeconds, caller: caller)
                    }
                }
                guard access.declared[account] != nil, r.waitSeconds > 0 else {
                    return refuse(.notLoggedIn(account))
                }
                // A declared account may be one vaultd keeps logged in
                // (AutoLogin=yes): the manager waits for its login.
                return deferredToken(key, caller) { () async throws(VaultError) in
                    try await manager.autoLoginToken(
                        key, minValidSeconds: r.minValidSeconds, waitSeconds: r.waitSeconds, caller: caller)
                }
            }
            // The rule the manager applies too. Whether the provider can refresh
            // and the configured MinRefreshInterval= are the manager's to know:
            // "maybe" (can, no interval) leaves those refusals to it.
            let handout = TokenHandout.Facts(
                account: account, expiresAt: record.expiresAt,
                issuedAt: record.tokensIssuedAt ?? record.createdAt,
                lastRefreshAt: facts.lastRefreshAt,
                canRefresh: true, minRefreshIntervalSeconds: 0)
            switch TokenHandout.decide(handout, minValidSeconds: r.minValidSeconds, now: clock.now()) {
            case .serve: break
            case .refuse(let error): return refuse(error)
            case .refreshFirst:
                // Not valid long enough: wait for the (shared) refresh, where the provider can.
                return deferredToken(key, caller) { () async throws(VaultError) in
                    try await manager.freshToken(key, minValidSeconds: r.minValidSeconds, caller: caller)
                }
            }
            let reply = ServedToken(record)
            memo.served = GetTokenMemo.Served(
                policyGeneration: policyGeneration, tableGeneration: tableGeneration, key: key, handout: handout,
                reply: reply)
            memo.audit(manager, key, caller, decided: true)
            return .encoded(reply)
        }

        /// The handler of each method; the switch makes a method without one a compile error.
        func handler(_ method: VaultMethod) -> MethodHandler {
            switch method {
            case .login:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let input = try LoginRequest(p)
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            let (record, outcome) = try await manager.loginOrReplace(input, caller: caller)
                            var parameters: [String: JSON] = [
                                "session": record.wireJSON(state: .logged), "created": .bool(outcome != .existing),
                            ]
                            if input.replace { parameters["replaced"] = .bool(outcome == .replaced) }
                            return VarlinkReply(parameters: parameters)
                        }
                    }
                }

            case .logout:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let (account, requested) = try addressed(p)
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            let key = try sessionKey(account, requested, caller, policy.policy, table)
                            try await manager.logout(key, caller: caller)
                            return VarlinkReply()
                        }
                    }
                }

            case .getSession:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let (account, requested) = try addressed(p)
                        let access = policy.policy
                        let key: SessionKey
                        do throws(VaultError) { key = try sessionKey(account, requested, caller, access, table) } catch
                        {
                            return .reply(error.varlinkReply)
                        }
                        guard access.maySee(caller, ownerUID: key.owner) else {
                            return .reply(AccessPolicy.notYours(key).varlinkReply)
                        }
                        @Sendable func reply(_ view: SessionView?) -> VarlinkReply {
                            guard let view else { return VaultError.notLoggedIn(account).varlinkReply }
                            guard let record = view.record else {
                                // A login or logout in flight.
                                return VarlinkReply(parameters: [
                                    "session": pendingSessionJSON(key, state: view.state, refresh: view.refresh)
                                ])
                            }
                            return VarlinkReply(parameters: [
                                "session": view.wireJSON() ?? record.wireJSON(state: view.state, refresh: view.refresh)
                            ])
                        }
                        let view = table.view(of: key)
                        if view == nil, manager.isFleetHost {
                            // Another host may have logged it in a moment ago: the store says.
                            return .deferred {
                                do throws(VaultError) {
                                    try await manager.catchUpShared(key)
                                } catch {
                                    return error.varlinkReply
                                }
                                return reply(table.view(of: key))
                            }
                        }
                        return .reply(reply(view))
                    }
                }

            case .listSessions:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let page = try SessionPage(visibleSessions(table, policy.policy, caller), parameters: p)
                        var parameters = page.parameters
                        parameters["store"] = .string(manager.storeState.rawValue)
                        return .reply(VarlinkReply(parameters: parameters))
                    }
                }

            case .getToken:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        // One call: audited without a tally of its own.
                        var memo = GetTokenMemo(tallies: false)
                        return getToken(try GetTokenRequest(p), caller, memo: &memo)
                    }
                }

            case .refresh:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let (account, requested) = try addressed(p)
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            let key = try sessionKey(account, requested, caller, policy.policy, table)
                            _ = try await manager.refresh(key, caller: caller, clientAsked: true)
                            guard let view = table.view(of: key), let session = view.wireJSON() else {
                                return VaultError.notLoggedIn(account).varlinkReply
                            }
                            return VarlinkReply(parameters: ["session": session])
                        }
                    }
                }

            case .setProviderSecret:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let provider = try p.string("provider")
                        let secret = Secret(try p.string("secret"))
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            try await manager.setProviderSecret(provider, secret, caller: caller)
                            return VarlinkReply()
                        }
                    }
                }

            case .reportRejected:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let (account, requested) = try addressed(p)
                        guard let hash = SHA256.digest(hex: try p.string("tokenHash")) else {
                            throw ParameterReader.Invalid(parameter: "tokenHash")
                        }
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            let key = try sessionKey(account, requested, caller, policy.policy, table)
                            let outcome = try await manager.reportRejected(key, tokenHash: hash, caller: caller)
                            return VarlinkReply(parameters: ["outcome": .string(outcome.rawValue)])
                        }
                    }
                }

            case .forceLogout:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let (account, requested) = try addressed(p)
                        let reason = try p.optionalString("reason") ?? "kicked"
                        // The reason goes into every subscriber's event and the log: keep it short and plain.
                        guard reason.utf8.count <= 64, !reason.isEmpty,
                            reason.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F })
                        else { throw ParameterReader.Invalid(parameter: "reason") }
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            let key = try sessionKey(account, requested, caller, policy.policy, table)
                            try await manager.logout(key, caller: caller, reason: reason)
                            return VarlinkReply()
                        }
                    }
                }

            case .setConnectionState:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        let (account, requested) = try addressed(p)
                        guard let state = ClientConnectionState(rawValue: try p.string("state")) else {
                            throw ParameterReader.Invalid(parameter: "state")
                        }
                        let named = try p.optionalString("client") ?? defaultClientName(caller)
                        let client: String
                        do throws(VaultError) {
                            client = try ClientConnections.validate(name: named)
                        } catch {
                            return .reply(error.varlinkReply)
                        }
                        // Marked now, on the serving thread: the server tells of the
                        // connection's close on this thread too, never before this.
                        if let connection = caller.connection { manager.reporting.opened(connection) }
                        return answered { () async throws(VaultError) -> VarlinkReply in
                            let key = try sessionKey(account, requested, caller, policy.policy, table)
                            try await manager.setConnectionState(key, state: state, client: client, caller: caller)
                            return VarlinkReply()
                        }
                    }
                }

            case .subscribe:
                return { call, caller in
                    parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                        var filter = EventFilter(
                            provider: try p.optionalString("provider"), user: try p.optionalString("user"))
                        if let kinds = p.parameters["kinds"], kinds != .null {
                            guard let names = kinds.arrayValue else {
                                throw ParameterReader.Invalid(parameter: "kinds")
                            }
                            for name in names {
                                guard let kind = name.stringValue.flatMap(EventKind.init(rawValue:)) else {
                                    throw ParameterReader.Invalid(parameter: "kinds")
                                }
                                filter.kinds.insert(kind)
                            }
                        }
                        let sessions = visibleSessions(table, policy.policy, caller, readable: true) {
                            filter.matches($0.account)
                        }
                        let subscriptionFilter = filter
                        return hub.subscribe(
                            caller,
                            snapshot: VarlinkReply(parameters: [
                                "sessions": .array(sessions), "store": .string(manager.storeState.rawValue),
                            ]),
                            filter: { event in
                                subscriptionFilter.matches(event)
                                    && policy.policy.mayWatch(
                                        caller, SessionKey(owner: event.ownerUID, account: event.account))
                            })
                    }
                }
            }
        }

        // Only a Login carries much (tokens, a token response, a profile: up to
        // MaxSessionSize=, at most 1 MiB); every other call is refused unparsed
        // past the default limit.
        let callSizeLimit: (VarlinkMethodDeclaration) -> Int = { declaration in
            "\(VaultInterface.name).\(declaration.name)" == VaultMethod.login.rawValue
                ? VarlinkServer.maximumMessageSize : VarlinkService.defaultCallSizeLimit
        }
        // A client's reports last as long as its connection.
        service.connectionClosed = { caller in
            guard let connection = caller.connection, let keys = manager.reporting.closed(connection) else { return }
            Task { await manager.clientGone(connection, from: keys) }
        }
        // The reads clients repeat in loops, whose parameters hold no secret: a
        // connection keeps its last one to answer the same bytes unparsed.
        let repeatableMethods: Set<VaultMethod> = [.getToken, .getSession, .listSessions]
        let repeatable: (VarlinkMethodDeclaration) -> Bool = { declaration in
            VaultMethod(rawValue: "\(VaultInterface.name).\(declaration.name)").map(repeatableMethods.contains) ?? false
        }
        service.add(VaultInterface.declaration, callSizeLimit: callSizeLimit, repeatable: repeatable) { declaration in
            guard let method = VaultMethod(rawValue: "\(VaultInterface.name).\(declaration.name)") else {
                preconditionFailure("io.vaultd.Vault declares \(declaration.name), which is no VaultMethod")
            }
            return handler(method)
        }
        // A client that reads a token in a loop sends the same call again and
        // again: its parameters are read once and its session's place in the
        // table is remembered between calls.
        service.prepare(VaultMethod.getToken.rawValue) { call in
            do throws(ParameterReader.Invalid) {
                return .prepared(
                    PreparedGetToken(
                        try GetTokenRequest(ParameterReader(call.parameters)), log: manager.log, answer: getToken))
            } catch {
                return .answered(.reply(VarlinkServiceError.invalidParameter(error.parameter)))
            }
        }
        return service
    }

    /// A GetToken call read once, run for each repeat on its connection (on
    /// that connection's loop only), with what its earlier runs left in its
    /// memo.
    final class PreparedGetToken: PreparedCall {
        let request: GetTokenRequest
        let log: Logger
        let answer: @Sendable (GetTokenRequest, Caller, inout GetTokenMemo) -> HandlerOutcome
        /// Read and written by its connection's loop alone, never through
        /// overlapping accesses: exempt from the runtime's exclusivity checks.
        @exclusivity(unchecked) var memo = GetTokenMemo()

        init(
            _ request: GetTokenRequest, log: Logger,
            answer: @escaping @Sendable (GetTokenRequest, Caller, inout GetTokenMemo) -> HandlerOutcome
        ) {
            self.request = request
            self.log = log
            self.answer = answer
        }

        /// Its connection let it go: the handouts its tally counted go to the audit trail.
        deinit { memo.close(log) }

        func run(caller: Caller) -> HandlerOutcome { answer(request, caller, &memo) }
    }

    /// What one connection's GetToken calls of one session keep between
    /// calls, on that connection's loop alone: where the session's view sat
    /// in the table (found again without hashing the account), the last
    /// answer served with the access policy and table generations it was
    /// decided at (while both are the same, a repeat takes no lock and
    /// writes no memory another loop reads), and the connection's tally of
    /// its handouts for the audit trail. Every session's change and every
    /// reload of the policy makes the next call decide again.
    struct GetTokenMemo {
        /// A token served, and what it was decided on. A class: a repeat
        /// takes one reference to it, not one to each of its strings.
        final class Served {
            let policyGeneration: UInt64
            let tableGeneration: UInt64
            let key: SessionKey
            let handout: TokenHandout.Facts
            let reply: ServedToken

            init(
                policyGeneration: UInt64, tableGeneration: UInt64, key: SessionKey, handout: TokenHandout.Facts,
                reply: ServedToken
            ) {
                self.policyGeneration = policyGeneration
                self.tableGeneration = tableGeneration
                self.key = key
                self.handout = handout
                self.reply = reply
            }
        }

        /// Whether the handouts are counted in a tally of the connection's own.
        let tallies: Bool
        /// Where the session's view sat in the table (-1: unknown).
        var position = -1
        var served: Served?
        var tally: HandoutTally?

        init(tallies: Bool = true) { self.tallies = tallies }

        /// Audits a handout of `key` to `caller` (result ok). `decided`: the key
        /// was decided anew (a reload may have given the account another
        /// owner), so a tally of another session's handouts is let go first.
        mutating func audit(_ manager: SessionManager, _ key: SessionKey, _ caller: Caller, decided: Bool = false) {
            if decided, let kept = tally?.kind,
                kept.owner != key.owner || kept.provider != key.account.provider || kept.user != key.account.user
            {
                close(manager.log)
            }
            if tallies {
                Audit.handout(manager.log, key, caller: caller, tally: &tally)
            } else {
                manager.audit(Audit.handoutAction, key, caller: caller, result: "ok")
            }
        }

        /// Hands the tally's last count to the audit trail.
        mutating func close(_ log: Logger) {
            if let tally { log.handouts.close(tally) }
            tally = nil
        }
    }

    /// A GetToken reply, encoded once for the repeats of one connection's
    /// call and zeroed when it is let go (it holds the token).
    final class ServedToken: VarlinkReplyWriter, @unchecked Sendable {
        /// Written once, at `init`, then read by one loop (immutable but for `deinit`).
        private var bytes: [UInt8] = []

        init(_ record: SessionRecord) {
            // Room for the whole reply first (every string escaped at worst
            // six bytes a byte): an array that grew would leave the token in
            // the storage it let go of, unzeroed.
            let strings =
                record.accessToken.withUTF8 { $0.count } + (record.instanceURL?.utf8.count ?? 0)
                + (record.tokenType?.utf8.count ?? 0)
            bytes.reserveCapacity(128 + 6 * strings)
            writeTokenReply(record, into: &bytes)
        }

        deinit { bytes.wipe() }

        func write(into out: inout [UInt8]) { out.append(contentsOf: bytes) }
    }

    /// The errors the server sends on its own, as vaultd names them.
    public static let transportErrors = TransportErrors(
        refused: { admission, caller, limits in limits.refusal(admission, uid: caller.uid).varlinkReply },
        replyTooLarge: { method, size, limit in
            VaultError(
                .replyTooLarge,
                "the reply to \(method) would take \(size) bytes, more than one connection may have queued (MaxOutputPerConnection=\(limit) bytes); ask for less (ListSessions: a smaller limit, then follow next; Subscribe: narrow by provider or user), and read replies before sending more calls"
            ).varlinkReply
        },
        callTooLarge: { method, size, limit in
            VaultError(
                .invalidParameter,
                "the call to \(method) takes \(size) bytes, more than the \(limit) its parameters may (only Login takes large ones); send less"
            ).varlinkReply
        },
        stopping: VaultError(.internalError, "vaultd is stopping; retry when it is back").varlinkReply,
        streamStopping: VaultError(.internalError, "vaultd is stopping; subscribe again when it is back").varlinkReply,
        malformedMessage: { problem in VaultError(.invalidParameter, problem).varlinkReply })

    /// Appends the GetToken reply of `record`: the bytes
    /// `VarlinkReply(parameters: tokenReply(record)).encode(into:)` writes,
    /// without building the dictionaries.
    static func writeTokenReply(_ record: SessionRecord, into out: inout [UInt8]) {
        // Field by field: `record.tokens` would copy the whole token set.
        JSONText.appendLiteral(#"{"parameters":{"#, to: &out)
        // Members in sorted order, as the generic encoder writes them.
        if let expiresAt = record.expiresAt {
            JSONText.appendLiteral(#""expiresAt":"#, to: &out)
            JSONText.appendNumber(expiresAt.seconds, to: &out)
            out.append(UInt8(ascii: ","))
        }
        if let instanceURL = record.instanceURL {
            JSONText.appendLiteral(#""instanceUrl":"#, to: &out)
            JSONText.appendString(instanceURL, to: &out)
            out.append(UInt8(ascii: ","))
        }
        JSONText.appendLiteral(#""ownerUid":"#, to: &out)
        JSONText.appendNumber(Int64(record.ownerUID), to: &out)
        JSONText.appendLiteral(#","token":"#, to: &out)
        // From the secret's own bytes: a String copy of the token would not be wiped.
        record.accessToken.withUTF8 { JSONText.appendString(utf8: $0, to: &out) }
        if let tokenType = record.tokenType {
            JSONText.appendLiteral(#","tokenType":"#, to: &out)
            JSONText.appendString(tokenType, to: &out)
        }
        JSONText.appendLiteral("}}", to: &out)
    }

    /// The parameters of a GetToken reply.
    static func tokenReply(_ record: SessionRecord) -> [String: JSON] {
        var out: [String: JSON] = ["token": .string(record.tokens.accessToken.revealed)]
        out["tokenType"] = record.tokens.tokenType.map(JSON.string)
        out["expiresAt"] = record.expiresAt.map { .int($0.seconds) }
        out["instanceUrl"] = record.tokens.instanceURL.map(JSON.string)
        out["ownerUid"] = .int(Int64(record.ownerUID))
        return out
    }

    /// The sessions `caller` may see (with `readable`, those whose token it
    /// may read too: a subscription's), and `including` lets through, as
    /// clients see them.
    static func visibleSessions(
        _ table: SessionTable, _ policy: AccessPolicy, _ caller: Caller, readable: Bool = false,
        including: (SessionKey) -> Bool = { _ in true }
    ) -> [JSON] {
        table.all().compactMap { (key, view) -> JSON? in
            let visible = readable ? policy.mayWatch(caller, key) : policy.maySee(caller, ownerUID: key.owner)
            guard visible, including(key) else { return nil }
            return view.wireJSON() ?? pendingSessionJSON(key, state: view.state, refresh: view.refresh)
        }
    }

    /// The name of a client that gave none: its executable's, else its pid.
    static func defaultClientName(_ caller: Caller) -> String {
        let name = caller.executable.flatMap { $0.split(separator: "/").last.map(String.init) } ?? ""
        return name.isEmpty
            ? "pid \(caller.pid)" : String(name.utf8.prefix(ClientConnections.maximumNameBytes)) ?? "pid \(caller.pid)"
    }

    /// The account and the optional `ownerUid` a call names.
    static func addressed(_ p: ParameterReader) throws(ParameterReader.Invalid) -> (Account, UInt32?) {
        let (provider, user) = try p.account()
        return (Account(provider: provider, user: user), try p.optionalUID("ownerUid"))
    }

    /// The session a call about an existing session addresses: the one the
    /// access policy names (`AccessPolicy.owner`), except that an
    /// administrator who names no owner and has no session of the account
    /// is answered from the only session of it there is (kicking a user needs
    /// no uid); with several, the administrator must name one.
    static func sessionKey(
        _ account: Account, _ requested: UInt32?, _ caller: Caller, _ policy: AccessPolicy, _ table: SessionTable
    ) throws(VaultError) -> SessionKey {
        let key = SessionKey(owner: try policy.owner(of: account, for: caller, requested: requested), account: account)
        guard requested == nil, policy.declared[account] == nil, policy.isAdmin(caller), table.view(of: key) == nil
        else { return key }
        let owners = table.owners(of: account)
        if owners.count == 1 { return SessionKey(owner: owners[0], account: account) }
        if owners.count > 1 {
            let uids = owners.map(String.init).joined(separator: ", ")
            throw VaultError(
                .invalidParameter,
                "\(account) has sessions of uids \(uids); name one with ownerUid (vaultctl --owner UID)")
        }
        return key
    }

    /// A reply computed off the serving thread, where a `VaultError` becomes
    /// its error reply.
    static func answered(_ body: @escaping @Sendable () async throws(VaultError) -> VarlinkReply) -> HandlerOutcome {
        .deferred {
            do throws(VaultError) {
                return try await body()
            } catch {
                return error.varlinkReply
            }
        }
    }

    /// Runs `body` with the call's parameters; a missing or mistyped parameter
    /// becomes `org.varlink.service.InvalidParameter` naming it.
    private static func parse(
        _ call: VarlinkCall, _ body: (ParameterReader) throws(ParameterReader.Invalid) -> HandlerOutcome
    ) -> HandlerOutcome {
        do {
            return try body(ParameterReader(call.parameters))
        } catch {
            return .reply(VarlinkServiceError.invalidParameter(error.parameter))
        }
    }
}
