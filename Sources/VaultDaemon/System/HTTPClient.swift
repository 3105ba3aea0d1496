import CHTTP
import Dispatch
import VaultCore
import VaultSystem

/// One HTTP answer: its status, body and `Retry-After` header.
package struct HTTPResponse: Sendable {
    package var status: Int
    package var body: [UInt8]
    package var retryAfter: String?
}

/// Why no (whole) HTTP answer came, sorted by what it tells whoever reads it.
package struct HTTPFailure: Error, Sendable, CustomStringConvertible {
    /// What went wrong, as far as the client can tell.
    package enum Kind: Sendable, Equatable {
        /// Nothing listens at the host and port (ECONNREFUSED).
        case refused
        /// The host name did not resolve.
        case unresolved
        /// No answer within the time limit (connecting included).
        case timedOut
        /// The server closed or reset the connection without a whole answer.
        case closed
        /// The body ended before the length the server announced.
        case truncated
        /// The body is larger than `HTTPClient.maximumBody`.
        case tooLarge
        /// The TLS handshake or the certificate check failed.
        case tls
        /// The server answered something that is no HTTP.
        case notHTTP
        /// Anything else (no libcurl, out of memory, a bad URL).
        case other
    }

    package var kind: Kind
    package var reason: String
    package var description: String { reason }

    init(_ kind: Kind = .other, reason: String) {
        self.kind = kind
        self.reason = reason
    }

    /// Sorts libcurl's error `code` (CURLE_*) for a request to `host`, with
    /// libcurl's own words in `detail`, into a kind and a sentence that says
    /// what happened and what to check.
    init(curlCode code: Int32, tooLarge: Bool, detail: String, host: String, timeoutSeconds: Double) {
        switch code {
        case _ where tooLarge, 63:
            self.init(
                .tooLarge,
                reason:
                    "\(host) answered with more than \(HTTPClient.maximumBody) bytes, the most vaultd reads of an answer (is the URL a token endpoint?)"
            )
        case 7:
            self.init(
                .refused,
                reason:
                    "\(host) refused the connection: nothing listens there (the server is down, or the URL's port is wrong)"
            )
        case 6:
            self.init(.unresolved, reason: "the host name of \(host) could not be resolved (\(detail))")
        case 28:
            self.init(
                .timedOut,
                reason: "\(host) timed out: no whole answer within \(Int(timeoutSeconds.rounded(.up)))s (Timeout=)")
        case 52, 55, 56:
            self.init(.closed, reason: "\(host) closed the connection without a whole answer (\(detail))")
        case 18:
            self.init(
                .truncated,
                reason: "\(host)'s answer was cut short: the connection ended before the body it announced did")
        case 35, 51, 53, 54, 58, 59, 60, 64, 66, 77, 80, 82, 83, 90, 91, 98:
            self.init(
                .tls,
                reason:
                    "TLS with \(host) failed (\(detail)): check that the URL names the right host and that its certificate is trusted by the system's CA store"
            )
        case 1, 8:
            self.init(.notHTTP, reason: "\(host) answered something that is no HTTP (\(detail))")
        default:
            self.init(.other, reason: "the request to \(host) failed: \(detail)")
        }
    }
}

