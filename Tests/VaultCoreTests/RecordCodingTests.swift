import Testing
import Varlink
import VaultCore

@Suite("SessionRecord stored JSON", .timeLimit(.minutes(5)))
struct RecordCodingTests {
    @Test("Should read back a record with every optional field set")
    func roundTripFull() throws {
        let record = Fixtures.fullRecord()
        let decoded = try SessionRecord(storedJSON: record.storedJSON())
        #expect(decoded == record)
        #expect(decoded.tokens.refreshToken?.revealed == "5Aep861refresh_token_value")
        #expect(decoded.user.metadata == ["team": "blue", "level": 3, "tags": ["x", "y"]])
        #expect(decoded.ownerUID == 4_000_000_000)
    }

    @Test("Should read back a minimal record")
    func roundTripMinimal() throws {
        let record = Fixtures.record()
        #expect(try SessionRecord(storedJSON: record.storedJSON()) == record)
    }

    @Test("Should survive the trip through its serialized text")
    func roundTripText() throws {
        let record = Fixtures.fullRecord()
        #expect(try SessionRecord(storedJSON: JSON.parse(record.storedJSON().text)) == record)
    }

    @Test("Should keep the loggingOut phase through a round trip")
    func phase() throws {
        var record = Fixtures.fullRecord()
        record.phase = .loggingOut
        let json = record.storedJSON()
        #expect(json["phase"] == "loggingOut")
        #expect(try SessionRecord(storedJSON: json).phase == .loggingOut)
    }

    @Test("Should write the documented member names, the secret in clear")
    func layout() {
        let json = Fixtures.fullRecord().storedJSON()
        #expect(json["version"] == 1)
        #expect(json["provider"] == "salesforce")
        #expect(json["user"] == "alice@example.com")
        #expect(json["createdAt"] == .int(1_700_000_001))
        #expect(json["expiresAt"] == .int(1_700_007_200))
        #expect(json["ownerUid"] == .int(4_000_000_000))
        #expect(json["phase"] == "active")
        #expect(json["tokens"]?["accessToken"] == "00Dxx0000001gPL!AQ4AQFhz_access")
        #expect(json["tokens"]?["instanceUrl"] == "https://example.my.salesforce.com")
        #expect(json["tokens"]?["clientId"] == "3MVG9client")
        #expect(json["tokens"]?["issuedAt"] == .int(1_700_000_000))
        #expect(json["profile"]?["statusMessage"] == "in a meeting")
    }

    @Test("Should leave absent optional fields out of the document")
    func minimalLayout() {
        let json = Fixtures.record().storedJSON()
        #expect(json["expiresAt"] == nil)
        #expect(json["tokens"]?.objectValue?.keys.sorted() == ["accessToken"])
        #expect(json["profile"] == ["uid": "alice"])
    }

    @Test("Should default a missing profile to the user id and a missing phase to active")
    func defaults() throws {
        let json: JSON = [
            "version": 1, "provider": "demo", "user": "alice", "tokens": ["accessToken": "t"], "createdAt": 5,
            "ownerUid": 1000,
        ]
        let record = try SessionRecord(storedJSON: json)
        #expect(record.user == UserProfile(uid: "alice"))
        #expect(record.phase == .active)
        #expect(record.expiresAt == nil)
    }

    @Test(
        "Should refuse a document it cannot read as storeFailed",
        arguments: [
            ("version", JSON.int(2)), ("version", "1"), ("version", nil), ("provider", 5), ("user", nil),
            ("tokens", "t"), ("createdAt", "now"), ("ownerUid", -1), ("ownerUid", .int(4_294_967_296)),
            ("phase", "gone"),
        ] as [(String, JSON)])
    func unreadable(member: String, value: JSON) throws {
        guard case .object(var o) = Fixtures.record().storedJSON() else {
            Issue.record("not an object")
            return
        }
        o[member] = value
        let error = try #require(throws: VaultError.self) { try SessionRecord(storedJSON: .object(o)) }
        #expect(error.code == .storeFailed)
    }

