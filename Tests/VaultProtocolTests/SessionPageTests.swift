import Testing
import Varlink
import VaultCore
import VaultProtocol

@Suite("SessionPage", .timeLimit(.minutes(5)))
struct SessionPageTests {
    /// Sessions sorted by (provider, user, ownerUid), some without an owner.
    func sessions(_ count: Int) -> [JSON] {
        var out: [JSON] = []
        for i in 0..<count {
            var session: [String: JSON] = [
                "provider": .string(i % 3 == 0 ? "alpha" : "beta"), "user": .string("u\(1000 + i / 2)"),
            ]
            if i % 2 == 1 { session["ownerUid"] = .int(Int64(500 + i)) }
            out.append(.object(session))
        }
        return out.sorted { SessionPage.Key($0) < SessionPage.Key($1) }
    }

    func walk(_ all: [JSON], limit: Int) throws -> (pages: [[JSON]], calls: Int) {
        var pages: [[JSON]] = []
        var after: String?
        repeat {
            var parameters: [String: JSON] = ["limit": .int(Int64(limit))]
            if let after { parameters["after"] = .string(after) }
            let page = try SessionPage(all, parameters: ParameterReader(parameters))
            pages.append(page.sessions)
            after = page.next
        } while after != nil && pages.count <= all.count
        return (pages, pages.count)
    }

    @Test("Should return every session exactly once across pages, in order", arguments: [1, 2, 7, 50, 1000])
    func everySessionOnce(limit: Int) throws {
        let all = sessions(101)
        let (pages, _) = try walk(all, limit: limit)
        #expect(pages.flatMap { $0 } == all)
        #expect(pages.allSatisfy { $0.count <= limit && !$0.isEmpty })
        #expect(pages.count == (all.count + limit - 1) / limit)
    }

    @Test("Should give a client that passes nothing the first 100 and a cursor")
    func defaults() throws {
        let all = sessions(250)
        let page = try SessionPage(all, parameters: ParameterReader([:]))
        #expect(page.sessions == Array(all.prefix(100)))
        #expect(page.next != nil)
        #expect(page.parameters["next"]?.stringValue == page.next)
        let small = try SessionPage(sessions(3), parameters: ParameterReader([:]))
        #expect(small.sessions.count == 3)
        #expect(small.next == nil)
        #expect(small.parameters["next"] == nil)
        #expect(try SessionPage([], parameters: ParameterReader([:])).sessions.isEmpty)
    }

    @Test("Should continue after a cursor whose session is gone, and order a missing owner as 0")
    func cursorOfARemovedSession() throws {
        var all = sessions(20)
        let first = SessionPage(all, limit: 5, after: nil)
        let cursor = try #require(first.next)
        all.remove(at: 4)
        let second = try SessionPage(all, parameters: ParameterReader(["after": .string(cursor), "limit": .int(5)]))
        #expect(second.sessions == Array(all[4..<9]))
        let a = SessionPage.Key(.object(["provider": .string("p"), "user": .string("u")]))
        let b = SessionPage.Key(.object(["provider": .string("p"), "user": .string("u"), "ownerUid": .int(1)]))
        #expect(a < b)
        #expect(a.ownerUID == 0)
    }

    @Test(
        "Should refuse a bad limit or cursor naming the parameter",
        arguments: [
            ("limit", JSON.int(0)), ("limit", .int(1001)), ("limit", .string("5")), ("after", .string("nope")),
            ("after", .string("[\"p\",\"u\"]")), ("after", .int(3)),
        ])
    func badParameters(name: String, value: JSON) {
        #expect(throws: ParameterReader.Invalid(parameter: name)) {
            try SessionPage(sessions(3), parameters: ParameterReader([name: value]))
        }
    }
}
