import Testing
import VaultCore

@Suite(.timeLimit(.minutes(5)))
struct DenseTableTests {
    /// Should behave as a Dictionary through any sequence of sets, in-place
    /// modifications and removals (a model check with a seeded generator).
    @Test func matchesDictionary() {
        var generator = SplitMix64(state: 0x5eed)
        for _ in 0..<50 {
            var table = DenseTable<Int, [Int]>()
            var model: [Int: [Int]] = [:]
            for _ in 0..<400 {
                let key = Int(generator.next() % 40)
                switch generator.next() % 5 {
                case 0:
                    table[key] = [key]
                    model[key] = [key]
                case 1:
                    table[key]?.append(1)
                    model[key]?.append(1)
                case 2:
                    table[key] = nil
                    model[key] = nil
                case 3: #expect(table.removeValue(forKey: key) == model.removeValue(forKey: key))
                default: #expect(table[key] == model[key])
                }
                #expect(table.count == model.count)
            }
            #expect(Dictionary(uniqueKeysWithValues: table.map { ($0.key, $0.value) }) == model)
            #expect(Set(table.keys) == Set(model.keys))
            let tableTotal = table.values.reduce(0) { $0 + $1.count }
            let modelTotal = model.values.reduce(0) { $0 + $1.count }
            #expect(tableTotal == modelTotal)
        }
    }

    /// Should modify a value where it is stored: an array inside it keeps its
    /// buffer (a copy of the value would make the append copy the array).
    @Test func modifiesInPlace() {
        var table = DenseTable<String, [Int]>()
        var values = [Int]()
        values.reserveCapacity(16)
        values.append(1)
        table["a"] = values
        values = []
        let before = table["a"]!.withUnsafeBufferPointer { $0.baseAddress }
        table["a"]?.append(2)
        let after = table["a"]!.withUnsafeBufferPointer { $0.baseAddress }
        #expect(before == after)
        #expect(table["a"] == [1, 2])
    }

    /// Should insert through an optional-chained write only when the value is
    /// set, and remove when the modification leaves nil.
    @Test func modifyInsertsAndRemoves() {
        var table = DenseTable<String, Int>()
        table["a"]? += 1
        #expect(table.isEmpty)
        modify(&table["a"]) { $0 = 5 }
        #expect(table["a"] == 5)
        modify(&table["a"]) { $0 = nil }
        #expect(table["a"] == nil && table.isEmpty)
    }

    /// Should keep every other entry reachable after a removal moves the last
    /// entry into the freed place.
    @Test func removalKeepsPositions() {
        var table = DenseTable<Int, Int>()
        for key in 0..<10 { table[key] = key * 10 }
        table[3] = nil
        table[0] = nil
        table[9] = nil
        for key in [1, 2, 4, 5, 6, 7, 8] { #expect(table[key] == key * 10) }
        #expect(table[3] == nil && table[0] == nil && table[9] == nil)
        #expect(table.count == 7)
        #expect(table.keys.sorted() == [1, 2, 4, 5, 6, 7, 8])
    }

    private func modify<T>(_ value: inout T?, _ body: (inout T?) -> Void) { body(&value) }
}
