import Varlink

extension VaultMethod {
    /// The declarations of the browser login's two methods (authorization
    /// code with PKCE on a loopback redirect, RFC 7636 and RFC 8252 7.3).
    var browserLoginDeclaration: VarlinkMethodDeclaration {
        if self == .beginBrowserLogin {
            return VarlinkMethodDeclaration(
                "BeginBrowserLogin",
                doc: """
                    Starts a browser login of an oauth2 provider with AuthorizationURL=:
                    vaultd makes a PKCE code verifier (kept in vaultd only), its S256 challenge
                    and a random state, and answers the authorization URL to open in a browser,
                    the state the redirect must bring back, the login's id and when it expires
                    (10 minutes). redirectUri is the caller's loopback listener,
                    http://127.0.0.1:PORT/ (RFC 8252 7.3). The caller must be one who may log
                    the account in. One user (but root) may have 4 browser logins pending; they
                    live in vaultd's memory only (a restart loses them).
                    """,
                parameters: [
                    VarlinkField("provider", .string),
                    VarlinkField("user", .string),
                    VarlinkField("redirectUri", .string),
                    VarlinkField("ownerUid", .nullable(.int)),
                    VarlinkField("replace", .nullable(.bool)),
                ],
                output: [
                    VarlinkField("login", .string),
                    VarlinkField("authorizationUrl", .string),
                    VarlinkField("state", .string),
                    VarlinkField("expiresAt", .int),
                ])
        }
        return VarlinkMethodDeclaration(
            "FinishBrowserLogin",
            doc: """
                Finishes a browser login with the authorization code its redirect brought:
                vaultd exchanges it at the token endpoint with the code verifier, the same
                redirect URI and the provider's client authentication, and logs the account
                in as Login does with the token response (same checks, limits and events);
                the reply is Login's. Only the user who began the login (or root) may finish
                it; for anyone else, as for an expired or finished one, the login is unknown
                (LoginExpired). state must be the login's (AuthorizationFailed). A login
                is finished once, whether the exchange works or not; a code the token endpoint
                refuses (used already, or a verifier that does not match) is GrantRevoked
                with providerCode invalid_grant.
                """,
            parameters: [
                VarlinkField("login", .string),
                VarlinkField("code", .string),
                VarlinkField("state", .string),
            ],
            output: [
                VarlinkField("session", .named("Session")),
                VarlinkField("created", .bool),
                VarlinkField("replaced", .nullable(.bool)),
            ])
    }
}
