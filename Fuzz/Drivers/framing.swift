// The libFuzzer entry of the `framing` target; scripts/fuzz builds it with
// Tests/VaultProtocolTests/FuzzEntries.swift, VaultCore and VaultProtocol, instrumented.

/// Called by libFuzzer once per input; a broken invariant stops the run with its description.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOneInput(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    let input = data.map { Array(UnsafeBufferPointer(start: $0, count: size)) } ?? []
    if let problem = ProtocolFuzzEntry.framing(input) { fatalError("framing: \(problem)") }
    return 0
}
