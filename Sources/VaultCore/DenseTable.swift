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
    // Inlinable, so that a module using the table specializes it for its
    // types: unspecialized, every access went through generic metadata
    // lookups (a fifth of vaultd's start-up with 100,000 sessions).
    @usableFromInline var positions: [Key: Int] = [:]
    /// The keys, in the order of `slots`.
    @usableFromInline var storedKeys: [Key] = []
    /// Never nil between accesses: optional only so that `subscript`'s
    /// `_modify` can yield a slot in place, nil meaning "remove".
    @usableFromInline var slots: [Value?] = []

    /// The keys, in the order of `values`.
    @inlinable public var keys: [Key] { storedKeys }

    /// Makes room for `capacity` entries, so that filling the table does not
    /// rehash and copy it as it grows (start-up knows how many sessions come).
    @inlinable public mutating func reserveCapacity(_ capacity: Int) {
        positions.reserveCapacity(capacity)
        storedKeys.reserveCapacity(capacity)
        slots.reserveCapacity(capacity)
    }

    /// An empty table.
    @inlinable public init() {}

    /// The number of entries.
    @inlinable public var count: Int { storedKeys.count }

    /// Whether the table has no entries.
    @inlinable public var isEmpty: Bool { storedKeys.isEmpty }

    /// The values, in the order of `keys`.
    @inlinable public var values: some Collection<Value> { slots.lazy.map { $0! } }

    /// What `body` makes of the value of `key` where it is kept, or nil when
    /// there is none: `table[key]` copies the whole value out first.
    @inlinable public func read<R>(_ key: Key, _ body: (borrowing Value) -> R) -> R? {
        guard let position = positions[key] else { return nil }
        return slots.withUnsafeBufferPointer { slots in body(slots[position].unsafelyUnwrapped) }
    }

    /// The value of `key`, or nil; setting nil removes the entry.
    @inlinable public subscript(key: Key) -> Value? {
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

    /// Sets the value of `key` and returns the one it replaced, or nil when
    /// the key is new. Finds the key once (`table[key] = value` looks a new
    /// key up twice: to miss it, then to add it).
    @inlinable @discardableResult
    public mutating func updateValue(_ value: Value, forKey key: Key) -> Value? {
        let next = storedKeys.count
        // Adds `key` at `next` when absent, in the same lookup.
        let position = Self.read(&positions[key, default: next])
        guard position != next else {
            storedKeys.append(key)
            slots.append(value)
            return nil
        }
        defer { slots[position] = value }
        return slots[position]
    }

    @inlinable static func read(_ value: inout Int) -> Int { value }

    /// Removes the entry of `key` and returns its value, or nil when there was none.
    @inlinable @discardableResult
    public mutating func removeValue(forKey key: Key) -> Value? {
        guard let position = positions[key] else { return nil }
        let value = slots[position]
        remove(at: position)
        return value
    }

    @inlinable mutating func append(_ key: Key, _ value: Value) {
        positions[key] = storedKeys.count
        storedKeys.append(key)
        slots.append(value)
    }

    /// Removes the entry at `position`, moving the last entry into its place.
    @inlinable mutating func remove(at position: Int) {
        positions[storedKeys[position]] = nil
        let last = storedKeys.count - 1
        if position != last {
            storedKeys.swapAt(position, last)
            slots.swapAt(position, last)
            positions[storedKeys[position]] = position
        }
        storedKeys.removeLast()
        slots.removeLast()
    }
}

extension DenseTable: Sequence {
    /// Iterates over the entries as `(key, value)` pairs, in the order of `keys`.
    public struct Iterator: IteratorProtocol {
        @usableFromInline let table: DenseTable
        @usableFromInline var position = 0

        @inlinable init(_ table: DenseTable) { self.table = table }

        /// The next entry, or nil after the last.
        @inlinable public mutating func next() -> (key: Key, value: Value)? {
            guard position < table.storedKeys.count else { return nil }
            defer { position += 1 }
            return (table.storedKeys[position], table.slots[position]!)
        }
    }

    /// An iterator over the entries.
    @inlinable public func makeIterator() -> Iterator { Iterator(self) }

    /// The number of entries.
    @inlinable public var underestimatedCount: Int { count }
}

extension DenseTable: Sendable where Key: Sendable, Value: Sendable {}