/// Form POSTs to OAuth 2.0 endpoints through libcurl. Each request blocks a
/// HTTP worker of `WorkerPool` (never one of the cooperative pool), at
/// most `requestsPerHost` at once to one host, and ends by its timeout at the
/// latest, the wait for a thread included.
package enum HTTPClient {
    /// The largest response body read; a token response is a few kilobytes.
    /// libcurl stops at this many bytes (at once when the Content-Length is
    /// larger), so a server sending megabytes costs vaultd no more than this.
    package static let maximumBody = 64 * 1024
    /// Requests to one host at once; more wait their turn (a hanging token
    /// endpoint holds at most this many of the pool's HTTP workers).
    package static let requestsPerHost = 2

    /// Loads libcurl now, so that a missing library is reported at start-up
    /// instead of at the first refresh. Nil when it is usable, else why not.
    static func loadFailure() -> String? {
        var error = [CChar](repeating: 0, count: 256)
        if vaultd_http_load(&error, error.count) == 0 { return nil }
        return String(decoding: error.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }

    /// POSTs `form` (application/x-www-form-urlencoded) to `url`, with the
    /// header line `authorization` ("Authorization: Basic ...") when given;
    /// the caller wipes its copy of that line, this function its own.
    static func postForm(
        _ url: String, _ form: [(String, String)], authorization: [UInt8]? = nil, timeoutSeconds: Double
    ) async throws(HTTPFailure) -> HTTPResponse {
        try await onLane(of: url, cap: requestsPerHost, timeoutSeconds: timeoutSeconds) { left in
            // Encoded here, so that this is the body's only copy and wiping it counts.
            var body = formEncoded(form)
            var header = authorization.map { $0 + [0] }
            defer { header?.wipe() }
            return post(url, &body, header: &header, timeoutMilliseconds: left, timeoutSeconds: timeoutSeconds)
        }
    }

    /// Runs `request` on an HTTP worker of `WorkerPool`, in the lane of `url`'s host,
    /// at most `cap` at once, with the milliseconds left of `timeoutSeconds`
    /// (the wait for a thread included); a request that waited them all
    /// fails as timed out without being sent.
    private static func onLane(
        of url: String, cap: Int, timeoutSeconds: Double,
        _ request: @escaping @Sendable (_ millisecondsLeft: Int) -> Result<HTTPResponse, HTTPFailure>
    ) async throws(HTTPFailure) -> HTTPResponse {
        let timeout = UInt64(max(0, min(timeoutSeconds, 3600)) * 1000)
        let deadline = Monotonic.milliseconds() + timeout
        let result = await WorkerPool.shared.run(
            .http, lane: "http " + host(of: url), cap: cap, deadline: deadline
        ) { () -> Result<HTTPResponse, HTTPFailure> in
            // A request admitted just before its deadline may start just after it:
            // the time left is checked before it is converted (a wrapped UInt64
            // does not fit an Int, and the conversion traps).
            let now = Monotonic.milliseconds()
            guard now < deadline else {
                return .failure(
                    HTTPFailure(.timedOut, reason: "timed out waiting for a free connection to \(host(of: url))"))
            }
            return request(Int(deadline - now))
        }
        guard let result else {
            throw HTTPFailure(
                .timedOut,
                reason:
                    "no answer within \(Int(timeoutSeconds))s: the request waited the whole time for a free connection to \(host(of: url))"
            )
        }
        return try result.get()
    }

    /// The host (and port) part of an http(s) URL, naming its lane and its
    /// failures; a user part (`user:password@`) is left out.
    package static func host(of url: String) -> String {
        let rest = url.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false)
        guard rest.count > 2 else { return "the endpoint" }
        let authority = rest[2].prefix { $0 != "?" && $0 != "#" }
        return String(authority.split(separator: "@", omittingEmptySubsequences: false).last ?? authority)
    }

    /// POSTs `body` (application/json) to `url` on an HTTP worker of `WorkerPool`, in
    /// the lane of its host, at most `cap` at once; ends by `timeoutSeconds`
    /// at the latest, the wait for a thread included. For etcd's JSON gateway.
    /// `maximumBody`: the largest answer read (etcd's pages of sessions are
    /// larger than a token response).
    package static func postJSON(
        _ url: String, _ body: [UInt8], timeoutSeconds: Double, cap: Int = requestsPerHost, tls: TLSFiles? = nil,
        maximumBody: Int = HTTPClient.maximumBody
    )
        async throws(HTTPFailure) -> HTTPResponse
    {
        try await onLane(of: url, cap: cap, timeoutSeconds: timeoutSeconds) { left in
            var copy = body
            var none: [UInt8]?
            return post(
                url, &copy, header: &none, timeoutMilliseconds: left, timeoutSeconds: timeoutSeconds, json: true,
                tls: tls,
                maximumBody: maximumBody)
        }
    }

    /// `header`: one more header line, NUL-terminated (a secret: the C side
    /// wipes its copy; the caller wipes this one).
    private static func post(
        _ url: String, _ body: inout [UInt8], header: inout [UInt8]?, timeoutMilliseconds: Int, timeoutSeconds: Double,
        json: Bool = false,
        tls: TLSFiles? = nil, maximumBody: Int = HTTPClient.maximumBody
    )
        -> Result<HTTPResponse, HTTPFailure>
    {
        // The body carries the refresh token and client secret: wipe it once sent.
        defer { body.wipe() }
        var response = vaultd_http_response()
        defer { vaultd_http_response_free(&response) }
        let status = body.withUnsafeBytes { raw in
            if let tls {
                return tls.withC { files in
                    vaultd_http_post_json_tls(
                        url, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count, timeoutMilliseconds,
                        maximumBody, files, &response)
                }
            }
            if !json, let line = header {
                return line.withUnsafeBytes { lineRaw in
                    vaultd_http_post_form_header(
                        url, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count,
                        lineRaw.baseAddress?.assumingMemoryBound(to: CChar.self), timeoutMilliseconds, maximumBody,
                        &response)
                }
            }
            return (json ? vaultd_http_post_json : vaultd_http_post_form)(
                url, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count, timeoutMilliseconds,
                maximumBody, &response)
        }
        guard status == 0 else {
            let detail = text(of: &response.error)
            guard response.curl_code != 0 || response.too_large != 0 else {
                return .failure(HTTPFailure(reason: detail))
            }
            return .failure(
                HTTPFailure(
                    curlCode: response.curl_code, tooLarge: response.too_large != 0, detail: detail,
                    host: host(of: url),
                    timeoutSeconds: timeoutSeconds))
        }
        let bytes = response.body.map { Array(UnsafeBufferPointer(start: $0, count: response.body_length)) } ?? []
        let retryAfter = text(of: &response.retry_after)
        return .success(
            HTTPResponse(status: response.status, body: bytes, retryAfter: retryAfter.isEmpty ? nil : retryAfter))
    }

    /// A NUL-terminated C array field as a String.
    private static func text<T>(of field: inout T) -> String {
        withUnsafeBytes(of: &field) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
    }

    /// `application/x-www-form-urlencoded` (RFC 3986 unreserved bytes as they
    /// are, every other byte as %XX), in the order given.
    static func formEncoded(_ form: [(String, String)]) -> [UInt8] {
        var out: [UInt8] = []
        for (index, (key, value)) in form.enumerated() {
            if index > 0 { out.append(UInt8(ascii: "&")) }
            percentEncode(key, into: &out)
            out.append(UInt8(ascii: "="))
            percentEncode(value, into: &out)
        }
        return out
    }

    static func percentEncode(_ text: String, into out: inout [UInt8]) {
        let hex = Array("0123456789ABCDEF".utf8)
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
                UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"),
                UInt8(ascii: "~"):
                out.append(byte)
            default:
                out.append(contentsOf: [UInt8(ascii: "%"), hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            }
        }
    }
}

