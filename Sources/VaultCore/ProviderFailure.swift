/// How a provider's failure becomes a `VaultError`: vaultd's kind (one
/// vocabulary, whatever the provider), and the provider's own code and
/// message beside it. The chat SDKs report the server's own code
/// (`AUTH_ERR_APIKEY_NOT_FOUND`); vaultd reports its kind in `code` and the
/// server's in `providerCode`, on every surface.
public enum ProviderFailure {
    /// The code an exec provider's failure carries when its helper program
    /// could not be run at all (missing, not executable, a bad `#!` line).
    public static let helperUnavailable = VaultError.Code.helperUnavailable.seedCode

    /// The kind of a failure worth retrying: `helperUnavailable` when the
    /// helper could not be run, else `networkError`.
    public static func transientKind(_ code: String?) -> VaultError.Code {
        code == helperUnavailable ? .helperUnavailable : .networkError
    }

    /// The kind of a refusal whose code is `code`: a code of vaultd's own
    /// table keeps its kind (`ERR_UID_NOT_FOUND`, `ERR_USER_DEACTIVATED`,
    /// `AUTH_ERR_AUTH_TOKEN_NOT_FOUND` for a token the provider does not
    /// know); OAuth 2.0's `invalid_grant` is a revoked grant; a refused client
    /// (`invalid_client`, `unauthorized_client`, a helper's wrong API key) an
    /// invalid client; anything else a credential the provider does not take.
    public static func permanentKind(_ code: String) -> VaultError.Code {
        if let own = VaultError.Code(seedCode: code) { return own }
        switch code {
        case "invalid_grant": return .grantRevoked
        case "invalid_client", "unauthorized_client", "AUTH_ERR_APIKEY_NOT_FOUND", "ERR_INVALID_API_KEY":
            return .invalidClient
        default: return .invalidCredential
        }
    }

    /// The provider's code as clients get it beside `kind`'s: `code` when it
    /// is a plausible code (letters, digits, `_`, `-`, `.`; at most 64) and
    /// not `kind`'s own seed code; nil otherwise.
    public static func providerCode(_ code: String?, kind: VaultError.Code) -> String? {
        guard let code, code != kind.seedCode, !code.isEmpty, code.utf8.count <= 64,
            code.utf8.allSatisfy({
                ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x5F
                    || $0 == 0x2D || $0 == 0x2E
            })
        else { return nil }
        return code
    }

    /// The error of a refusal (`permanent`): vaultd's kind, `message` for a
    /// human, the provider's code and its `reason`.
    public static func refusal(code: String, reason: String, message: String) -> VaultError {
        let kind = permanentKind(code)
        return VaultError(
            kind, message, providerCode: providerCode(code, kind: kind), providerMessage: reason)
    }

    /// The error of a failure worth retrying (`transient`).
    public static func transient(code: String?, reason: String, message: String) -> VaultError {
        let kind = transientKind(code)
        return VaultError(
            kind, message, providerCode: providerCode(code, kind: kind), providerMessage: reason)
    }
}
