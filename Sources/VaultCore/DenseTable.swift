/// A dictionary for large values that keeps them in one dense array, found
/// through an index of keys to positions.
///
/// A `Dictionary` stores each value in its hash table's bucket, and a table
/// is at most three quarters full (with 1,000 entries it has 2,048 buckets),
/// so a 350-byte value costs up to 700 bytes of table. Here the table holds
/// only key and position; the values sit side by side in an array that grows
/// as `Array` does. A removal moves the last value into the freed place, so
/// the order of iteration is insertion order until the first removal, and
/// arbitrary after it, as a dictionary's is.
///
/// `table[key]?.field = x` and `table[key] = nil` work as on a dictionary and
/// modify the value in place, without a copy.
public struct DenseTable<Key: Hashable, Value> {
    private var positions: [Key: Int] = [:]
    /// The keys, in the order of `slots`.
    public private(set) var keys: [Key] = []
    /// Never nil between accesses: optional only so that `subscript`'s
    /// `_modify` can yield a slot in place, nil meaning "remove".
    private var slots: [Value?] = []

    /// An empty table.
    public init() {}

    /// The number of entries.
    public var count: Int { keys.count }

    /// Whether the table has no entries.
    public var isEmpty: Bool { keys.isEmpty }

    /// The values, in the order of `keys`.
    public var values: some Collection<Value> { slots.lazy.map { $0! } }

    /// The value of `key`, or nil; setting nil removes the entry.
    public subscript(key: Key) -> Value? {
        get {
            guard let position = positions[key] else { return nil }
            return slots[position]
        }
        set {
            if let position = positions[key] {
                if let newValue {
                    slots[position] = newValue
                } else {
                    remove(at: position)
                }
            } else if let newValue {
                append(key, newValue)
            }
        }
        _modify {
            if let position = positions[key] {
                defer { if slots[position] == nil { remove(at: position) } }
                yield &slots[position]
            } else {
                var value: Value? = nil
                defer { if let value { append(key, value) } }
                yield &value
            }
        }
    }

    /// Removes the entry of `key` and returns its value, or nil when there was none.
    @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        guard let position = positions[key] else { return nil }
        let value = slots[position]
        remove(at: position)
        return value
    }

    private mutating func append(_ key: Key, _ value: Value) {
        positions[key] = keys.count
        keys.append(key)
        slots.append(value)
    }

    /// Removes the entry at `position`, moving the last entry into its place.
    private mutating func remove(at position: Int) {
        positions[keys[position]] = nil
        let last = keys.count - 1
        if position != last {
            keys.swapAt(position, last)
            slots.swapAt(position, last)
            positions[keys[position]] = position
        }
        keys.removeLast()
        slots.removeLast()
    }
}

extension DenseTable: Sequence {
    /// Iterates over the entries as `(key, value)` pairs, in the order of `keys`.
    public struct Iterator: IteratorProtocol {
        private let table: DenseTable
        private var position = 0

        fileprivate init(_ table: DenseTable) { self.table = table }

        /// The next entry, or nil after the last.
        public mutating func next() -> (key: Key, value: Value)? {
            guard position < table.keys.count else { return nil }
            defer { position += 1 }
            return (table.keys[position], table.slots[position]!)
        }
    }

    /// An iterator over the entries.
    public func makeIterator() -> Iterator { Iterator(self) }

    /// The number of entries.
    public var underestimatedCount: Int { count }
}

extension DenseTable: Sendable where Key: Sendable, Value: Sendable {}
