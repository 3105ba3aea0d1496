/// A JSON value, parsed and printed without Foundation so the client starts fast
/// and the serving path controls every allocation.
public enum JSON: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    /// The member `key` of an object, or nil for a missing key or a non-object.
    public subscript(key: String) -> JSON? {
        if case .object(let members) = self { return members[key] }
        return nil
    }

    /// The string, or nil for any other kind of value.
    public var stringValue: String? {
        if case .string(let s) = self { return s }
        return nil
    }

    /// The number as an integer when it is integral and in range.
    public var integerValue: Int64? {
        if case .number(let d) = self { return JSON.integer(d) }
        return nil
    }

    /// `number` as an integer when it is integral and in range: what
    /// `integerValue` reads from a number.
    @inlinable
    public static func integer(_ number: Double) -> Int64? {
        number.rounded() == number && abs(number) < 9.0e15 ? Int64(number) : nil
    }

    /// The boolean, or nil for any other kind of value.
    public var boolValue: Bool? {
        if case .bool(let b) = self { return b }
        return nil
    }

    /// The members, or nil for any other kind of value.
    public var objectValue: [String: JSON]? {
        if case .object(let o) = self { return o }
        return nil
    }

    /// The elements, or nil for any other kind of value.
    public var arrayValue: [JSON]? {
        if case .array(let a) = self { return a }
        return nil
    }

    /// The JSON type name used in error messages ("string", "object", ...).
    public var typeName: String {
        switch self {
        case .null: return "null"
        case .bool: return "bool"
        case .number: return "number"
        case .string: return "string"
        case .array: return "array"
        case .object: return "object"
        }
    }
}

/// Why a text is not JSON, with the byte offset where parsing stopped.
public struct JSONParseError: Error, Equatable, Sendable, CustomStringConvertible {
    /// What was wrong.
    public var reason: String
    /// Byte offset into the input.
    public var offset: Int

    public var description: String { "invalid JSON at byte \(offset): \(reason)" }

    /// The error `reason` at byte `offset`.
    public init(reason: String, offset: Int) {
        self.reason = reason
        self.offset = offset
    }
}

extension JSON {
    /// Parses one JSON value that spans all of `bytes` (whitespace around it allowed).
    public static func parse<C: Collection>(_ bytes: C) throws(JSONParseError) -> JSON
    where C.Element == UInt8 {
        try parse(ArraySlice(bytes))
    }

    /// Parses one JSON value that spans all of `bytes`, reading them in place.
    /// `maximumValues` bounds the values (scalars, arrays and objects, the
    /// outermost included) the text may hold, and with them the time and
    /// memory a parse takes: a megabyte of `1,` is half a million values.
    public static func parse(_ bytes: ArraySlice<UInt8>, maximumValues: Int = .max) throws(JSONParseError) -> JSON {
        let result = bytes.withUnsafeBufferPointer { buffer -> Result<JSON, JSONParseError> in
            var parser = JSONParser(bytes: buffer, maximumValues: maximumValues)
            do throws(JSONParseError) {
                return .success(try parser.parseDocument())
            } catch {
                return .failure(error)
            }
        }
        return try result.get()
    }

    /// Parses one JSON value that spans all of `bytes`.
    public static func parse(_ bytes: [UInt8]) throws(JSONParseError) -> JSON {
        try parse(bytes[...])
    }

    /// Parses one JSON value from a string.
    public static func parse(_ text: String) throws(JSONParseError) -> JSON {
        try parse(Array(text.utf8))
    }
}

/// A recursive-descent parser over a byte buffer, for input anyone on the
/// socket may send: depth is capped so it cannot exhaust the stack, an object
/// may name a member once (a repeated name is an error, never "the last
/// wins"), a number must fit a Double, and strings must be valid UTF-8 with
/// paired surrogates. Every refusal is a `JSONParseError` with its byte offset.
public struct JSONParser {
    /// The text being parsed.
    public let bytes: UnsafeBufferPointer<UInt8>
    /// Where the parser is in `bytes`.
    public internal(set) var index = 0
    var depth = 0
    static let maximumDepth = 64
    /// Values the text may still hold.
    var valuesLeft: Int
    let maximumValues: Int

