import Glibc

/// Reads the common shape of a call in one pass, without building the
/// dictionaries of a generic parse: a top-level object whose members are
/// `method` (a string), `parameters` (null, or an object of scalar members:
/// strings, whole numbers, booleans, null) and the `more`, `oneway` and
/// `upgrade` booleans. Strings must be printable ASCII without escapes (the
/// names, tokens and codes of every hot call are).
///
/// It decides nothing about validity: for anything outside that shape —
/// escapes, other bytes, nested values, fractions, exponents, long numbers,
/// repeated or unknown members, trailing bytes, malformed text — it returns
/// nil and the caller parses the message with `JSON.parse`, which accepts or
/// refuses it. What it does return is what the generic path gives for the
/// same bytes.
enum VarlinkCallScanner {
    /// The call `message` holds, or nil when it is not of the common shape.
    static func scan(_ message: ArraySlice<UInt8>, methods: VarlinkMethodNames?) -> VarlinkCall? {
        message.withUnsafeBufferPointer { bytes -> VarlinkCall? in
            var scanner = Scanner(bytes: bytes)
            return scanner.call(methods: methods)
        }
    }

    /// The method named by `message` when its first member is `method` with
    /// a plain string, found without reading further; nil otherwise.
    static func leadingMethod(_ message: ArraySlice<UInt8>, methods: VarlinkMethodNames?) -> String? {
        message.withUnsafeBufferPointer { bytes -> String? in
            var scanner = Scanner(bytes: bytes)
            guard scanner.consume(UInt8(ascii: "{")), let name = scanner.plainString(), Scanner.Top(name) == .method,
                scanner.consume(UInt8(ascii: ":")), let text = scanner.plainString()
            else { return nil }
            return methods?.known(text) ?? String(decoding: text, as: UTF8.self)
        }
    }

    private struct Scanner {
        let bytes: UnsafeBufferPointer<UInt8>
        var index = 0

        init(bytes: UnsafeBufferPointer<UInt8>) { self.bytes = bytes }

        mutating func call(methods: VarlinkMethodNames?) -> VarlinkCall? {
            guard consume(UInt8(ascii: "{")) else { return nil }
            var method: String?
            var parameters: VarlinkParameters?
            var more: Bool?
            var oneway: Bool?
            var upgrade: Bool?
            if !consume(UInt8(ascii: "}")) {
                repeat {
                    guard let name = plainString() else { return nil }
                    guard consume(UInt8(ascii: ":")) else { return nil }
                    switch Top(name) {
                    case .method:
                        guard method == nil, let text = plainString() else { return nil }
                        method = methods?.known(text) ?? String(decoding: text, as: UTF8.self)
                    case .parameters:
                        guard parameters == nil, let p = parameterObject() else { return nil }
                        parameters = p
                    case .more:
                        guard more == nil, let b = boolean() else { return nil }
                        more = b
                    case .oneway:
                        guard oneway == nil, let b = boolean() else { return nil }
                        oneway = b
                    case .upgrade:
                        guard upgrade == nil, let b = boolean() else { return nil }
                        upgrade = b
                    case nil: return nil
                    }
                } while consume(UInt8(ascii: ","))
                guard consume(UInt8(ascii: "}")) else { return nil }
            }
            skipWhitespace()
            guard index == bytes.count, let method else { return nil }
            return VarlinkCall(
                method: method, members: parameters ?? VarlinkParameters(), more: more ?? false,
                oneway: oneway ?? false, upgrade: upgrade ?? false)
        }

        /// The top-level members of a call.
        enum Top {
            case method, parameters, more, oneway, upgrade

            init?(_ name: UnsafeBufferPointer<UInt8>) {
                switch name.count {
                case 4 where Top.equal(name, "more"): self = .more
                case 6 where Top.equal(name, "method"): self = .method
                case 6 where Top.equal(name, "oneway"): self = .oneway
                case 7 where Top.equal(name, "upgrade"): self = .upgrade
                case 10 where Top.equal(name, "parameters"): self = .parameters
                default: return nil
                }
            }

            static func equal(_ bytes: UnsafeBufferPointer<UInt8>, _ literal: StaticString) -> Bool {
                let start = literal.utf8Start
                for i in 0..<bytes.count where bytes[i] != start[i] { return false }
                return true
            }
        }

