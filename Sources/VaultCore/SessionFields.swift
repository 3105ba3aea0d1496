import Varlink

/// A field of a session that the sinks hand to programs that cannot speak
/// Varlink: `vaultctl exec` (its variables, and `--env NAME=FIELD`) and the
/// token files of `TokenFileFormat=json` and `env`. The raw value is the
/// name the command line and the JSON file use.
public enum SessionField: String, CaseIterable, Sendable {
    /// The access token.
    case token
    /// The token type (`Bearer`), when the provider named one.
    case type
    /// When the access token expires, in Unix seconds, when known.
    case expiresAt = "expires_at"
    /// Salesforce's instance URL, when the provider sent one.
    case instanceURL = "instance_url"
    /// The OAuth 2.0 scope granted, when the provider said.
    case scope
    /// The provider's name.
    case provider
    /// The user at the provider.
    case user

    /// The variable that carries the field, in `vaultctl exec`'s command's
    /// environment and in an env token file.
    public var variable: String {
        switch self {
        case .token: "VAULTD_TOKEN"
        case .type: "VAULTD_TOKEN_TYPE"
        case .expiresAt: "VAULTD_EXPIRES_AT"
        case .instanceURL: "VAULTD_INSTANCE_URL"
        case .scope: "VAULTD_SCOPE"
        case .provider: "VAULTD_PROVIDER"
        case .user: "VAULTD_USER"
        }
    }

    /// The fields' names, for messages: `token, type, ...`.
    public static let names = allCases.map(\.rawValue).joined(separator: ", ")
}

/// The session as a sink hands it on: the access token and what a program
/// needs beside it to use it. Equal values write equal files.
public struct SessionFields: Sendable, Equatable {
    public var token: Secret
    public var tokenType: String?
    /// Unix seconds.
    public var expiresAt: Int64?
    public var instanceURL: String?
    public var scope: String?
    public var provider: String
    public var user: String

    /// Fields from their values.
    public init(
        token: Secret, tokenType: String? = nil, expiresAt: Int64? = nil, instanceURL: String? = nil,
        scope: String? = nil, provider: String, user: String
    ) {
        self.token = token
        self.tokenType = tokenType
        self.expiresAt = expiresAt
        self.instanceURL = instanceURL
        self.scope = scope
        self.provider = provider
        self.user = user
    }

    /// The fields of a stored session.
    public init(_ record: SessionRecord) {
        self.init(
            token: record.accessToken, tokenType: record.tokenType, expiresAt: record.expiresAt?.seconds,
            instanceURL: record.instanceURL, scope: record.scope, provider: record.account.provider,
            user: record.account.user)
    }

    /// The value of a field other than the token, nil when the session has
    /// none (the token is a `Secret`: read it from `token`).
    public func text(_ field: SessionField) -> String? {
        switch field {
        case .token: nil
        case .type: tokenType
        case .expiresAt: expiresAt.map { String($0) }
        case .instanceURL: instanceURL
        case .scope: scope
        case .provider: provider
        case .user: user
        }
    }
}

/// Why a session cannot be written in a file format; names the field, never its value.
public struct SessionFormatError: Error, Equatable, CustomStringConvertible {
    /// The field whose value the format cannot carry.
    public var field: SessionField

    /// The error of `field`.
    public init(field: SessionField) { self.field = field }

    public var description: String {
        "the session's \(field.rawValue) holds a character an env file cannot carry (a single quote, a control character, a byte order mark or a Unicode noncharacter); use TokenFileFormat=json"
    }
}

extension SessionFields {
    /// The JSON document of `TokenFileFormat=json`: one object with every
    /// field the session has, under the names of `SessionField`, in their
    /// order, and a newline; `expires_at` a number, the rest strings.
    ///
    /// The bytes hold the token: the caller zeroes them (`Secret.wipe`) when done.
    public func json() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(capacity)
        out.append(contentsOf: #"{"token":"#.utf8)
        token.withUTF8 { JSON.writeString(utf8: $0, into: &out) }
        for field in SessionField.allCases.dropFirst() {
            guard let value = text(field) else { continue }
            out.append(UInt8(ascii: ","))
            JSON.writeString(field.rawValue, into: &out)
            out.append(UInt8(ascii: ":"))
            if field == .expiresAt {
                out.append(contentsOf: value.utf8)
            } else {
                JSON.writeString(value, into: &out)
            }
        }
        out.append(contentsOf: "}\n".utf8)
        return out
    }