    /// A parser at the start of `bytes`, which may hold at most `maximumValues` values.
    public init(bytes: UnsafeBufferPointer<UInt8>, maximumValues: Int = .max) {
        self.bytes = bytes
        self.maximumValues = maximumValues
        self.valuesLeft = maximumValues
    }

    mutating func parseDocument() throws(JSONParseError) -> JSON {
        skipWhitespace()
        let value = try parseValue()
        skipWhitespace()
        if index != bytes.count { throw fail("unexpected data after the value") }
        return value
    }

    /// The error `reason`, at the parser's offset.
    public func fail(_ reason: String) -> JSONParseError { JSONParseError(reason: reason, offset: index) }

    /// Moves past the whitespace at `index`.
    public mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    /// Reads the value at `index`, whole.
    public mutating func parseValue() throws(JSONParseError) -> JSON {
        guard index < bytes.count else { throw fail("unexpected end of input") }
        valuesLeft -= 1
        if valuesLeft < 0 { throw fail("more than \(maximumValues) values") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try parseObject()
        case UInt8(ascii: "["): return try parseArray()
        case UInt8(ascii: "\""): return .string(try parseString())
        case UInt8(ascii: "t"):
            try expectLiteral("true")
            return .bool(true)
        case UInt8(ascii: "f"):
            try expectLiteral("false")
            return .bool(false)
        case UInt8(ascii: "n"):
            try expectLiteral("null")
            return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
        default: throw fail("unexpected character")
        }
    }

    mutating func expectLiteral(_ literal: StaticString) throws(JSONParseError) {
        let count = literal.utf8CodeUnitCount
        guard index + count <= bytes.count else { throw fail("unexpected end of input") }
        let start = literal.utf8Start
        for i in 0..<count where bytes[index + i] != start[i] { throw fail("invalid literal") }
        index += count
    }

    mutating func enter() throws(JSONParseError) {
        depth += 1
        if depth > JSONParser.maximumDepth { throw fail("nesting deeper than \(JSONParser.maximumDepth)") }
    }

    mutating func parseObject() throws(JSONParseError) -> JSON {
        var members: [String: JSON] = [:]
        try parseMembers { (key, keyStart, parser) throws(JSONParseError) in
            // A repeated member is refused, not resolved: two readers of one
            // message (a proxy that checks the first "user", a service that
            // uses the last) must never see two different calls in it.
            guard members.updateValue(try parser.parseValue(), forKey: key) == nil else {
                throw JSONParseError(reason: "duplicate member name", offset: keyStart)
            }
        }
        return .object(members)
    }

