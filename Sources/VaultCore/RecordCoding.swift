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
        func bad(_ what: String) -> VaultError { VaultError(.storeFailed, "stored session record: \(what)") }
        guard json["version"]?.integerValue == SessionRecord.formatVersion else {
            throw bad("unsupported format version \(json["version"]?.text ?? "none")")
        }
        guard let provider = json["provider"]?.stringValue, let user = json["user"]?.stringValue else {
            throw bad("provider or user missing")
        }
        guard let tokens = json["tokens"], let access = tokens["accessToken"]?.stringValue else {
            throw bad("access token missing")
        }
        guard let created = json["createdAt"]?.integerValue, let owner = json["ownerUid"]?.integerValue,
            let ownerUID = UInt32(exactly: owner)
        else { throw bad("createdAt or ownerUid missing") }
        var set = TokenSet(accessToken: Secret(access))
        set.refreshToken = tokens["refreshToken"]?.stringValue.map(Secret.init)
        set.tokenType = tokens["tokenType"]?.stringValue
        set.scope = tokens["scope"]?.stringValue
        set.instanceURL = tokens["instanceUrl"]?.stringValue
        set.clientID = tokens["clientId"]?.stringValue
        // Stored times are kept in a sane range: a record from a bug or from
        // another program must not overflow the arithmetic of the schedule.
        set.issuedAt = tokens["issuedAt"]?.integerValue.map { UnixTime(seconds: $0).clampedToSaneRange }
        let profile = try UserProfile(json: json["profile"] ?? .object(["uid": .string(user)]))
        self.init(
            account: Account(provider: provider, user: user), user: profile, tokens: set,
            createdAt: UnixTime(seconds: created).clampedToSaneRange,
            expiresAt: json["expiresAt"]?.integerValue.map { UnixTime(seconds: $0).clampedToSaneRange },
            ownerUID: ownerUID)
        guard let phase = RecordPhase(rawValue: json["phase"]?.stringValue ?? "active") else {
            throw bad("unknown phase")
        }
        self.phase = phase
        self.revocationID = json["revocationId"]?.stringValue
    }
}

extension UserProfile {
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
