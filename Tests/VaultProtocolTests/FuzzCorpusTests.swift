import Foundation
import Testing
import Varlink
import VaultCore
import VaultProtocol

/// The committed seed corpus of a fuzz target (Fuzz/corpus/TARGET), each file's name and bytes.
private func fuzzCorpus(_ target: String, filePath: String = #filePath) throws -> [(name: String, bytes: [UInt8])] {
    let root = URL(fileURLWithPath: filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    let directory = root.appendingPathComponent("Fuzz/corpus/\(target)")
    let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
    return try names.map { name in
        (name, [UInt8](try Data(contentsOf: directory.appendingPathComponent(name))))
    }
}

/// Runs every input of `corpus` through `entry`: none may break an
/// invariant or take longer than 2 s.
private func replay(
    _ corpus: [(name: String, bytes: [UInt8])], sourceLocation: SourceLocation = #_sourceLocation,
    _ entry: ([UInt8]) -> String?
) {
    let clock = ContinuousClock()
    for input in corpus {
        var problem: String?
        let elapsed = clock.measure { problem = entry(input.bytes) }
        #expect(problem == nil, "\(input.name): \(problem ?? "")", sourceLocation: sourceLocation)
        #expect(elapsed < .seconds(2), "\(input.name) took \(elapsed)", sourceLocation: sourceLocation)
    }
}

/// The short form of the fuzz targets `framing` and `params`: the seed corpus
/// and every input a long run found (Fuzz/corpus/), through the same entry
/// functions scripts/fuzz builds into libFuzzer binaries.
@Suite("Fuzz corpus replay: framing and call parameters", .timeLimit(.minutes(5)))
struct ProtocolFuzzCorpusTests {
    @Test("Should hold every invariant of the framing target on its whole corpus")
    func framing() throws {
        let corpus = try fuzzCorpus("framing")
        #expect(corpus.count >= 5)
        replay(corpus, ProtocolFuzzEntry.framing)
    }

    @Test("Should hold every invariant of the params target on its whole corpus")
    func params() throws {
        let corpus = try fuzzCorpus("params")
        #expect(corpus.count >= 15)
        replay(corpus, ProtocolFuzzEntry.params)
    }
}

/// Hostile messages where the framing and the JSON decoder meet (issue 13).
@Suite("Hostile messages through framing and call decoding", .timeLimit(.minutes(5)))
struct HostileMessageTests {
    /// Feeds `stream` to a decoder with the server's cap in reads of 64 KiB, as
    /// the server does, and decodes each message as a call.
    private func decode(_ stream: [UInt8]) -> [Result<VarlinkCall, VarlinkCall.DecodingFailure>]? {
        var decoder = VarlinkFrameDecoder()
        var results: [Result<VarlinkCall, VarlinkCall.DecodingFailure>] = []
        var offset = 0
        while offset < stream.count {
            decoder.append(stream[offset..<min(stream.count, offset + 65536)])
            offset += 65536
            do {
                while let message = try decoder.next() {
                    results.append(
                        Result { () throws(VarlinkCall.DecodingFailure) in try VarlinkCall(message: message) })
                }
            } catch {
                return nil
            }
        }
        return results
    }

    @Test("Should refuse a whole megabyte of '[' as invalid JSON at byte 64, and one byte more as too large")
    func deepNestingAtTheCap() {
        let atCap = [UInt8](repeating: UInt8(ascii: "["), count: 1 << 20) + [0]
        let results = decode(atCap)
        #expect(results?.count == 1)
        if case .failure(.invalidJSON(let reason))? = results?.first {
            #expect(reason == "invalid JSON at byte 64: nesting deeper than 64")
        } else {
            Issue.record("expected invalid JSON, got \(String(describing: results))")
        }
        let overCap = [UInt8](repeating: UInt8(ascii: "["), count: (1 << 20) + 1) + [0]
        #expect(decode(overCap) == nil, "over the cap: the stream is refused")
    }

    @Test("Should split a call at a raw NUL inside a string and refuse the first half as unterminated")
    func nulInsideString() {
        let stream =
            Array(#"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"de"#.utf8) + [0]
            + Array(#"mo","user":"a"}}"#.utf8) + [0]
        let results = decode(stream)
        #expect(results?.count == 2)
        guard case .failure(.invalidJSON(let first))? = results?.first else {
            Issue.record("\(String(describing: results))")
            return
        }
        #expect(first.hasSuffix("unterminated string"))
        guard case .failure(.invalidJSON(let second))? = results?.last else {
            Issue.record("\(String(describing: results))")
            return
        }
        #expect(second == "invalid JSON at byte 0: unexpected character")
    }

    @Test("Should refuse a call that names a parameter twice, as invalid JSON, never taking either value")
    func duplicateParameter() {
        let message = Array(
            #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"demo","user":"a","user":"b"}}"#.utf8)
        #expect(throws: VarlinkCall.DecodingFailure.invalidJSON("invalid JSON at byte 80: duplicate member name")) {
            try VarlinkCall(message: message[...])
        }
    }

    @Test("Should refuse a call of more than 16,384 JSON values before parsing the rest, and take one at the limit")
    func valueLimit() throws {
        func login(_ numbers: Int) -> [UInt8] {
            Array(
                (#"{"method":"io.vaultd.Vault.Login","parameters":{"provider":"demo","user":"u","token":"t","profile":{"uid":"u","metadata":{"pad":["#
                    + Array(repeating: "1", count: numbers).joined(separator: ",") + "]}}}}").utf8)
        }
        // The call, method, parameters, provider, user, token, profile, uid, metadata, pad: 10 values.
        let atLimit = try VarlinkCall(message: login(16384 - 10)[...])
        #expect(atLimit.parameters["profile"]?["metadata"]?["pad"]?.arrayValue?.count == 16384 - 10)
        #expect(throws: VarlinkCall.DecodingFailure.self) { try VarlinkCall(message: login(16384 - 9)[...]) }
        let megabyte = login(500_000)
        let clock = ContinuousClock()
        let elapsed = clock.measure { _ = try? VarlinkCall(message: megabyte[...]) }
        #expect(elapsed < .seconds(2), "a refused megabyte of numbers took \(elapsed)")
    }

    @Test("Should refuse a huge number as an int parameter by name, never as a crash")
    func hugeNumbers() throws {
        let signature = try #require(VaultInterface.declaration.signature(of: "GetToken"))
        for number in ["1e300", "-1e300", "9007199254740993", "1.5"] {
            let message = Array(
                #"{"method":"io.vaultd.Vault.GetToken","parameters":{"provider":"d","user":"u","minValidSeconds":\#(number)}}"#
                    .utf8)
            let call = try VarlinkCall(message: message[...])
            #expect(signature.invalidParameter(in: call.parameters) == "minValidSeconds", "\(number)")
        }
        let overflow = Array(#"{"method":"io.vaultd.Vault.GetToken","parameters":{"minValidSeconds":1e999}}"#.utf8)
        #expect(throws: VarlinkCall.DecodingFailure.self) { try VarlinkCall(message: overflow[...]) }
    }
}