/// The PEM files of a TLS connection, as libcurl takes them
/// (`CURLOPT_CAINFO`, `CURLOPT_SSLCERT`, `CURLOPT_SSLKEY`).
package struct TLSFiles: Sendable, Equatable {
    /// The CA certificates that sign the server's certificate; nil: the system's bundle.
    package var caFile: String?
    /// This client's certificate; nil: none.
    package var certFile: String?
    /// The private key of `certFile`.
    package var keyFile: String?

    /// The files `[Etcd]` names; nil when it names none.
    package init?(_ settings: EtcdSettings) {
        guard settings.caFile != nil || settings.certFile != nil || settings.keyFile != nil else { return nil }
        caFile = settings.caFile
        certFile = settings.certFile
        keyFile = settings.keyFile
    }

    /// Runs `body` with the files as the C client's settings.
    func withC<T>(_ body: (UnsafePointer<vaultd_http_tls>) -> T) -> T {
        func with(_ text: String?, _ body: (UnsafePointer<CChar>?) -> T) -> T {
            guard let text else { return body(nil) }
            return text.withCString { body($0) }
        }
        return with(caFile) { ca in
            with(certFile) { cert in
                with(keyFile) { key in
                    var files = vaultd_http_tls(ca_file: ca, cert_file: cert, key_file: key)
                    return body(&files)
                }
            }
        }
    }
}
