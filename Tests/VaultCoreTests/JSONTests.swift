import Testing
import Varlink
import VaultCore

/// Expects `parse` to fail with exactly `reason` at byte `offset`.
private func expectParseError(
    _ reason: String, at offset: Int, sourceLocation: SourceLocation = #_sourceLocation,
    _ parse: () throws -> JSON
) {
    let error = #expect(throws: JSONParseError.self, sourceLocation: sourceLocation) { try parse() }
    #expect(error?.reason == reason, sourceLocation: sourceLocation)
    #expect(error?.offset == offset, sourceLocation: sourceLocation)
}

@Suite("JSON parsing", .timeLimit(.minutes(5)))
struct JSONParsingTests {
    @Test("Should parse every kind of scalar")
    func scalars() throws {
        #expect(try JSON.parse("null") == .null)
        #expect(try JSON.parse("true") == .bool(true))
        #expect(try JSON.parse("false") == .bool(false))
        #expect(try JSON.parse("0") == .number(0))
        #expect(try JSON.parse("-12") == .number(-12))
        #expect(try JSON.parse("3.25") == .number(3.25))
        #expect(try JSON.parse("-1.5e2") == .number(-150))
        #expect(try JSON.parse("2E+3") == .number(2000))
        #expect(try JSON.parse("5e-1") == .number(0.5))
        #expect(try JSON.parse("\"hello\"") == .string("hello"))
        #expect(try JSON.parse("\"\"") == .string(""))
    }

    @Test("Should parse empty and nested containers, with whitespace around tokens")
    func containers() throws {
        #expect(try JSON.parse("[]") == .array([]))
        #expect(try JSON.parse("{}") == .object([:]))
        let text = " \t\r\n{ \"a\" : [ 1 , { \"b\" : null } , [ ] ] , \"c\" : { \"d\" : \"e\" } }\n "
        let expected: JSON = ["a": [1, ["b": nil], []], "c": ["d": "e"]]
        #expect(try JSON.parse(text) == expected)
    }

