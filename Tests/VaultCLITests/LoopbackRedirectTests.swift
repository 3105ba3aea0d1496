import Testing

@testable import VaultCLI

/// The redirect vaultctl's loopback listener reads from a request line
/// (`vaultctl login --browser`, issue 32 item 3).
@Suite("The browser login's redirect, parsed", .timeLimit(.minutes(5)))
struct LoopbackRedirectTests {
    @Test("Should read the code and the state, percent-decoded")
    func code() {
        #expect(
            LoopbackRedirect.parse(requestLine: "GET /?code=ab%2Fc%2B1&state=s-1_2 HTTP/1.1")
                == .code(code: "ab/c+1", state: "s-1_2"))
        #expect(LoopbackRedirect.parse(requestLine: "GET /?state=s&code=x HTTP/1.0") == .code(code: "x", state: "s"))
        #expect(LoopbackRedirect.parse(requestLine: "GET /?code=x HTTP/1.1") == .code(code: "x", state: nil))
    }

    @Test("Should read an error redirect with its description")
    func error() {
        #expect(
            LoopbackRedirect.parse(
                requestLine: "GET /?error=access_denied&error_description=The+user+said+no%21&state=s HTTP/1.1")
                == .error(code: "access_denied", description: "The user said no!", state: "s"))
        #expect(
            LoopbackRedirect.parse(requestLine: "GET /?error=server_error HTTP/1.1")
                == .error(code: "server_error", description: nil, state: nil))
    }

    @Test(
        "Should take anything else for no redirect",
        arguments: [
            "GET /favicon.ico HTTP/1.1", "POST /?code=x&state=s HTTP/1.1", "GET / HTTP/1.1",
            "GET /?code=&state=s HTTP/1.1",
            "GET /?code=x&code=y&state=s HTTP/1.1", "GET /?code=%zz&state=s HTTP/1.1",
            "GET /?code=%FF&state=s HTTP/1.1",
            "GET /?code=x&state=s", "GET /cb?code=x&state=s HTTP/1.1", "", "GET  /?code=x HTTP/1.1",
        ])
    func other(line: String) {
        #expect(LoopbackRedirect.parse(requestLine: line) == .other)
    }

    @Test("Should keep a provider's words printable and short")
    func printable() {
        #expect(LoopbackRedirect.printable("a\u{1B}[31mb\nc") == "a[31mbc")
        #expect(LoopbackRedirect.printable(String(repeating: "x", count: 500)).count == 200)
    }
}
