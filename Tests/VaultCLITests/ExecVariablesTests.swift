import Testing
import VaultCore

@testable import VaultCLI

/// The variables `vaultctl exec --env ...` gives its command, as names and fields.
private func variables(_ options: [String]) -> [String]? {
    guard case .success(let list) = VaultCtl.execVariables(options) else { return nil }
    return list.map { "\($0.name)=\($0.field.rawValue)" }
}

@Suite("vaultctl exec's variables", .timeLimit(.minutes(5)))
struct ExecVariablesTests {
    static let own = [
        "VAULTD_TOKEN_TYPE=type", "VAULTD_EXPIRES_AT=expires_at", "VAULTD_INSTANCE_URL=instance_url",
        "VAULTD_SCOPE=scope", "VAULTD_PROVIDER=provider", "VAULTD_USER=user",
    ]

    @Test("Should give every field its VAULTD_ variable, the token under VAULTD_TOKEN by default")
    func defaults() {
        #expect(variables([]) == ["VAULTD_TOKEN=token"] + Self.own)
    }

    @Test("Should put the token under --env NAME instead of VAULTD_TOKEN, as before")
    func bareName() {
        #expect(variables(["API_TOKEN"]) == Self.own + ["API_TOKEN=token"])
    }

    @Test("Should add --env NAME=FIELD beside the VAULTD_ variables, each field by its name")
    func namedFields() {
        #expect(
            variables(["SF_URL=instance_url", "BEARER=token", "EXP=expires_at"])
                == ["VAULTD_TOKEN=token"] + Self.own + ["SF_URL=instance_url", "BEARER=token", "EXP=expires_at"])
        for field in SessionField.allCases {
            #expect(variables(["X=\(field.rawValue)"])?.last == "X=\(field.rawValue)")
        }
    }

    @Test("Should refuse a bad NAME or FIELD, listing the fields")
    func refusals() {
        for bad in ["", "1A", "A-B=token", "=token", "A=", "A=Token", "A=instanceUrl", "A=token=x"] {
            guard case .failure(let problem) = VaultCtl.execVariables([bad]) else {
                Issue.record("accepted --env \(bad)")
                continue
            }
            #expect(problem.message.hasPrefix("--env "), "\(problem.message)")
        }
        guard case .failure(let problem) = VaultCtl.execVariables(["A=url"]) else { return }
        #expect(problem.message.contains("token, type, expires_at, instance_url, scope, provider, user"))
    }
}
