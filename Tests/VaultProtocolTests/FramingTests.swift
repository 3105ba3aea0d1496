import Testing
import Varlink
import VaultProtocol

private func bytes(_ text: String) -> [UInt8] { Array(text.utf8) }

/// Every complete message the decoder has, as strings.
private func drain(_ decoder: inout VarlinkFrameDecoder) throws -> [String] {
    var messages: [String] = []
    while let message = try decoder.next() { messages.append(String(decoding: message, as: UTF8.self)) }
    return messages
}

@Suite("VarlinkFrameDecoder", .timeLimit(.minutes(5)))
struct VarlinkFrameDecoderTests {
    @Test("Should have nothing before any bytes arrive")
    func empty() throws {
        var decoder = VarlinkFrameDecoder()
        #expect(try decoder.next() == nil)
        #expect(!decoder.hasPartialMessage)
        #expect(decoder.maximumSize == 1 << 20)
    }

    @Test("Should split two messages that arrive in one read")
    func twoInOneAppend() throws {
        var decoder = VarlinkFrameDecoder()
        decoder.append(bytes("{\"a\":1}\0{\"b\":2}\0"))
        #expect(try drain(&decoder) == ["{\"a\":1}", "{\"b\":2}"])
        #expect(!decoder.hasPartialMessage)
    }

    @Test("Should join a message split over three reads")
    func splitOverThree() throws {
        var decoder = VarlinkFrameDecoder()
        decoder.append(bytes("{\"met"))
        #expect(try decoder.next() == nil)
        #expect(decoder.hasPartialMessage)
        decoder.append(bytes("hod\":\"a.B"))
        #expect(try decoder.next() == nil)
        decoder.append(bytes("\"}\0{\"x"))
        #expect(try decoder.next().map(Array.init) == bytes("{\"method\":\"a.B\"}"))
        #expect(try decoder.next() == nil)
        #expect(decoder.hasPartialMessage)
        decoder.append(bytes("\":1}\0"))
        #expect(try drain(&decoder) == ["{\"x\":1}"])
        #expect(!decoder.hasPartialMessage)
    }

    @Test("Should return an empty message for a lone NUL")
    func emptyMessage() throws {
        var decoder = VarlinkFrameDecoder()
        decoder.append([0, 0])
        #expect(try decoder.next().map(Array.init) == [])
        #expect(try decoder.next().map(Array.init) == [])
        #expect(try decoder.next() == nil)
    }

    @Test("Should accept raw buffer pointers")
    func rawBuffer() throws {
        var decoder = VarlinkFrameDecoder()
        bytes("ab\0").withUnsafeBytes { decoder.append($0) }
        #expect(try drain(&decoder) == ["ab"])
    }

    @Test("Should accept a message of exactly the size cap, with or without its NUL yet")
    func exactlyAtCap() throws {
        var decoder = VarlinkFrameDecoder(maximumSize: 8)
        decoder.append(bytes("12345678"))
        #expect(try decoder.next() == nil)
        decoder.append([0])
        #expect(try drain(&decoder) == ["12345678"])
        decoder.append(bytes("abcdefgh\0"))
        #expect(try drain(&decoder) == ["abcdefgh"])
    }

    @Test("Should refuse a message one byte over the cap before its NUL arrives")
    func overCapWithoutNUL() {
        var decoder = VarlinkFrameDecoder(maximumSize: 8)
        decoder.append(bytes("123456789"))
        #expect(throws: VarlinkFrameDecoder.Failure.messageTooLarge(limit: 8)) { try decoder.next() }
    }

    @Test("Should refuse a message one byte over the cap when it arrives whole")
    func overCapWithNUL() throws {
        var decoder = VarlinkFrameDecoder(maximumSize: 8)
        decoder.append(bytes("ok\0" + "123456789\0"))
        #expect(try decoder.next().map(Array.init) == bytes("ok"))
        #expect(throws: VarlinkFrameDecoder.Failure.messageTooLarge(limit: 8)) { try decoder.next() }
    }

    @Test("Should refuse an oversized message that grows over several reads")
    func overCapAcrossReads() throws {
        var decoder = VarlinkFrameDecoder(maximumSize: 8)
        decoder.append(bytes("12345"))
        #expect(try decoder.next() == nil)
        decoder.append(bytes("6789"))
        #expect(throws: VarlinkFrameDecoder.Failure.messageTooLarge(limit: 8)) { try decoder.next() }
    }

    @Test("Should decode 10,000 small messages in order from one read")
    func manyInOneRead() throws {
        var decoder = VarlinkFrameDecoder()
        var stream: [UInt8] = []
        for i in 0..<10_000 { stream += bytes("{\"i\":\(i)}\0") }
        decoder.append(stream)
        let messages = try drain(&decoder)
        #expect(messages.count == 10_000)
        #expect(messages == (0..<10_000).map { "{\"i\":\($0)}" })
        #expect(!decoder.hasPartialMessage)
    }

    @Test("Should decode 10,000 messages in order when reads cut them at arbitrary points")
    func manyAcrossReads() throws {
        var decoder = VarlinkFrameDecoder(maximumSize: 64)
        var stream: [UInt8] = []
        for i in 0..<10_000 { stream += bytes("{\"method\":\"io.vaultd.Vault.GetSession\",\"n\":\(i)}\0") }
        var messages: [String] = []
        var offset = 0
        var chunk = 1
        while offset < stream.count {
            let end = min(offset + chunk, stream.count)
            decoder.append(stream[offset..<end])
            messages += try drain(&decoder)
            offset = end
            chunk = chunk % 97 + 13  // read sizes 1...97, cutting messages everywhere
        }
        #expect(messages.count == 10_000)
        #expect(messages == (0..<10_000).map { "{\"method\":\"io.vaultd.Vault.GetSession\",\"n\":\($0)}" })
        #expect(!decoder.hasPartialMessage)
    }
}
