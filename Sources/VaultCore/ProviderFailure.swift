/// How a provider's failure becomes a `VaultError`: which kind it is, and
/// which of the provider's codes reach the client unchanged. The chat SDKs
/// report the server's own code (`AUTH_ERR_APIKEY_NOT_FOUND`,
/// `ERR_INVALID_API_KEY`), so vaultd does not re-code what an exec helper
/// answered; the Varlink error name still says the kind.
public enum ProviderFailure {
    /// The code an exec provider's failure carries when its helper program
    /// could not be run at all (missing, not executable, a bad `#!` line).
    public static let helperUnavailable = VaultError.Code.helperUnavailable.seedCode

    /// The kind of a failure worth retrying: `helperUnavailable` when the
    /// helper could not be run, else `networkError`.
    public static func transientKind(_ code: String?) -> VaultError.Code {
        code == helperUnavailable ? .helperUnavailable : .networkError
    }

    /// The kind of a refusal: the kind of that seed code when vaultd has one
    /// (`ERR_UID_NOT_FOUND`, `ERR_USER_DEACTIVATED`), else `invalidCredential`.
    public static func permanentKind(_ code: String) -> VaultError.Code {
        VaultError.Code(seedCode: code) ?? .invalidCredential
    }

    /// `code` when it is written as the SDKs write theirs (a capital letter,
    /// then capitals, digits and `_`, at most 64): it goes to the client as
    /// it is. Nil for anything else, such as OAuth 2.0's lowercase
    /// `invalid_grant`, which keeps the kind's seed code.
    public static func passedThrough(_ code: String?) -> String? {
        guard let code, let first = code.utf8.first, first >= 0x41, first <= 0x5A, code.utf8.count <= 64,
            code.utf8.allSatisfy({ ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x5F })
        else { return nil }
        return code
    }
}