    @Test("Should name an unsupported version in the error")
    func unsupportedVersion() throws {
        guard case .object(var o) = Fixtures.record().storedJSON() else { return }
        o["version"] = 2
        let error = try #require(throws: VaultError.self) { try SessionRecord(storedJSON: .object(o)) }
        #expect(error.code == .storeFailed)
        #expect(error.message == "stored session record: unsupported format version 2")
    }
}

/// Decodes `text` with the byte decoder start-up uses.
private func decodeDocument(_ text: String) throws(VaultError) -> SessionRecord {
    let bytes = Array(text.utf8)
    let result = bytes.withUnsafeBufferPointer { buffer -> Result<SessionRecord, VaultError> in
        do throws(VaultError) { return .success(try SessionRecord(storedDocument: buffer)) } catch {
            return .failure(error)
        }
    }
    return try result.get()
}

@Suite("SessionRecord stored document, read from its bytes", .timeLimit(.minutes(5)))
struct StoredDocumentTests {
    @Test("Should read what it writes, as the JSON reader does", arguments: [false, true, nil] as [Bool?])
    func roundTrip(full: Bool?) throws {
        var record = full == true ? Fixtures.fullRecord() : Fixtures.record()
        if full == nil {
            record = Fixtures.fullRecord()
            record.phase = .loggingOut
            record.revocationID = "0123456789abcdef"
        }
        let text = record.storedJSON().text
        let decoded = try decodeDocument(text)
        #expect(decoded == record)
        #expect(decoded == (try SessionRecord(storedJSON: JSON.parse(text))))
        #expect(decoded.tokens.refreshToken?.revealed == record.tokens.refreshToken?.revealed)
        #expect(decoded.revocationID == record.revocationID)
    }

