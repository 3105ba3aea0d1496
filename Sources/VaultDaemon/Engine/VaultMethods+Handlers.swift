import Varlink
import VarlinkServer
import VaultCore
import VaultProtocol

extension VaultMethods {
    /// The handlers of `io.vaultd.Vault`, one a method, with what they work
    /// on: the manager, what the serving thread reads without it (the
    /// session table, the policy in force), the clock and the subscriptions.
    /// Each reads its parameters on the serving thread; a missing or
    /// mistyped one throws, and becomes `InvalidParameter`.
    struct Handlers: Sendable {
        let manager: SessionManager
        let table: SessionTable
        let policy: PolicyBox
        let clock: any WallClock
        let hub: SubscriptionHub

        /// `Login`: the session logged in (or replaced, with `replace`), and whether it is new.
        func login(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
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

        /// `Logout`: ends the caller's session of the account.
        func logout(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
            let (account, requested) = try addressed(p)
            return answered { () async throws(VaultError) -> VarlinkReply in
                let key = try sessionKey(account, requested, caller, policy.policy, table)
                try await manager.logout(key, caller: caller)
                return VarlinkReply()
            }
        }

        /// `GetSession`: the session as the table shows it. One the table
        /// lacks is the manager's to look for: on a fleet's host, another host
        /// may have logged it in a moment ago, and the shared store says.
        func getSession(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
            let (account, requested) = try addressed(p)
            let access = policy.policy
            let key: SessionKey
            do throws(VaultError) { key = try sessionKey(account, requested, caller, access, table) } catch {
                return .reply(error.varlinkReply)
            }
            guard access.maySee(caller, ownerUID: key.owner) else {
                return .reply(AccessPolicy.notYours(key).varlinkReply)
            }
            if let view = table.view(of: key) { return .reply(Self.sessionReply(view, key)) }
            return .deferred {
                do throws(VaultError) {
                    try await manager.catchUpShared(key)
                } catch {
                    return error.varlinkReply
                }
                return Self.sessionReply(table.view(of: key), key)
            }
        }

        /// The GetSession reply of the session `view` shows: the session, or
        /// the login or logout in flight; none is `NotLoggedIn`.
        static func sessionReply(_ view: SessionView?, _ key: SessionKey) -> VarlinkReply {
            guard let view else { return VaultError.notLoggedIn(key.account).varlinkReply }
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

        /// `ListSessions`: one page of the sessions the caller may see, and the store's state.
        func listSessions(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
            let page = try SessionPage(visibleSessions(table, policy.policy, caller), parameters: p)
            var parameters = page.parameters
            parameters["store"] = .string(manager.storeState.rawValue)
            return .reply(VarlinkReply(parameters: parameters))
        }

        /// `GetToken`: see `token(_:_:)`.
        func getToken(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
            token(try GetTokenRequest(p), caller)
        }

        /// Answers a GetToken call read into `r`: looks the session up, decides
        /// (`TokenHandout`), and writes the token, or waits for what the manager
        /// must do first. Nothing of the answer is kept for the next call.
        func token(_ r: GetTokenRequest, _ caller: Caller) -> HandlerOutcome {
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
            // Asked before the table: whether another user holds a session is theirs to know.
            guard access.mayReadToken(caller, key) else {
                return refuseToken(
                    VaultError(
                        .accessDenied,
                        "the token of \(account) is handed only to its owner and to whom [Account \(account.provider) \(account.user)] names"
                    ), key, caller)
            }
            let facts = table.tokenFacts(of: key)
            guard let facts, let record = facts.record else {
                return tokenNotInTable(r, key, caller, access, sessionInTable: facts != nil)
            }
            return handOut(record, lastRefreshAt: facts.lastRefreshAt, r, key, caller)
        }

        /// A GetToken of a session the table has no token of (none, or a
        /// login in flight). A declared account may be waited for; a session
        /// the table lacks is the manager's to look for (on a fleet's host,
        /// another host may have logged it in a moment ago); else `NotLoggedIn`.
        private func tokenNotInTable(
            _ r: GetTokenRequest, _ key: SessionKey, _ caller: Caller, _ access: AccessPolicy, sessionInTable: Bool
        ) -> HandlerOutcome {
            if access.declared[key.account] != nil, r.waitSeconds > 0 {
                // A declared account may be one vaultd keeps logged in
                // (AutoLogin=yes): the manager waits for its login.
                return deferredToken(key, caller) { () async throws(VaultError) in
                    try await manager.autoLoginToken(
                        key, minValidSeconds: r.minValidSeconds, waitSeconds: r.waitSeconds, caller: caller)
                }
            }
            guard !sessionInTable else { return refuseToken(.notLoggedIn(key.account), key, caller) }
            return deferredToken(key, caller) { () async throws(VaultError) in
                try await manager.catchUpShared(key)
                return try await manager.freshToken(key, minValidSeconds: r.minValidSeconds, caller: caller)
            }
        }

        /// Hands out the token of `record`, refuses it, or waits for its
        /// refresh first, as `TokenHandout` decides.
        private func handOut(
            _ record: SessionRecord, lastRefreshAt: UnixTime?, _ r: GetTokenRequest, _ key: SessionKey,
            _ caller: Caller
        ) -> HandlerOutcome {
            // The rule the manager applies too. Whether the provider can refresh
            // and the configured MinRefreshInterval= are the manager's to know:
            // "maybe" (can, no interval) leaves those refusals to it.
            let handout = TokenHandout.Facts(
                account: key.account, expiresAt: record.expiresAt,
                issuedAt: record.tokensIssuedAt ?? record.createdAt,
                lastRefreshAt: lastRefreshAt,
                canRefresh: true, minRefreshIntervalSeconds: 0)
            switch TokenHandout.decide(handout, minValidSeconds: r.minValidSeconds, now: clock.now()) {
            case .serve: break
            case .refuse(let error): return refuseToken(error, key, caller)
            case .refreshFirst:
                // Not valid long enough: wait for the (shared) refresh, where the provider can.
                return deferredToken(key, caller) { () async throws(VaultError) in
                    try await manager.freshToken(key, minValidSeconds: r.minValidSeconds, caller: caller)
                }
            }
            manager.audit(Audit.handoutAction, key, caller: caller, result: "ok")
            return .encoded(TokenReply(record: record))
        }

        /// A GetToken refused with `error`, audited.
        private func refuseToken(_ error: VaultError, _ key: SessionKey, _ caller: Caller) -> HandlerOutcome {
            manager.audit("GetToken", key, caller: caller, result: error.code.seedCode)
            return .reply(error.varlinkReply)
        }

        /// A GetToken answered off the serving loop: `token` gets the session's
        /// record, and its handout (or refusal) is audited.
        private func deferredToken(
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

        /// `Refresh`: refreshes the session now, and answers it as refreshed.
        func refresh(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
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

        /// `SetProviderSecret`: stores a provider's client secret.
        func setProviderSecret(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid)
            -> HandlerOutcome
        {
            let provider = try p.string("provider")
            let secret = Secret(try p.string("secret"))
            return answered { () async throws(VaultError) -> VarlinkReply in
                try await manager.setProviderSecret(provider, secret, caller: caller)
                return VarlinkReply()
            }
        }

        /// `ReportRejected`: a client's report that the token with this hash was refused.
        func reportRejected(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
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

        /// `ForceLogout`: ends a session with a reason (`kicked` when none).
        func forceLogout(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
            let (account, requested) = try addressed(p)
            let reason = try kickReason(p)
            return answered { () async throws(VaultError) -> VarlinkReply in
                let key = try sessionKey(account, requested, caller, policy.policy, table)
                try await manager.logout(key, caller: caller, reason: reason)
                return VarlinkReply()
            }
        }

        /// The `reason` of a ForceLogout, `kicked` when none. It goes into
        /// every subscriber's event and the log: short and plain.
        private func kickReason(_ p: ParameterReader) throws(ParameterReader.Invalid) -> String {
            let reason = try p.optionalString("reason") ?? "kicked"
            guard reason.utf8.count <= 64, !reason.isEmpty,
                reason.unicodeScalars.allSatisfy({ $0.value >= 0x20 && $0.value != 0x7F })
            else { throw ParameterReader.Invalid(parameter: "reason") }
            return reason
        }

        /// `SetConnectionState`: a client's report of its connection, kept
        /// while the client's connection to vaultd lasts.
        func setConnectionState(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid)
            -> HandlerOutcome
        {
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

        /// `Subscribe`: the sessions the caller may watch, then their events.
        func subscribe(_ p: ParameterReader, _ caller: Caller) throws(ParameterReader.Invalid) -> HandlerOutcome {
            let filter = try eventFilter(p)
            let sessions = visibleSessions(table, policy.policy, caller, readable: true) {
                filter.matches($0.account)
            }
            return hub.subscribe(
                caller,
                snapshot: VarlinkReply(parameters: [
                    "sessions": .array(sessions), "store": .string(manager.storeState.rawValue),
                ]),
                filter: { event in
                    filter.matches(event)
                        && policy.policy.mayWatch(caller, SessionKey(owner: event.ownerUID, account: event.account))
                })
        }

        /// The events a Subscribe asks for: of a provider, a user, some kinds.
        private func eventFilter(_ p: ParameterReader) throws(ParameterReader.Invalid) -> EventFilter {
            var filter = EventFilter(provider: try p.optionalString("provider"), user: try p.optionalString("user"))
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
            return filter
        }
    }
}
