import VaultCore
import VaultProtocol

/// Binds the methods of `io.vaultd.Vault` to the session manager. Reads are
/// answered from the session table on the serving thread; changes are awaited
/// off it.
public enum VaultMethods {
    /// The version vaultd reports.
    public static let version = "0.1.0"

    /// The service with every method of `io.vaultd.Vault` bound.
    public static func service(manager: SessionManager, clock: any WallClock) -> VarlinkService {
        var service = VarlinkService(
            vendor: "vaultd", product: "vaultd", version: version, url: "https://github.com/vaultd/vaultd")
        service.interfaces[VaultInterface.name] = VaultInterface.description
        let table = manager.table

        service.methods[VaultMethod.login.rawValue] = { call, caller in
            parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                let input = try LoginRequest(p)
                return .deferred {
                    do throws(VaultError) {
                        let (record, created) = try await manager.login(input, caller: caller)
                        return VarlinkReply(parameters: [
                            "session": record.wireJSON(state: .logged), "created": .bool(created),
                        ])
                    } catch {
                        return error.varlinkReply
                    }
                }
            }
        }

        service.methods[VaultMethod.logout.rawValue] = { call, caller in
            parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                let (provider, user) = try p.account()
                return .deferred {
                    do throws(VaultError) {
                        try await manager.logout(Account(provider: provider, user: user), caller: caller)
                        return VarlinkReply()
                    } catch {
                        return error.varlinkReply
                    }
                }
            }
        }

        service.methods[VaultMethod.getSession.rawValue] = { call, caller in
            parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                let (provider, user) = try p.account()
                let account = Account(provider: provider, user: user)
                guard let view = table.view(of: account) else {
                    return .reply(VaultError.notLoggedIn(account).varlinkReply)
                }
                guard let record = view.record else {
                    return .reply(VarlinkReply(parameters: ["session": pendingSessionJSON(account, state: view.state)]))
                }
                guard caller.mayManage(ownedBy: record.ownerUID) else {
                    return .reply(VaultError.notLoggedIn(account).varlinkReply)
                }
                return .reply(VarlinkReply(parameters: ["session": record.wireJSON(state: view.state)]))
            }
        }

        service.methods[VaultMethod.listSessions.rawValue] = { call, caller in
            let sessions = table.all().compactMap { (account, view) -> JSON? in
                guard let record = view.record else { return pendingSessionJSON(account, state: view.state) }
                guard caller.mayManage(ownedBy: record.ownerUID) else { return nil }
                return record.wireJSON(state: view.state)
            }
            return .reply(VarlinkReply(parameters: ["sessions": .array(sessions)]))
        }

        service.methods[VaultMethod.getToken.rawValue] = { call, caller in
            parse(call) { (p) throws(ParameterReader.Invalid) -> HandlerOutcome in
                let r = try GetTokenRequest(p)
                let account = Account(provider: r.provider, user: r.user)
                guard let record = table.view(of: account)?.record else {
                    return .reply(VaultError.notLoggedIn(account).varlinkReply)
                }
                guard caller.uid == record.ownerUID else {
                    return .reply(
                        VaultError(.accessDenied, "the token of \(account) is handed only to its owner").varlinkReply)
                }
                if let expiresAt = record.expiresAt {
                    let now = clock.now()
                    if expiresAt <= now.adding(seconds: r.minValidSeconds) {
                        let what =
                            expiresAt <= now
                            ? "expired at \(expiresAt)"
                            : "expires at \(expiresAt), before the \(r.minValidSeconds)s asked for"
                        return .reply(
                            VaultError(.tokenExpired, "the token of \(account) \(what); log in again").varlinkReply)
                    }
                }
                var out: [String: JSON] = ["token": .string(record.tokens.accessToken.revealed)]
                out["tokenType"] = record.tokens.tokenType.map(JSON.string)
                out["expiresAt"] = record.expiresAt.map { .int($0.seconds) }
                out["instanceUrl"] = record.tokens.instanceURL.map(JSON.string)
                return .reply(VarlinkReply(parameters: out))
            }
        }
        return service
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
