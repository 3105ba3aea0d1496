import Varlink

/// The stored form of a session record: a versioned JSON document.
extension SessionRecord {
    /// The format version written into every record.
    public static let formatVersion: Int64 = 1

    /// The record as the JSON document kept in the secret store.
    public func storedJSON() -> JSON {
        var tokens: [String: JSON] = ["accessToken": .string(self.tokens.accessToken.revealed)]
        tokens["refreshToken"] = self.tokens.refreshToken.map { .string($0.revealed) }
        tokens["tokenType"] = self.tokens.tokenType.map(JSON.string)
        tokens["scope"] = self.tokens.scope.map(JSON.string)
        tokens["instanceUrl"] = self.tokens.instanceURL.map(JSON.string)
        tokens["clientId"] = self.tokens.clientID.map(JSON.string)
        tokens["issuedAt"] = self.tokens.issuedAt.map { .int($0.seconds) }
        var document: [String: JSON] = [
            "version": .int(SessionRecord.formatVersion),
            "provider": .string(account.provider),
            "user": .string(account.user),
            "profile": user.json(),
            "tokens": .object(tokens),
            "createdAt": .int(createdAt.seconds),
            "ownerUid": .int(Int64(ownerUID)),
            "phase": .string(phase.rawValue),
        ]
        document["expiresAt"] = expiresAt.map { .int($0.seconds) }
        document["revocationId"] = revocationID.map(JSON.string)
        return .object(document)
    }

    /// Reads a record from its stored JSON document.
    public init(storedJSON json: JSON) throws(VaultError) {
        var fields = StoredRecordFields()
        if case .object(let members) = json {
            for (name, value) in members { fields.set(name, value) }
        }
        if case .object(let members)? = json["tokens"] {
            fields.hasTokens = true
            for (name, value) in members { fields.setToken(name, value) }
        }
        try self.init(fields)
    }

    /// Reads a record from the bytes of its stored JSON document, as
    /// `init(storedJSON:)` reads the parsed document, without building the
    /// document's dictionaries: start-up reads 100,000 of them.
    public init(storedDocument bytes: UnsafeBufferPointer<UInt8>) throws(VaultError) {
        var fields = StoredRecordFields()
        var parser = JSONParser(bytes: bytes)
        do throws(JSONParseError) {
            var names = MemberNames()
            parser.skipWhitespace()
            try parser.parseMembers { (name, nameStart, parser) throws(JSONParseError) in
                try names.insert(name, at: nameStart)
                guard name == "tokens", parser.bytes[parser.index] == UInt8(ascii: "{") else {
                    fields.set(name, try parser.parseValue())
                    return
                }
                fields.hasTokens = true
                var tokenNames = MemberNames()
                try parser.parseMembers { (name, nameStart, parser) throws(JSONParseError) in
                    try tokenNames.insert(name, at: nameStart)
                    fields.setToken(name, try parser.parseValue())
                }
            }
            parser.skipWhitespace()
            if parser.index != bytes.count { throw parser.fail("unexpected data after the value") }
        } catch {
            throw VaultError(.storeFailed, "stored session record: \(error)")
        }
        try self.init(fields)
    }

    private init(_ fields: StoredRecordFields) throws(VaultError) {
        func bad(_ what: String) -> VaultError { VaultError(.storeFailed, "stored session record: \(what)") }
        guard fields.version?.integerValue == SessionRecord.formatVersion else {
            throw bad("unsupported format version \(fields.version?.text ?? "none")")
        }
        guard let provider = fields.provider?.stringValue, let user = fields.user?.stringValue else {
            throw bad("provider or user missing")
        }
        guard fields.hasTokens, let access = fields.accessToken?.stringValue else {
            throw bad("access token missing")
        }
        guard let created = fields.createdAt?.integerValue, let owner = fields.ownerUid?.integerValue,
            let ownerUID = UInt32(exactly: owner)
        else { throw bad("createdAt or ownerUid missing") }
        var set = TokenSet(accessToken: Secret(access))
        set.refreshToken = fields.refreshToken?.stringValue.map(Secret.init)
        set.tokenType = fields.tokenType?.stringValue
        set.scope = fields.scope?.stringValue
        set.instanceURL = fields.instanceUrl?.stringValue
        set.clientID = fields.clientId?.stringValue
        // Stored times are kept in a sane range: a record from a bug or from
        // another program must not overflow the arithmetic of the schedule.
        set.issuedAt = fields.issuedAt?.integerValue.map { UnixTime(seconds: $0).clampedToSaneRange }
        let profile = try UserProfile(json: fields.profile ?? .object(["uid": .string(user)]))
        self.init(
            account: Account(provider: provider, user: user), user: profile, tokens: set,
            createdAt: UnixTime(seconds: created).clampedToSaneRange,
            expiresAt: fields.expiresAt?.integerValue.map { UnixTime(seconds: $0).clampedToSaneRange },
            ownerUID: ownerUID)
        guard let phase = RecordPhase(rawValue: fields.phase?.stringValue ?? "active") else {
            throw bad("unknown phase")
        }
        self.phase = phase
        self.revocationID = fields.revocationId?.stringValue
    }
}

/// The members of a stored record's document that its decoder reads; the
/// rest are ignored (a queued revocation's marks, members of later versions).
private struct StoredRecordFields {
    var version, provider, user, profile, createdAt, ownerUid, phase, expiresAt, revocationId: JSON?
    /// The document has a `tokens` object.
    var hasTokens = false
    var accessToken, refreshToken, tokenType, scope, instanceUrl, clientId, issuedAt: JSON?

