import Varlink
import VaultCore

/// One page of `ListSessions`: a pure function of the sorted sessions, the
/// page size and the cursor, so that the reply of a call stays bounded however
/// many sessions there are, and a client walks them all by passing `next` back.
public struct SessionPage: Sendable, Equatable {
    /// The sessions of this page, in order.
    public var sessions: [JSON]
    /// The cursor of the following page; nil on the last.
    public var next: String?

    /// Sessions per page when the caller does not say.
    public static let defaultLimit = 100
    /// The most sessions one page holds.
    public static let maximumLimit = 1000

    /// What orders sessions and what a cursor holds: provider, user, owner uid
    /// (a missing `ownerUid` counts as 0).
    public struct Key: Sendable, Comparable {
        public var provider: String
        public var user: String
        public var ownerUID: Int64

        /// The key of a session as clients see it.
        public init(_ session: JSON) {
            provider = session["provider"]?.stringValue ?? ""
            user = session["user"]?.stringValue ?? ""
            ownerUID = session["ownerUid"]?.integerValue ?? 0
        }

        init(provider: String, user: String, ownerUID: Int64) {
            self.provider = provider
            self.user = user
            self.ownerUID = ownerUID
        }

        public static func < (lhs: Key, rhs: Key) -> Bool {
            (lhs.provider, lhs.user, lhs.ownerUID) < (rhs.provider, rhs.user, rhs.ownerUID)
        }

        /// The opaque cursor text: the key as a JSON array.
        var cursor: String {
            JSON.array([.string(provider), .string(user), .int(ownerUID)]).text
        }

        /// The key a cursor holds; nil when the text is not one.
        init?(cursor: String) {
            guard let parts = (try? JSON.parse(cursor))?.arrayValue, parts.count == 3,
                let provider = parts[0].stringValue, let user = parts[1].stringValue,
                let owner = parts[2].integerValue
            else { return nil }
            self.init(provider: provider, user: user, ownerUID: owner)
        }
    }

    /// The page of `sessions` (sorted by `Key`) holding at most `limit` of them
    /// after the cursor `after` (from the start when nil).
    public init(_ sessions: [JSON], limit: Int, after: Key?) {
        var start = sessions.startIndex
        if let after {
            // The first session past the cursor: a binary search on the sorted keys.
            var low = sessions.startIndex
            var high = sessions.endIndex
            while low < high {
                let middle = low + (high - low) / 2
                if Key(sessions[middle]) <= after { low = middle + 1 } else { high = middle }
            }
            start = low
        }
        let end = min(sessions.endIndex, start + max(1, limit))
        self.sessions = Array(sessions[start..<end])
        self.next = end < sessions.endIndex ? self.sessions.last.map { Key($0).cursor } : nil
    }

    /// The page a `ListSessions` call asks for with its `limit` and `after`
    /// parameters; a bad one throws naming it.
    public init(_ sessions: [JSON], parameters p: ParameterReader) throws(ParameterReader.Invalid) {
        let limit = try p.optionalInt("limit") ?? Int64(SessionPage.defaultLimit)
        guard limit >= 1, limit <= Int64(SessionPage.maximumLimit) else {
            throw ParameterReader.Invalid(parameter: "limit")
        }
        var after: Key?
        if let cursor = try p.optionalString("after") {
            guard let key = Key(cursor: cursor) else { throw ParameterReader.Invalid(parameter: "after") }
            after = key
        }
        self.init(sessions, limit: Int(limit), after: after)
    }

    /// The parameters of the reply: `sessions`, and `next` unless this is the last page.
    public var parameters: [String: JSON] {
        var out: [String: JSON] = ["sessions": .array(sessions)]
        if let next { out["next"] = .string(next) }
        return out
    }
}
