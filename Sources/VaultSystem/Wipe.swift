import CShim

/// Zeroing of byte buffers that held a secret.
extension Array where Element == UInt8 {
    /// Overwrites every byte with zero in a way the compiler cannot drop:
    /// for buffers that held a secret, before they are freed.
    @inlinable public mutating func wipe() {
        withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress, $0.count) }
    }

    /// Zeroes the bytes in `range` (used ones, not the spare capacity): O(range).
    @inlinable public mutating func wipe(_ range: Range<Int>) {
        guard !range.isEmpty else { return }
        withUnsafeMutableBytes { vaultd_explicit_bzero($0.baseAddress! + range.lowerBound, range.count) }
    }

    /// Makes room for `extra` more bytes without Array's own growth, which
    /// frees the old storage as it is: the bytes move to a larger buffer and
    /// the old one is zeroed first.
    @inlinable public mutating func reserveWiping(_ extra: Int) {
        guard count + extra > capacity else { return }
        var grown: [UInt8] = []
        grown.reserveCapacity(Swift.max(capacity * 2, count + extra))
        grown.append(contentsOf: self)
        wipe(0..<count)
        self = grown
    }
}

extension UnsafeMutableRawBufferPointer {
    /// Zeroes the first `count` bytes (at most the buffer's) in a way the
    /// compiler cannot drop: for a receive buffer, before it is freed.
    @inlinable public func wipe(first count: Int) {
        guard let base = baseAddress else { return }
        vaultd_explicit_bzero(base, Swift.min(count, self.count))
    }
}