    mutating func set(_ name: String, _ value: JSON) {
        switch name {
        case "version": version = value
        case "provider": provider = value
        case "user": user = value
        case "profile": profile = value
        case "createdAt": createdAt = value
        case "ownerUid": ownerUid = value
        case "phase": phase = value
        case "expiresAt": expiresAt = value
        case "revocationId": revocationId = value
        default: break
        }
    }

    mutating func setToken(_ name: String, _ value: JSON) {
        switch name {
        case "accessToken": accessToken = value
        case "refreshToken": refreshToken = value
        case "tokenType": tokenType = value
        case "scope": scope = value
        case "instanceUrl": instanceUrl = value
        case "clientId": clientId = value
        case "issuedAt": issuedAt = value
        default: break
        }
    }
}

/// The member names of one object read so far, to refuse a repeated one as
/// the parser does; a stored record's objects have about ten members.
private struct MemberNames {
    private var names: [String] = []

    mutating func insert(_ name: String, at offset: Int) throws(JSONParseError) {
        if names.contains(name) { throw JSONParseError(reason: "duplicate member name", offset: offset) }
        names.append(name)
    }
}

extension UserProfile {
    /// The OpenID Connect claims (OpenID Connect Core 5.1) kept in
    /// `metadata`, beside `name` and `picture` (the avatar).
    public static let keptClaims = [
        "sub", "iss", "email", "email_verified", "preferred_username", "given_name", "family_name", "locale",
    ]

    /// The profile an id_token's claims describe, read without verifying
    /// them: `name` (else `preferred_username`, else `nickname`) is the
    /// name, `picture` the avatar, and `keptClaims` go into `metadata`.
    /// Claims of the wrong type are left out. The uid is empty: it is the
    /// session's user, never the token's `sub` (see `owned(by:)`).
    public init(idTokenClaims claims: [String: JSON]) {
        self.init(uid: "")
        name =
            claims["name"]?.stringValue ?? claims["preferred_username"]?.stringValue
            ?? claims["nickname"]?.stringValue
        avatar = claims["picture"]?.stringValue
        var metadata: [String: JSON] = [:]
        for key in UserProfile.keptClaims {
            switch claims[key] {
            case .string(let value)?: metadata[key] = .string(value)
            case .bool(let value)?: metadata[key] = .bool(value)
            default: break
            }
        }
        if !metadata.isEmpty { self.metadata = .object(metadata) }
    }

    /// Reads the profile an exec helper answered: the fields of
    /// `init(json:)`, where `uid` may be left out (it is the session's user
    /// whatever the helper says, see `owned(by:)`).
    public init(providerJSON json: JSON) throws(VaultError) {
        guard case .object(var o) = json else {
            throw VaultError(.invalidParameter, "profile must be an object, not \(json.typeName)")
        }
        o["uid"] = .string("")
        try self.init(json: .object(o))
    }

    /// This profile as the profile of `user`'s session: its uid is `user`.
    public func owned(by user: String) -> UserProfile {
        var profile = self
        profile.uid = user
        return profile
    }

    /// The profile as a JSON object with CometChat's field names.
    public func json() -> JSON {
        var o: [String: JSON] = ["uid": .string(uid)]
        o["name"] = name.map(JSON.string)
        o["avatar"] = avatar.map(JSON.string)
        o["role"] = role.map(JSON.string)
        o["metadata"] = metadata
        o["status"] = status.map(JSON.string)
        o["statusMessage"] = statusMessage.map(JSON.string)
        o["lastActiveAt"] = lastActiveAt.map { .int($0.seconds) }
        o["deactivatedAt"] = deactivatedAt.map { .int($0.seconds) }
        return .object(o)
    }

    /// Reads a profile from a JSON object; every field but `uid` is optional.
    public init(json: JSON) throws(VaultError) {
        guard case .object(let o) = json else {
            throw VaultError(.invalidParameter, "profile must be an object, not \(json.typeName)")
        }
        // Most profiles are the uid alone (every restored record reads one).
        if o.count == 1, case .string(let uid)? = o["uid"] {
            self.init(uid: uid)
            return
        }
        func string(_ key: String) throws(VaultError) -> String? {
            guard let v = o[key], v != .null else { return nil }
            guard let s = v.stringValue else {
                throw VaultError(.invalidParameter, "profile.\(key) must be a string, not \(v.typeName)")
            }
            return s
        }
        func time(_ key: String) throws(VaultError) -> UnixTime? {
            guard let v = o[key], v != .null else { return nil }
            guard let t = v.integerValue else {
                throw VaultError(.invalidParameter, "profile.\(key) must be an integer (Unix seconds)")
            }
            return UnixTime(seconds: t)
        }
        guard let uid = try string("uid") else { throw VaultError(.invalidParameter, "profile.uid is missing") }
        self.init(uid: uid)
        name = try string("name")
        avatar = try string("avatar")
        role = try string("role")
        if let m = o["metadata"], m != .null {
            guard case .object = m else { throw VaultError(.invalidParameter, "profile.metadata must be an object") }
            metadata = m
        }
        status = try string("status")
        statusMessage = try string("statusMessage")
        lastActiveAt = try time("lastActiveAt")
        deactivatedAt = try time("deactivatedAt")
    }
}
