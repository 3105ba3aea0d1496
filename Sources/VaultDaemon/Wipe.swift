import CShim

extension Array where Element == UInt8 {
    /// Overwrites every byte with zero in a way the compiler cannot drop:
    /// for buffers that held a secret, before they are freed.
    mutating func wipe() {
        withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) }
    }
}