    /// The lines of `TokenFileFormat=env`: `VARIABLE=VALUE` for every field
    /// the session has, under `SessionField.variable`, in their order, for
    /// systemd's `EnvironmentFile=` (systemd.exec(5)) and a POSIX shell's
    /// `set -a; . FILE` alike. A value of letters, digits and `-._~+/=:@%,`
    /// is written as it is; any other in single quotes, which both read
    /// verbatim. A value that holds a single quote, a control character
    /// (a newline among them), U+FEFF or a Unicode noncharacter is refused:
    /// no quoting reads back the same in both, and systemd refuses the last two.
    ///
    /// The bytes hold the token: the caller zeroes them (`Secret.wipe`) when done.
    public func environmentFile() throws(SessionFormatError) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(capacity)
        var refused: SessionField?
        token.withUTF8 { bytes in
            if !Self.appendAssignment(SessionField.token.variable, bytes, to: &out) { refused = .token }
        }
        for field in SessionField.allCases.dropFirst() where refused == nil {
            guard var value = text(field) else { continue }
            value.withUTF8 { bytes in
                if !Self.appendAssignment(field.variable, bytes, to: &out) { refused = field }
            }
        }
        if let refused {
            out.withUnsafeMutableBytes { Secret.wipe($0) }
            throw SessionFormatError(field: refused)
        }
        return out
    }

    /// Enough for every format of these fields, escapes included, so the
    /// buffer never grows (a growth would free a copy of the token unzeroed).
    private var capacity: Int {
        let values = SessionField.allCases.dropFirst().compactMap { text($0)?.utf8.count }
        return 256 + 6 * token.utf8Count + 6 * values.reduce(0, +)
    }

    /// Appends `NAME=VALUE` and a newline, the value quoted when it must be;
    /// false (and nothing appended) when it cannot be written.
    static func appendAssignment(_ name: String, _ value: UnsafeBufferPointer<UInt8>, to out: inout [UInt8]) -> Bool {
        guard environmentFileCarries(value) else { return false }
        let bare = !value.isEmpty && value.allSatisfy(isPlain)
        out.append(contentsOf: name.utf8)
        out.append(UInt8(ascii: "="))
        if !bare { out.append(UInt8(ascii: "'")) }
        out.append(contentsOf: value)
        if !bare { out.append(UInt8(ascii: "'")) }
        out.append(UInt8(ascii: "\n"))
        return true
    }

    /// Whether `value` reads back the same from single quotes in systemd's
    /// EnvironmentFile= and in a POSIX shell: valid UTF-8 with no single
    /// quote, no control character, no U+FEFF and no noncharacter.
    static func environmentFileCarries(_ value: UnsafeBufferPointer<UInt8>) -> Bool {
        var scalars = value.makeIterator()
        var decoder = UTF8()
        while true {
            switch decoder.decode(&scalars) {
            case .scalarValue(let scalar):
                let v = scalar.value
                if v < 0x20 || v == 0x7F || v == 0x27 || (0x80...0x9F).contains(v) || v == 0xFEFF
                    || (0xFDD0...0xFDEF).contains(v) || v & 0xFFFE == 0xFFFE
                {
                    return false
                }
            case .emptyInput: return true
            case .error: return false
            }
        }
    }

    /// The bytes written without quotes: letters, digits and `-._~+/=:@%,`.
    static func isPlain(_ byte: UInt8) -> Bool {
        switch byte {
        case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
            UInt8(ascii: "0")...UInt8(ascii: "9"):
            return true
        default:
            return "-._~+/=:@%,".utf8.contains(byte)
        }
    }
}
