// The libFuzzer entry of the `json` target; scripts/fuzz builds it with
// Tests/VaultCoreTests/FuzzEntries.swift and VaultCore, instrumented.

/// Called by libFuzzer once per input; a broken invariant stops the run with its description.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    if let problem = CoreFuzzEntry.json(input) { fatalError("json: \(problem)") }
    return 0
}
