import Varlink
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

        /// Answers a GetToken call read into `r`: looks the session up, decides
        /// (`TokenHandout`), and writes the token, or waits for what the manager
        /// must do first. Nothing of the answer is kept for the next call.
        @Sendable func getToken(_ r: GetTokenRequest, _ caller: Caller) -> HandlerOutcome {
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
            let facts = table.tokenFacts(of: key)
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
            manager.audit(Audit.handoutAction, key, caller: caller, result: "ok")
            return .encoded(TokenReply(record: record))
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
                        getToken(try GetTokenRequest(p), caller)
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
        service.add(VaultInterface.declaration, callSizeLimit: callSizeLimit) { declaration in
            guard let method = VaultMethod(rawValue: "\(VaultInterface.name).\(declaration.name)") else {
                preconditionFailure("io.vaultd.Vault declares \(declaration.name), which is no VaultMethod")
            }
            return handler(method)
        }
        return service
    }

    /// A GetToken reply, written from the session's record straight into the
    /// connection's output (whose bytes are zeroed once sent): no copy of the
    /// token outlives the call.
    struct TokenReply: VarlinkReplyWriter {
        let record: SessionRecord

        func write(into out: inout [UInt8]) { writeTokenReply(record, into: &out) }
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