    /// Reads the object at `index` member by member: `member` gets each name,
    /// the offset of its opening quote, and the parser at its value, which it
    /// must read whole (`parseValue()`, or `parseMembers` for an object).
    /// Callers that know their members read them straight into their fields,
    /// without building the object's dictionary; each refuses a repeated name.
    public mutating func parseMembers(
        _ member: (String, Int, inout JSONParser) throws(JSONParseError) -> Void
    ) throws(JSONParseError) {
        guard index < bytes.count, bytes[index] == UInt8(ascii: "{") else { throw fail("expected an object") }
        try enter()
        defer { depth -= 1 }
        index += 1
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "}") {
            index += 1
            return
        }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else {
                throw fail("expected a member name")
            }
            let keyStart = index
            let key = try parseString()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw fail("expected ':'") }
            index += 1
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            try member(key, keyStart, &self)
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "}") {
                index += 1
                return
            }
            throw fail("expected ',' or '}'")
        }
    }

    mutating func parseArray() throws(JSONParseError) -> JSON {
        try enter()
        defer { depth -= 1 }
        index += 1
        var elements: [JSON] = []
        skipWhitespace()
        if index < bytes.count, bytes[index] == UInt8(ascii: "]") {
            index += 1
            return .array(elements)
        }
        while true {
            skipWhitespace()
            elements.append(try parseValue())
            skipWhitespace()
            guard index < bytes.count else { throw fail("unexpected end of input") }
            if bytes[index] == UInt8(ascii: ",") {
                index += 1
                continue
            }
            if bytes[index] == UInt8(ascii: "]") {
                index += 1
                return .array(elements)
            }
            throw fail("expected ',' or ']'")
        }
    }

    mutating func parseNumber() throws(JSONParseError) -> JSON {
        let start = index
        let negative = bytes[index] == UInt8(ascii: "-")
        if negative { index += 1 }
        func isDigit(_ b: UInt8) -> Bool { b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9") }
        guard index < bytes.count, isDigit(bytes[index]) else { throw fail("expected a digit") }
        let integerStart = index
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        // Fast path for what calls hold (uids, times, limits): an integer of
        // at most 15 digits is exact in a Double, so it needs neither a
        // String nor strtod (a megabyte of them parses about twice as fast).
        let atEnd = index == bytes.count
        if index - integerStart <= 15,
            atEnd
                || (bytes[index] != UInt8(ascii: ".") && bytes[index] != UInt8(ascii: "e")
                    && bytes[index] != UInt8(ascii: "E"))
        {
            var value: Int64 = 0
            for i in integerStart..<index { value = value &* 10 &+ Int64(bytes[i] &- UInt8(ascii: "0")) }
            return .number(negative ? -Double(value) : Double(value))
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            index += 1
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("expected a digit") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") {
                index += 1
            }
            guard index < bytes.count, isDigit(bytes[index]) else { throw fail("expected a digit") }
            while index < bytes.count, isDigit(bytes[index]) { index += 1 }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: bytes[start..<index]), as: UTF8.self)
        // Past ±1.8e308 (1e999999, a 400-digit integer) Double is infinite:
        // refused, since it would print as null and compare as no number sent.
        guard let value = Double(text), value.isFinite else {
            throw JSONParseError(reason: "number out of range", offset: start)
        }
        return .number(value)
    }

    mutating func parseHex4() throws(JSONParseError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw fail("truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let b = bytes[index]
            let digit: UInt32
            switch b {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(b - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(b - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(b - UInt8(ascii: "A") + 10)
            default: throw fail("invalid \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    mutating func parseString() throws(JSONParseError) -> String {
        index += 1  // opening quote
        let start = index
        // Fast path: no escapes. `seen` collects the bits of every byte.
        var seen: UInt8 = 0
        while index < bytes.count {
            let b = bytes[index]
            seen |= b
            if b == UInt8(ascii: "\"") {
                let raw = UnsafeBufferPointer(rebasing: bytes[start..<index])
                index += 1
                // ASCII (names, methods, tokens) cannot be invalid UTF-8: skip the
                // generic validation, which costs a metadata lookup per string.
                if seen < 0x80 { return String(decoding: raw, as: UTF8.self) }
                guard let s = String(validating: raw, as: UTF8.self) else {
                    throw JSONParseError(reason: "string is not valid UTF-8", offset: start)
                }
                return s
            }
            if b == UInt8(ascii: "\\") { break }
            if b < 0x20 { throw fail("control character in string") }
            index += 1
        }
        var out = Array(UnsafeBufferPointer(rebasing: bytes[start..<index]))
        while index < bytes.count {
            let b = bytes[index]
            if b == UInt8(ascii: "\"") {
                index += 1
                guard let s = String(validating: out, as: UTF8.self) else {
                    throw JSONParseError(reason: "string is not valid UTF-8", offset: start)
                }
                return s
            }
            if b < 0x20 { throw fail("control character in string") }
            if b != UInt8(ascii: "\\") {
                out.append(b)
                index += 1
                continue
            }
            index += 1
            guard index < bytes.count else { throw fail("unexpected end of input") }
            let escape = bytes[index]
            index += 1
            switch escape {
            case UInt8(ascii: "\""): out.append(0x22)
            case UInt8(ascii: "\\"): out.append(0x5C)
            case UInt8(ascii: "/"): out.append(0x2F)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try parseHex4()
                if (0xD800..<0xDC00).contains(scalar) {
                    guard index + 2 <= bytes.count, bytes[index] == UInt8(ascii: "\\"),
                        bytes[index + 1] == UInt8(ascii: "u")
                    else { throw fail("unpaired surrogate") }
                    index += 2
                    let low = try parseHex4()
                    guard (0xDC00..<0xE000).contains(low) else { throw fail("unpaired surrogate") }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..<0xE000).contains(scalar) {
                    throw fail("unpaired surrogate")
                }
                guard let u = Unicode.Scalar(scalar) else { throw fail("invalid code point") }
                // Encoded in place: no String or Array per escape.
                UTF8.encode(u) { out.append($0) }
            default: throw fail("invalid escape")
            }
        }
        throw fail("unterminated string")
    }
}

extension JSON {
    /// The compact JSON text, object members in sorted order so output is stable.
    public func serialized() -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(128)
        write(into: &out)
        return out
    }

    /// The compact JSON text as a String.
    public var text: String { String(decoding: serialized(), as: UTF8.self) }

    /// Appends the compact JSON text to `out`.
    public func write(into out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .number(let d): JSON.writeNumber(d, into: &out)
        case .string(let s): JSON.writeString(s, into: &out)
        case .array(let elements):
            out.append(UInt8(ascii: "["))
            for (i, element) in elements.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                element.write(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            for (i, member) in members.sorted(by: { $0.key < $1.key }).enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                JSON.writeString(member.key, into: &out)
                out.append(UInt8(ascii: ":"))
                member.value.write(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    static func writeNumber(_ d: Double, into out: inout [UInt8]) {
        if d.isNaN || d.isInfinite {
            out.append(contentsOf: "null".utf8)
        } else if d.rounded() == d, abs(d) < 9.0e15 {
            out.append(contentsOf: String(Int64(d)).utf8)
        } else {
            out.append(contentsOf: String(d).utf8)
        }
    }

    /// Appends `s` as a quoted JSON string with the required escapes.
    public static func writeString(_ s: String, into out: inout [UInt8]) {
        writeString(utf8: s.utf8, into: &out)
    }

    /// Appends UTF-8 bytes as a quoted JSON string with the required escapes.
    public static func writeString<C: Collection<UInt8>>(utf8 bytes: C, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        // Most strings (names, tokens, codes) need no escape: copy them whole.
        if bytes.allSatisfy({ $0 >= 0x20 && $0 != 0x22 && $0 != 0x5C }) {
            out.append(contentsOf: bytes)
            out.append(UInt8(ascii: "\""))
            return
        }
        for b in bytes {
            switch b {
            case 0x22: out.append(contentsOf: [0x5C, 0x22])
            case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            case 0..<0x20:
                let hex: [UInt8] = Array("0123456789abcdef".utf8)
                out.append(contentsOf: [0x5C, UInt8(ascii: "u"), 0x30, 0x30, hex[Int(b >> 4)], hex[Int(b & 0xF)]])
            default: out.append(b)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

extension JSON: ExpressibleByStringLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByDictionaryLiteral, ExpressibleByArrayLiteral, ExpressibleByNilLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int) { self = .number(Double(value)) }
    public init(dictionaryLiteral elements: (String, JSON)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
    public init(arrayLiteral elements: JSON...) { self = .array(elements) }
    public init(nilLiteral: ()) { self = .null }

    /// An integer as a JSON number.
    public static func int(_ value: Int64) -> JSON { .number(Double(value)) }
}
