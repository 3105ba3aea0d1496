import Testing
import Varlink
import VaultCore

/// A session with every field, `scope` as given.
private func session(scope: String? = "api refresh_token", token: String = "eyJ0.abc-DEF_123.sig") -> SessionFields {
    SessionFields(
        token: Secret(token), tokenType: "Bearer", expiresAt: 1_800_000_000,
        instanceURL: "https://example.my.salesforce.com", scope: scope, provider: "salesforce", user: "alice")
}

/// The text of an env document, or the refusal.
private func env(_ fields: SessionFields) -> Result<String, SessionFormatError> {
    do throws(SessionFormatError) {
        return .success(String(decoding: try fields.environmentFile(), as: UTF8.self))
    } catch {
        return .failure(error)
    }
}

@Suite("The session's fields in sinks", .timeLimit(.minutes(5)))
struct SessionFieldsTests {
    @Test("Should name each field for the command line and give it its VAULTD_ variable")
    func names() {
        #expect(
            SessionField.allCases.map(\.rawValue) == [
                "token", "type", "expires_at", "instance_url", "scope", "provider", "user",
            ])
        #expect(
            SessionField.allCases.map(\.variable) == [
                "VAULTD_TOKEN", "VAULTD_TOKEN_TYPE", "VAULTD_EXPIRES_AT", "VAULTD_INSTANCE_URL", "VAULTD_SCOPE",
                "VAULTD_PROVIDER", "VAULTD_USER",
            ])
    }

    @Test("Should write every field the session has as one JSON object, expires_at a number")
    func json() throws {
        let text = String(decoding: session().json(), as: UTF8.self)
        #expect(text.hasSuffix("}\n"))
        let parsed = try JSON.parse(Array(text.utf8))
        #expect(
            parsed
                == .object([
                    "token": "eyJ0.abc-DEF_123.sig", "type": "Bearer", "expires_at": .int(1_800_000_000),
                    "instance_url": "https://example.my.salesforce.com", "scope": "api refresh_token",
                    "provider": "salesforce", "user": "alice",
                ]))
        let bare = SessionFields(token: Secret("t"), provider: "demo", user: "bob")
        #expect(String(decoding: bare.json(), as: UTF8.self) == #"{"token":"t","provider":"demo","user":"bob"}"# + "\n")
    }

    @Test("Should escape quotes, backslashes and control characters in JSON")
    func jsonEscapes() throws {
        let odd = "a \"b\" \\ c\nd\u{1}"
        let parsed = try JSON.parse(session(scope: odd, token: "t\"\n").json())
        #expect(parsed["scope"]?.stringValue == odd)
        #expect(parsed["token"]?.stringValue == "t\"\n")
    }

    @Test("Should write env lines bare when plain, in single quotes otherwise, in field order")
    func envLines() {
        let text = env(session(scope: #"read "write" a\b $HOME #x"#))
        #expect(
            text
                == .success(
                    """
                    VAULTD_TOKEN=eyJ0.abc-DEF_123.sig
                    VAULTD_TOKEN_TYPE=Bearer
                    VAULTD_EXPIRES_AT=1800000000
                    VAULTD_INSTANCE_URL=https://example.my.salesforce.com
                    VAULTD_SCOPE='read "write" a\\b $HOME #x'
                    VAULTD_PROVIDER=salesforce
                    VAULTD_USER=alice

                    """))
        let bare = SessionFields(token: Secret("t"), scope: "", provider: "demo", user: "bob é")
        #expect(env(bare) == .success("VAULTD_TOKEN=t\nVAULTD_SCOPE=''\nVAULTD_PROVIDER=demo\nVAULTD_USER='bob é'\n"))
    }

    @Test("Should refuse in env a value no quoting carries, naming the field and never the value")
    func envRefusals() {
        let noncharacters = [0xFFFE, 0xFDD0, 0x1FFFF].map { "a" + String(Character(Unicode.Scalar(UInt32($0))!)) }
        for bad in ["it's", "a\nb", "a\rb", "a\tb", "a\u{7F}", "a\u{85}", "\u{FEFF}a"] + noncharacters {
            #expect(env(session(scope: bad)) == .failure(SessionFormatError(field: .scope)), "\(bad.debugDescription)")
        }
        let token = env(session(token: "secret'value"))
        #expect(token == .failure(SessionFormatError(field: .token)))
        if case .failure(let error) = token {
            #expect(!error.description.contains("secret"))
            #expect(error.description.contains("token") && error.description.contains("TokenFileFormat=json"))
        }
        let invalid = SessionFields(token: Secret(utf8: [0x61, 0xFF]), provider: "p", user: "u")
        #expect(env(invalid) == .failure(SessionFormatError(field: .token)), "bytes that are not UTF-8")
    }

    @Test("Should read TokenFileFormat= raw, json and env, raw by default, and refuse others")
    func configKey() throws {
        func parse(_ lines: [String]) throws(VaultError) -> TokenFileSettings? {
            let text = (["[Provider demo]", "Type=static", "[Account demo alice]"] + lines).joined(separator: "\n")
            return try ConfigParser.parse(text, file: "/etc/vaultd/vaultd.conf").accounts[
                Account(provider: "demo", user: "alice")]?.tokenFile
        }
        #expect(try parse(["TokenFile=/run/t"])?.format == .raw)
        for format in TokenFileFormat.allCases {
            #expect(try parse(["TokenFile=/run/t", "TokenFileFormat=\(format.rawValue)"])?.format == format)
        }
        let wrong = #expect(throws: VaultError.self) { try parse(["TokenFile=/run/t", "TokenFileFormat=yaml"]) }
        #expect(wrong?.message == "/etc/vaultd/vaultd.conf:5: key 'TokenFileFormat': expected raw, json or env")
        let alone = #expect(throws: VaultError.self) { try parse(["TokenFileFormat=json"]) }
        #expect(alone?.message.contains("'TokenFileFormat' needs TokenFile=") == true, "\(alone?.message ?? "")")
    }
}
