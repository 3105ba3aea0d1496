/// Deadlines, at most one per key, ordered by time: an indexed binary heap, so
/// that adding, moving or removing a key costs O(log n) and the nearest
/// deadline is known in O(1). The daemon sleeps until `next` instead of
/// scanning its sessions (as ssh-agent's reaper returns its next deadline).
/// `Time` is whatever the owner counts in: wall-clock seconds for sessions,
/// monotonic milliseconds for the serving loop's connections.
public struct DeadlineHeap<Key: Hashable & Sendable, Time: Comparable & Sendable>: Sendable {
    // Inlinable: specialized where it is used (see DenseTable).
    @usableFromInline var heap: [(deadline: Time, key: Key)] = []
    @usableFromInline var positions: [Key: Int] = [:]

    /// An empty queue.
    @inlinable public init() {}

    /// The number of keys scheduled.
    @inlinable public var count: Int { heap.count }

    /// Makes room for `capacity` keys, so that scheduling that many grows nothing.
    @inlinable public mutating func reserveCapacity(_ capacity: Int) {
        heap.reserveCapacity(capacity)
        positions.reserveCapacity(capacity)
    }

    /// The nearest deadline and its key.
    @inlinable public var next: (key: Key, deadline: Time)? { heap.first.map { ($0.key, $0.deadline) } }

    /// The deadline of `key`, if scheduled.
    @inlinable public func deadline(of key: Key) -> Time? { positions[key].map { heap[$0].deadline } }

    /// Schedules `key` at `deadline`, moving it if it was scheduled already.
    @inlinable public mutating func schedule(_ key: Key, at deadline: Time) {
        let next = heap.count
        // Adds `key` at the end when absent, in the same lookup.
        let index = Self.read(&positions[key, default: next])
        guard index != next else {
            heap.append((deadline, key))
            siftUp(next)
            return
        }
        let old = heap[index].deadline
        heap[index].deadline = deadline
        if deadline < old { siftUp(index) } else { siftDown(index) }
    }

    @inlinable static func read(_ value: inout Int) -> Int { value }

    /// Removes `key`; nothing happens when it is not scheduled.
    @inlinable public mutating func cancel(_ key: Key) {
        guard let index = positions.removeValue(forKey: key) else { return }
        let last = heap.count - 1
        if index != last {
            heap.swapAt(index, last)
            positions[heap[index].key] = index
        }
        heap.removeLast()
        if index < heap.count {
            siftDown(index)
            siftUp(index)
        }
    }

    /// Removes and returns every key whose deadline is at or before `now`, nearest first.
    @inlinable public mutating func popDue(at now: Time) -> [Key] {
        var due: [Key] = []
        while let first = heap.first, first.deadline <= now {
            due.append(first.key)
            cancel(first.key)
        }
        return due
    }

    @inlinable mutating func siftUp(_ start: Int) {
        var child = start
        while child > 0 {
            let parent = (child - 1) / 2
            guard heap[child].deadline < heap[parent].deadline else { return }
            swapEntries(child, parent)
            child = parent
        }
    }

    @inlinable mutating func siftDown(_ start: Int) {
        var parent = start
        while true {
            let left = 2 * parent + 1
            let right = left + 1
            var smallest = parent
            if left < heap.count, heap[left].deadline < heap[smallest].deadline { smallest = left }
            if right < heap.count, heap[right].deadline < heap[smallest].deadline { smallest = right }
            guard smallest != parent else { return }
            swapEntries(parent, smallest)
            parent = smallest
        }
    }

    @inlinable mutating func swapEntries(_ a: Int, _ b: Int) {
        heap.swapAt(a, b)
        positions[heap[a].key] = a
        positions[heap[b].key] = b
    }
}
