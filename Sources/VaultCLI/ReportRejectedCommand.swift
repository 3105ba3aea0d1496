import VaultClient
import VaultCore

extension VaultCtl {
    /// `vaultctl report-rejected PROVIDER USER`: reads the rejected token and
    /// sends its SHA-256 (`ReportRejected`); the token itself never leaves.
    mutating func reportRejected(_ command: ParsedCommand) -> ExitCode {
        let (provider, user) = (command.arguments[0], command.arguments[1])
        let text: String
        switch readCredential(command.value("--token-file")) {
        case .success(let read): text = read
        case .failure(let message):
            output.err("vaultctl: \(message)")
            return .usage
        }
        let token: Secret
        do { token = try LoginCredential(text: text).tokens.accessToken } catch {
            output.err("vaultctl: \(error.message) (\(error.code.seedCode))")
            return .usage
        }
        return run { vault throws(VaultClientError) in
            let outcome = try vault.reportRejected(provider: provider, user: user, token: token, ownerUID: owner)
            let text: String
            switch outcome {
            case .refreshed: text = "refreshed: \(user) @ \(provider) has a new token"
            case .alreadyReplaced: text = "already replaced: \(user) @ \(provider) has a newer token; read it again"
            case .ended: text = "ended: \(user) @ \(provider) cannot be refreshed and was logged out (tokenInvalid)"
            }
            return (.object(["outcome": .string(outcome.rawValue)]), text)
        }
    }
}