        /// `null`, or an object of scalar members with distinct names.
        mutating func parameterObject() -> VarlinkParameters? {
            skipWhitespace()
            if literal("null") { return VarlinkParameters() }
            guard consume(UInt8(ascii: "{")) else { return nil }
            var members: [VarlinkParameters.Member] = []
            if consume(UInt8(ascii: "}")) { return VarlinkParameters(distinct: members) }
            members.reserveCapacity(4)
            repeat {
                guard let name = plainString(), consume(UInt8(ascii: ":")), let value = scalar() else { return nil }
                let key = String(decoding: name, as: UTF8.self)
                // A repeated name is left to the generic parser to judge.
                for member in members where member.name == key { return nil }
                members.append(VarlinkParameters.Member(name: key, value: value))
            } while consume(UInt8(ascii: ","))
            guard consume(UInt8(ascii: "}")) else { return nil }
            return VarlinkParameters(distinct: members)
        }

        /// A string, a whole number of at most 15 digits, a boolean or null.
        mutating func scalar() -> JSON? {
            skipWhitespace()
            guard index < bytes.count else { return nil }
            switch bytes[index] {
            case UInt8(ascii: "\""): return plainString().map { .string(String(decoding: $0, as: UTF8.self)) }
            case UInt8(ascii: "t"), UInt8(ascii: "f"): return boolean().map(JSON.bool)
            case UInt8(ascii: "n"): return literal("null") ? .null : nil
            default: return wholeNumber()
            }
        }

        /// `-?(0|[1-9][0-9]*)` of at most 15 digits, not followed by a
        /// fraction or exponent: exactly the Double the generic parser makes.
        mutating func wholeNumber() -> JSON? {
            var i = index
            let negative = i < bytes.count && bytes[i] == UInt8(ascii: "-")
            if negative { i += 1 }
            let first = i
            var value: Int64 = 0
            while i < bytes.count, bytes[i] >= UInt8(ascii: "0"), bytes[i] <= UInt8(ascii: "9") {
                value = value * 10 + Int64(bytes[i] - UInt8(ascii: "0"))
                i += 1
                if i - first > 15 { return nil }
            }
            let digits = i - first
            guard digits > 0, !(digits > 1 && bytes[first] == UInt8(ascii: "0")) else { return nil }
            if i < bytes.count {
                switch bytes[i] {
                case UInt8(ascii: "."), UInt8(ascii: "e"), UInt8(ascii: "E"): return nil
                default: break
                }
            }
            index = i
            // -0 is the Double -0.0, as the generic parser reads it.
            return .number(negative ? -Double(value) : Double(value))
        }

        /// `true` or `false`.
        mutating func boolean() -> Bool? {
            skipWhitespace()
            if literal("true") { return true }
            if literal("false") { return false }
            return nil
        }

        /// Consumes `word` when it comes next.
        mutating func literal(_ word: StaticString) -> Bool {
            let count = word.utf8CodeUnitCount
            guard index + count <= bytes.count else { return false }
            let start = word.utf8Start
            for i in 0..<count where bytes[index + i] != start[i] { return false }
            index += count
            return true
        }

        /// The bytes of a string of printable ASCII without escapes.
        mutating func plainString() -> UnsafeBufferPointer<UInt8>? {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { return nil }
            let start = index + 1
            guard start < bytes.count,
                let quote = memchr(bytes.baseAddress! + start, Int32(UInt8(ascii: "\"")), bytes.count - start)
            else { return nil }
            let end = bytes.baseAddress!.distance(to: quote.assumingMemoryBound(to: UInt8.self))
            let text = UnsafeBufferPointer(rebasing: bytes[start..<end])
            // Printable ASCII without a backslash; one pass without early exit, which vectorises.
            var outside: UInt8 = 0
            for b in text { outside |= (b &- 0x20 >= 0x5F ? 1 : 0) | (b == UInt8(ascii: "\\") ? 1 : 0) }
            guard outside == 0 else { return nil }
            index = end + 1
            return text
        }

        /// Skips whitespace, then consumes `byte` when it comes next.
        mutating func consume(_ byte: UInt8) -> Bool {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == byte else { return false }
            index += 1
            return true
        }

        mutating func skipWhitespace() {
            while index < bytes.count {
                switch bytes[index] {
                case 0x20, 0x09, 0x0A, 0x0D: index += 1
                default: return
                }
            }
        }
    }
}
