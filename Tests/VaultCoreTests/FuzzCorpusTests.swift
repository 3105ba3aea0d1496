import Foundation
import Testing
import Varlink
import VaultCore

/// The committed seed corpus of a fuzz target (Fuzz/corpus/TARGET), each file's name and bytes.
func fuzzCorpus(_ target: String, filePath: String = #filePath) throws -> [(name: String, bytes: [UInt8])] {
    let root = URL(fileURLWithPath: filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent()
    let directory = root.appendingPathComponent("Fuzz/corpus/\(target)")
    let names = try FileManager.default.contentsOfDirectory(atPath: directory.path).sorted()
    return try names.map { name in
        (name, [UInt8](try Data(contentsOf: directory.appendingPathComponent(name))))
    }
}

/// Runs every input of `corpus` through `entry`: none may break an
/// invariant, and none may take longer than `limit` seconds (the long form,
/// scripts/fuzz, has libFuzzer's -timeout for that; this is the short form).
func replay(
    _ corpus: [(name: String, bytes: [UInt8])], limit: Double = 2, sourceLocation: SourceLocation = #_sourceLocation,
    _ entry: ([UInt8]) -> String?
) {
    let clock = ContinuousClock()
    for input in corpus {
        var problem: String?
        let elapsed = clock.measure { problem = entry(input.bytes) }
        #expect(problem == nil, "\(input.name): \(problem ?? "")", sourceLocation: sourceLocation)
        #expect(elapsed < .seconds(limit), "\(input.name) took \(elapsed)", sourceLocation: sourceLocation)
    }
}

/// The short form of the fuzz targets `json` and `config`: the seed corpus
/// and every input a long run found (Fuzz/corpus/), through the same entry
/// functions scripts/fuzz builds into libFuzzer binaries.
@Suite("Fuzz corpus replay: JSON and config", .timeLimit(.minutes(5)))
struct CoreFuzzCorpusTests {
    @Test("Should hold every invariant of the json target on its whole corpus")
    func json() throws {
        let corpus = try fuzzCorpus("json")
        #expect(corpus.count >= 20)
        replay(corpus, CoreFuzzEntry.json)
    }

    @Test("Should hold every invariant of the config target on its whole corpus")
    func config() throws {
        let corpus = try fuzzCorpus("config")
        #expect(corpus.count >= 10)
        replay(corpus, CoreFuzzEntry.config)
    }

    @Test("Should report what a broken invariant looks like, so a failing replay says why")
    func entriesReportProblems() {
        #expect(CoreFuzzEntry.fileAndLineProblem("/f:3: x", ["/f": 2]) == "line 3 of /f, which has 2")
        #expect(CoreFuzzEntry.fileAndLineProblem("cannot read", ["/f": 2])?.hasPrefix("an error without") == true)
        #expect(CoreFuzzEntry.fileAndLineProblem("/f:2: x", ["/f": 2]) == nil)
        #expect(CoreFuzzEntry.depth(try! JSON.parse("[[{}],1]")) == 3)
    }
}
