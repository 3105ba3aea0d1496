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
        let handlers = Handlers(
            manager: manager, table: manager.table, policy: manager.policy, clock: clock, hub: hub)
        // Only a Login carries much (tokens, a token response, a profile: up to
        // MaxSessionSize=, at most 1 MiB); every other call is refused unparsed
        // past the default limit.
        let callSizeLimit: (VarlinkMethodDeclaration) -> Int = { declaration in
            "\(VaultInterface.name).\(declaration.name)" == VaultMethod.login.rawValue
                ? VarlinkServer.maximumMessageSize : VarlinkService.defaultCallSizeLimit
        }
        // A client's reports last as long as its connection.
        service.connectionClosed = { caller in
            guard let connection = caller.connection, let keys = manager.reporting.closed(connection) else {
                return nil
            }
            return { await manager.clientGone(connection, from: keys) }
        }
        service.add(VaultInterface.declaration, callSizeLimit: callSizeLimit) { declaration in
            guard let method = VaultMethod(rawValue: "\(VaultInterface.name).\(declaration.name)") else {
                preconditionFailure("io.vaultd.Vault declares \(declaration.name), which is no VaultMethod")
            }
            return handler(method, handlers)
        }
        return service
    }

    /// The handler of each method; the switch makes a method without one a compile error.
    static func handler(_ method: VaultMethod, _ handlers: Handlers) -> MethodHandler {
        let body: @Sendable (ParameterReader, Caller) throws(ParameterReader.Invalid) -> HandlerOutcome
        switch method {
        case .login: body = handlers.login
        case .logout: body = handlers.logout
        case .getSession: body = handlers.getSession
        case .listSessions: body = handlers.listSessions
        case .getToken: body = handlers.getToken
        case .refresh: body = handlers.refresh
        case .setProviderSecret: body = handlers.setProviderSecret
        case .reportRejected: body = handlers.reportRejected
        case .forceLogout: body = handlers.forceLogout
        case .setConnectionState: body = handlers.setConnectionState
        case .startDeviceLogin: body = handlers.startDeviceLogin
        case .pollDeviceLogin: body = handlers.pollDeviceLogin
        case .subscribe: body = handlers.subscribe
        case .beginBrowserLogin: body = handlers.beginBrowserLogin
        case .finishBrowserLogin: body = handlers.finishBrowserLogin
        }
        return { call, caller in
            parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in try body(p, caller) }
        }
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
        if let scope = record.scope {
            JSONText.appendLiteral(#","scope":"#, to: &out)
            JSONText.appendString(scope, to: &out)
        }
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
        out["scope"] = record.tokens.scope.map(JSON.string)
        out["ownerUid"] = .int(Int64(record.ownerUID))
        return out
    }

    /// The sessions `caller` may see (with `readable`, those whose token it
    /// may read too: a subscription's), and `including` lets through, as
    /// clients see them. An account parked after failed logins holds no
    /// token and is no session: `GetSession` shows its backoff, lists do not.
    static func visibleSessions(
        _ table: SessionTable, _ policy: AccessPolicy, _ caller: Caller, readable: Bool = false,
        including: (SessionKey) -> Bool = { _ in true }
    ) -> [JSON] {
        table.all().compactMap { (key, view) -> JSON? in
            guard !view.parked else { return nil }
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
