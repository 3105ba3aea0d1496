import Testing
import Varlink
import VaultCore

/// Expects `bytes` to be refused with exactly `reason` at byte `offset`.
private func expectRefused(
    _ bytes: [UInt8], _ reason: String, at offset: Int, sourceLocation: SourceLocation = #_sourceLocation
) {
    let error = #expect(throws: JSONParseError.self, sourceLocation: sourceLocation) { try JSON.parse(bytes) }
    #expect(error?.reason == reason, sourceLocation: sourceLocation)
    #expect(error?.offset == offset, sourceLocation: sourceLocation)
}

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// How long `body` took, in seconds.
private func seconds(_ body: () -> Void) -> Double {
    let elapsed = ContinuousClock().measure(body)
    return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
}

/// What anyone on the socket may send the decoder (issue 13): each input is
/// refused with a reason and an offset, never a crash, a stack overflow or
/// time that grows faster than the input.
@Suite("JSON under hostile input", .timeLimit(.minutes(5)))
struct JSONHostileInputTests {
    @Test("Should refuse hundreds of thousands of '[' or '{' at the 65th level, at once")
    func deepNesting() {
        let arrays = [UInt8](repeating: UInt8(ascii: "["), count: 300_000)
        let objects = [UInt8](repeating: 0, count: 0) + Array(String(repeating: #"{"a":"#, count: 200_000).utf8)
        let closedArrays = arrays + [UInt8](repeating: UInt8(ascii: "]"), count: 300_000)
        let time = seconds {
            expectRefused(arrays, "nesting deeper than 64", at: 64)
            expectRefused(closedArrays, "nesting deeper than 64", at: 64)
            expectRefused(objects, "nesting deeper than 64", at: 64 * 5)
        }
        // Refused at byte 64: a slow machine still does it in microseconds.
        #expect(time < 2, "\(time) s")
    }

    @Test("Should refuse a number past the range of a Double, and keep huge finite ones")
    func hugeNumbers() throws {
        expectRefused(bytes("1e999999"), "number out of range", at: 0)
        expectRefused(bytes("-1e999999"), "number out of range", at: 0)
        expectRefused(bytes(#"{"n":1e309}"#), "number out of range", at: 5)
        expectRefused(bytes("1" + String(repeating: "0", count: 400)), "number out of range", at: 0)
        // Finite, but no integer: an int parameter refuses it by name.
        let big = try JSON.parse("1" + String(repeating: "0", count: 300))
        #expect(big == .number(1e300))
        #expect(big.integerValue == nil)
        #expect(try JSON.parse("1e-999999") == .number(0))
        #expect(try JSON.parse("-" + String(repeating: "9", count: 308)).integerValue == nil)
    }

    @Test("Should parse a megabyte of digits in time linear in its length")
    func longNumbers() throws {
        let digits = String(repeating: "7", count: 1 << 20)
        var value: JSON?
        let time = seconds { value = try? JSON.parse("0." + digits) }
        #expect(value != nil)
        #expect(time < 5, "\(time) s for 1 MiB of digits")
        let refusedTime = seconds { expectRefused(bytes(digits), "number out of range", at: 0) }
        #expect(refusedTime < 5, "\(refusedTime) s")
    }

    @Test(
        "Should refuse a string that is not UTF-8, as a value or a member name",
        arguments: [
            ([0x22, 0xC0, 0x80, 0x22], 1),  // overlong NUL
            ([0x22, 0xED, 0xA0, 0x80, 0x22], 1),  // a UTF-16 surrogate encoded in UTF-8
            ([0x22, 0xF4, 0x90, 0x80, 0x80, 0x22], 1),  // past U+10FFFF
            ([0x22, 0x61, 0xE2, 0x82, 0x22], 1),  // cut short before the quote
            ([0x22, 0x80, 0x22], 1),  // a lone continuation byte
            ([0x22, 0xF8, 0x88, 0x80, 0x80, 0x80, 0x22], 1),  // a five-byte form
            ([0x7B, 0x22, 0xFF, 0x22, 0x3A, 0x31, 0x7D], 2),  // {"\xFF":1}
            ([0x22, 0x5C, 0x6E, 0xC3, 0x22], 1),  // "\n\xC3": bad after an escape
        ] as [([UInt8], Int)])
    func invalidUTF8(input: [UInt8], offset: Int) {
        expectRefused(input, "string is not valid UTF-8", at: offset)
    }

    @Test("Should refuse UTF-8 and other bytes outside strings as unexpected characters")
    func bytesOutsideStrings() {
        expectRefused([0xEF, 0xBB, 0xBF, 0x31], "unexpected character", at: 0)  // a byte order mark
        expectRefused([0x5B, 0xC3, 0xA9, 0x5D], "unexpected character", at: 1)
        expectRefused([0x31, 0x00], "unexpected data after the value", at: 1)
    }

    @Test("Should refuse a raw NUL inside a string and keep an escaped one as a character")
    func nulInStrings() throws {
        expectRefused(bytes("\"a") + [0] + bytes("b\""), "control character in string", at: 2)
        expectRefused(bytes(#"{"k\"#) + [0] + bytes(#"":1}"#), "invalid escape", at: 5)
        let value = try JSON.parse(#"{"k":"a\u0000b"}"#)
        #expect(value["k"]?.stringValue?.utf8.elementsEqual([0x61, 0, 0x62]) == true)
        // Printed back with the escape: the NUL never reaches the wire raw.
        #expect(value.text == #"{"k":"a\u0000b"}"#)
        #expect(!value.serialized().contains(0))
    }

    @Test(
        "Should refuse every lone or misordered surrogate escape",
        arguments: [
            (#""\ud800""#, "unpaired surrogate", 7),
            (#""\ud800x""#, "unpaired surrogate", 7),
            (#""\udbff\ud800""#, "unpaired surrogate", 13),
            (#""\udc00\ud800""#, "unpaired surrogate", 7),
            (#""\udfff""#, "unpaired surrogate", 7),
            (#""\ud800\u""#, "truncated \\u escape", 9),
            (#""\ud800\n""#, "unpaired surrogate", 7),
        ] as [(String, String, Int)])
    func loneSurrogates(text: String, reason: String, offset: Int) {
        expectRefused(bytes(text), reason, at: offset)
    }

    @Test("Should count every value against maximumValues, containers included, and refuse the first one over")
    func valueLimit() throws {
        let three = Array(#"{"a":[1,2]}"#.utf8)
        #expect(throws: Never.self) { try JSON.parse(three[...], maximumValues: 4) }
        let error = #expect(throws: JSONParseError.self) { try JSON.parse(three[...], maximumValues: 3) }
        #expect(error?.reason == "more than 3 values")
        #expect(error?.offset == 8)
        // A megabyte of numbers is refused after the limit, long before its end.
        let flood = Array(("[" + String(repeating: "1,", count: 500_000) + "1]").utf8)
        var refused: JSONParseError?
        let time = seconds {
            do throws(JSONParseError) { _ = try JSON.parse(flood[...], maximumValues: 16384) } catch { refused = error }
        }
        #expect(refused?.reason == "more than 16384 values")
        #expect(refused?.offset == 1 + 2 * 16383)
        #expect(time < 2, "\(time) s")
        #expect(try JSON.parse(flood).arrayValue?.count == 500_001, "no limit unless asked")
    }

    @Test("Should parse a wide megabyte (many members, many elements, many escapes) in linear time")
    func wideInput() throws {
        var members: [String] = []
        for i in 0..<40_000 { members.append(#""member\#(i)":[\#(i),true,null]"#) }
        let object = bytes("{" + members.joined(separator: ",") + "}")
        let elements = bytes("[" + Array(repeating: "[]", count: 300_000).joined(separator: ",") + "]")
        let escapes = bytes("\"" + String(repeating: #"\u00e9\ud83d\ude00"#, count: 40_000) + "\"")
        var parsed = 0
        let time = seconds {
            for input in [object, elements, escapes] where (try? JSON.parse(input)) != nil { parsed += 1 }
        }
        #expect(parsed == 3)
        #expect(time < 10, "\(time) s for \(object.count + elements.count + escapes.count) bytes")
    }
}