    @Test("Should refuse an object that repeats a member name, at the repeated name")
    func duplicateKeys() throws {
        expectParseError("duplicate member name", at: 7) { try JSON.parse(#"{"a":1,"a":2}"#) }
        // The same name however it is written, and in a nested object.
        expectParseError("duplicate member name", at: 7) { try JSON.parse(#"{"a":1,"\u0061":2}"#) }
        expectParseError("duplicate member name", at: 12) { try JSON.parse(#"{"o":{"k":1,"k":1}}"#) }
        #expect(try JSON.parse(#"{"a":{"a":1},"b":[{"a":2},{"a":3}]}"#) == ["a": ["a": 1], "b": [["a": 2], ["a": 3]]])
    }

    @Test("Should parse from raw bytes as well as from a String")
    func bytes() throws {
        let bytes: [UInt8] = Array(#"{"k":[true]}"#.utf8)
        #expect(try JSON.parse(bytes) == ["k": [true]])
        #expect(try JSON.parse(bytes[...]) == ["k": [true]])
    }

    @Test("Should decode the simple escapes")
    func simpleEscapes() throws {
        #expect(try JSON.parse(#""q\"b\\s\/b\bf\fn\nr\rt\t""#) == .string("q\"b\\s/b\u{08}f\u{0C}n\nr\rt\t"))
    }

    @Test("Should decode \\u escapes, upper and lower case hex")
    func unicodeEscapes() throws {
        #expect(try JSON.parse(#""caf\u00e9""#) == .string("café"))
        #expect(try JSON.parse(#""\u00C9\u0041""#) == .string("ÉA"))
        #expect(try JSON.parse(#""\u0000""#) == .string("\u{0}"))
    }

    @Test("Should decode a surrogate pair into one scalar")
    func surrogatePair() throws {
        let value = try JSON.parse(#""x\ud83d\ude00y""#)
        #expect(value == .string("x😀y"))
        #expect(value.stringValue?.unicodeScalars.map(\.value) == [0x78, 0x1F600, 0x79])
    }

    @Test("Should pass raw UTF-8 through unchanged")
    func rawUTF8() throws {
        #expect(try JSON.parse("\"é😀\"") == .string("é😀"))
    }

    @Test("Should accept nesting of exactly 64 levels")
    func depthLimit() throws {
        let text = String(repeating: "[", count: 64) + String(repeating: "]", count: 64)
        var value = try JSON.parse(text)
        var levels = 0
        while let inner = value.arrayValue {
            levels += 1
            guard let first = inner.first else { break }
            value = first
        }
        #expect(levels == 64)
    }

    @Test(
        "Should reject malformed input with the reason and byte offset",
        arguments: [
            ("", "unexpected end of input", 0),
            ("   ", "unexpected end of input", 3),
            (#"{"a":1} x"#, "unexpected data after the value", 8),
            ("01", "unexpected data after the value", 1),
            ("[1 2]", "expected ',' or ']'", 3),
            (#"{"a" 1}"#, "expected ':'", 5),
            ("{1:2}", "expected a member name", 1),
            (#"{"a":1,}"#, "expected a member name", 7),
            ("[1,]", "unexpected character", 3),
            (#"{"a":1"#, "unexpected end of input", 6),
            (#""abc"#, "unterminated string", 4),
            (#""ab\"#, "unexpected end of input", 4),
            ("\"a\nb\"", "control character in string", 2),
            ("\"a\\n\tb\"", "control character in string", 4),
            (#""\x""#, "invalid escape", 3),
            (#""\u12G4""#, "invalid \\u escape", 5),
            (#""\u12""#, "truncated \\u escape", 3),
            (#""\ud83d""#, "unpaired surrogate", 7),
            (#""\ude00""#, "unpaired surrogate", 7),
            (#""\ud83d\u0041""#, "unpaired surrogate", 13),
            ("-", "expected a digit", 1),
            ("1.", "expected a digit", 2),
            ("1e", "expected a digit", 2),
            ("+1", "unexpected character", 0),
            ("tru", "unexpected end of input", 0),
            ("trux", "invalid literal", 0),
            ("nul", "unexpected end of input", 0),
            ("'a'", "unexpected character", 0),
        ] as [(String, String, Int)])
    func rejects(text: String, reason: String, offset: Int) {
        expectParseError(reason, at: offset) { try JSON.parse(text) }
    }

    @Test("Should reject nesting deeper than 64 levels")
    func tooDeep() {
        let arrays = String(repeating: "[", count: 65) + String(repeating: "]", count: 65)
        expectParseError("nesting deeper than 64", at: 64) { try JSON.parse(arrays) }
        let objects = String(repeating: #"{"a":"#, count: 65) + "1" + String(repeating: "}", count: 65)
        expectParseError("nesting deeper than 64", at: 64 * 5) {
            try JSON.parse(objects)
        }
    }

    @Test("Should reject a string that is not valid UTF-8")
    func invalidUTF8() {
        expectParseError("string is not valid UTF-8", at: 1) {
            try JSON.parse([0x22, 0xFF, 0x22])
        }
        expectParseError("string is not valid UTF-8", at: 1) {
            try JSON.parse([0x22, 0xC3, 0x5C, 0x6E, 0x22])  // "\xC3\n": a truncated sequence before an escape
        }
    }

    @Test("Should describe a parse error with its offset and reason")
    func errorDescription() {
        let error = #expect(throws: JSONParseError.self) { try JSON.parse(#""\x""#) }
        #expect(error?.description == "invalid JSON at byte 3: invalid escape")
    }
}

@Suite("JSON serialization", .timeLimit(.minutes(5)))
struct JSONSerializationTests {
    @Test("Should print object members in sorted key order, compactly")
    func sortedKeys() {
        let value: JSON = ["b": 1, "a": ["z": true, "y": false], "c": [nil, "s"]]
        #expect(value.text == #"{"a":{"y":false,"z":true},"b":1,"c":[null,"s"]}"#)
        #expect(value.serialized() == Array(value.text.utf8))
    }

    @Test("Should escape quote, backslash, newline, CR, tab and other control characters")
    func escapes() {
        let value = JSON.string("q\"b\\n\nr\rt\t\u{0}\u{1}\u{1F}/é")
        #expect(value.text == #""q\"b\\n\nr\rt\t\u0000\u0001\u001f/é""#)
    }

    @Test("Should escape object keys like strings")
    func keyEscapes() {
        #expect(JSON.object(["a\"b\n": 1]).text == #"{"a\"b\n":1}"#)
    }

    @Test("Should print integral numbers without a fraction")
    func integers() {
        #expect(JSON.number(3).text == "3")
        #expect(JSON.number(-42).text == "-42")
        #expect(JSON.number(0).text == "0")
        #expect(JSON.number(-0.0).text == "0")
        #expect(JSON.int(1_700_000_000_123).text == "1700000000123")
        #expect(JSON.number(1.5).text == "1.5")
        #expect(JSON.number(-0.25).text == "-0.25")
    }

    @Test("Should print a non-finite number as null")
    func nonFinite() {
        #expect(JSON.number(.nan).text == "null")
        #expect(JSON.number(.infinity).text == "null")
    }

    @Test("Should read back exactly what it printed")
    func roundTrip() throws {
        let value: JSON = [
            "null": nil, "yes": true, "no": false, "int": 42, "negative": -7, "fraction": .number(0.1),
            "big": .number(1e20), "string": "line\n\"quoted\"\t\\ é 😀 \u{1}",
            "array": [1, "two", [3], ["four": 4], nil], "empty": [:], "none": [],
            "nested": ["a": ["b": ["c": ["d": "deep"]]]],
        ]
        #expect(try JSON.parse(value.text) == value)
        #expect(try JSON.parse(value.serialized()) == value)
    }

    @Test("Should append to an existing buffer")
    func writeInto() {
        var out: [UInt8] = Array("x=".utf8)
        JSON.array([1, true]).write(into: &out)
        #expect(String(decoding: out, as: UTF8.self) == "x=[1,true]")
    }
}

@Suite("JSON accessors", .timeLimit(.minutes(5)))
struct JSONAccessorTests {
    @Test("Should give an integer only for integral numbers in range")
    func integerValue() {
        #expect(JSON.number(1.5).integerValue == nil)
        #expect(JSON.number(3).integerValue == 3)
        #expect(JSON.number(-3).integerValue == -3)
        #expect(JSON.number(1e16).integerValue == nil)
        #expect(JSON.number(.nan).integerValue == nil)
        #expect(JSON.string("3").integerValue == nil)
    }

    @Test("Should answer nil for the wrong kind of value")
    func kindAccessors() {
        let o: JSON = ["k": "v"]
        #expect(o["k"] == "v")
        #expect(o["missing"] == nil)
        #expect(JSON.array(["k"])["k"] == nil)
        #expect(o.objectValue == ["k": "v"])
        #expect(o.arrayValue == nil)
        #expect(o.stringValue == nil)
        #expect(JSON.bool(true).boolValue == true)
        #expect(JSON.number(1).boolValue == nil)
        #expect(JSON.array([]).arrayValue == [])
    }

    @Test("Should name each kind for error messages")
    func typeNames() {
        let names = [JSON.null, true, 1, "s", [], [:]].map(\.typeName)
        #expect(names == ["null", "bool", "number", "string", "array", "object"])
    }
}