    @Test("Should ignore members it does not know, nested ones too, and read whitespace and escapes")
    func unknownMembers() throws {
        let text = #"""
             { "extra": {"a": [1, {"b": null}]}, "version": 1, "provider": "demo", "user": "al\u0069ce",
              "tokens": {"accessToken": "t\"q", "future": [true]}, "createdAt": 5, "ownerUid": 1000,
              "revocationOfReplaced": true }
            """#
        let record = try decodeDocument(text)
        #expect(record == (try SessionRecord(storedJSON: JSON.parse(text))))
        #expect(record.account.user == "alice")
        #expect(record.tokens.accessToken.revealed == "t\"q")
    }

    @Test(
        "Should refuse what the JSON reader refuses, with its code and message",
        arguments: [
            ("version", JSON.int(2)), ("version", "1"), ("version", nil), ("provider", 5), ("user", nil),
            ("tokens", "t"), ("tokens", [:]), ("createdAt", "now"), ("ownerUid", -1),
            ("ownerUid", .int(4_294_967_296)), ("phase", "gone"), ("profile", "p"),
        ] as [(String, JSON)])
    func unreadable(member: String, value: JSON) throws {
        guard case .object(var o) = Fixtures.record().storedJSON() else {
            Issue.record("not an object")
            return
        }
        o[member] = value
        let text = JSON.object(o).text
        let viaJSON = try #require(throws: VaultError.self) { try SessionRecord(storedJSON: JSON.parse(text)) }
        let error = try #require(throws: VaultError.self) { try decodeDocument(text) }
        #expect(error.code == viaJSON.code)
        #expect(error.message == viaJSON.message)
    }

    @Test(
        "Should refuse a document that is not one JSON object: repeated names, trailing data, truncation",
        arguments: [
            #"{"version": 1, "provider": "demo", "user": "alice", "tokens": {"accessToken": "t"}, "createdAt": 5, "ownerUid": 1000, "user": "bob"}"#,
            #"{"version": 1, "provider": "demo", "user": "alice", "tokens": {"accessToken": "t", "accessToken": "u"}, "createdAt": 5, "ownerUid": 1000}"#,
            #"{"version": 1, "provider": "demo", "user": "alice", "tokens": {"accessToken": "t"}, "createdAt": 5, "ownerUid": 1000} {}"#,
            #"{"version": 1, "provider": "demo", "user": "alice", "tokens": {"accessToken": "t"}, "createdAt": 5, "ownerUid": 1000"#,
            #"{"version": 1, "provider": "demo", "user": "alice", "tokens": {"accessToken": "t"}, "createdAt": 5, "ownerUid": 1000,}"#,
            #"[1]"#, "",
        ])
    func malformed(text: String) throws {
        #expect(throws: (any Error).self) { try SessionRecord(storedJSON: JSON.parse(text)) }
        let error = try #require(throws: VaultError.self) { try decodeDocument(text) }
        #expect(error.code == .storeFailed)
        #expect(error.message.hasPrefix("stored session record: "))
    }
}

@Suite("SessionRecord", .timeLimit(.minutes(5)))
struct SessionRecordTests {
    @Test("Should be expired at and after its expiry, never without one")
    func expiry() {
        var record = Fixtures.record()
        #expect(!record.isExpired(at: UnixTime(seconds: .max)))
        record.expiresAt = UnixTime(seconds: 100)
        #expect(!record.isExpired(at: UnixTime(seconds: 99)))
        #expect(record.isExpired(at: UnixTime(seconds: 100)))
        #expect(record.isExpired(at: UnixTime(seconds: 101)))
    }

    @Test("Should label its store item with user and provider")
    func storeLabel() {
        #expect(Fixtures.record().storeLabel == "vaultd: alice @ demo")
    }

    @Test("Should start active")
    func active() {
        #expect(Fixtures.record().phase == .active)
    }
}

@Suite("UserProfile JSON", .timeLimit(.minutes(5)))
struct UserProfileTests {
    @Test("Should read back every field it writes")
    func roundTrip() throws {
        let profile = Fixtures.fullRecord().user
        #expect(try UserProfile(json: profile.json()) == profile)
    }

    @Test("Should treat null fields as absent")
    func nulls() throws {
        let profile = try UserProfile(json: ["uid": "u", "name": nil, "metadata": nil, "lastActiveAt": nil])
        #expect(profile == UserProfile(uid: "u"))
    }

    @Test(
        "Should refuse a field of the wrong type as invalidParameter, naming the field",
        arguments: [
            ("name", JSON.int(1), "profile.name"), ("avatar", true, "profile.avatar"), ("role", [], "profile.role"),
            ("status", 2, "profile.status"), ("statusMessage", [:], "profile.statusMessage"),
            ("metadata", "x", "profile.metadata"), ("metadata", [1], "profile.metadata"),
            ("lastActiveAt", "yesterday", "profile.lastActiveAt"),
            ("deactivatedAt", .number(1.5), "profile.deactivatedAt"),
            ("uid", 7, "profile.uid"),
        ] as [(String, JSON, String)])
    func wrongType(field: String, value: JSON, name: String) throws {
        var o: [String: JSON] = ["uid": "u"]
        o[field] = value
        let error = try #require(throws: VaultError.self) { try UserProfile(json: .object(o)) }
        #expect(error.code == .invalidParameter)
        #expect(error.message.hasPrefix(name + " must be"))
    }

    @Test("Should refuse a profile without uid, or one that is not an object")
    func missingUID() throws {
        let missing = try #require(throws: VaultError.self) { try UserProfile(json: ["name": "n"]) }
        #expect(missing.code == .invalidParameter)
        #expect(missing.message == "profile.uid is missing")
        let notObject = try #require(throws: VaultError.self) { try UserProfile(json: "u") }
        #expect(notObject.code == .invalidParameter)
        #expect(notObject.message == "profile must be an object, not string")
    }
}
