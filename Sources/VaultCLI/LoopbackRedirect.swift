import Glibc
import VaultSystem

/// What the browser brought to vaultctl's loopback listener (RFC 8252
/// section 7.3), read from an HTTP/1.1 request line alone.
public enum LoopbackRedirect: Equatable, Sendable {
    /// The authorization response (RFC 6749 section 4.1.2): the code and the state.
    case code(code: String, state: String?)
    /// The error response (RFC 6749 section 4.1.2.1): its `error`, `error_description` and state.
    case error(code: String, description: String?, state: String?)
    /// Anything else (another path or method, a favicon, a malformed line):
    /// answered 404, and the wait goes on.
    case other

    /// The redirect a request line (`GET /?code=...&state=... HTTP/1.1`)
    /// carries; `path` is the redirect URI's path. A parameter given twice,
    /// or one that does not percent-decode to UTF-8, makes it `other`.
    public static func parse(requestLine line: String, path: String = "/") -> LoopbackRedirect {
        let parts = line.split(separator: " ", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == "GET", parts[2].hasPrefix("HTTP/1.") else { return .other }
        let target = parts[1]
        let (targetPath, query) =
            target.firstIndex(of: "?").map { (target[..<$0], target[target.index(after: $0)...]) } ?? (target, "")
        guard targetPath == path else { return .other }
        var fields: [String: String] = [:]
        for pair in query.split(separator: "&") {
            let halves = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = decode(halves[0]), let value = decode(halves.count > 1 ? halves[1] : ""),
                fields[name] == nil
            else { return .other }
            fields[name] = value
        }
        let state = fields["state"]
        if let error = fields["error"] {
            return .error(code: error, description: fields["error_description"], state: state)
        }
        if let code = fields["code"], !code.isEmpty { return .code(code: code, state: state) }
        return .other
    }

    /// `text` form-urlencoded back to text: `%XX` and `+` for a space; nil
    /// when an escape is broken or the bytes are no UTF-8.
    static func decode(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var iterator = text.utf8.makeIterator()
        while let byte = iterator.next() {
            switch byte {
            case UInt8(ascii: "+"): bytes.append(UInt8(ascii: " "))
            case UInt8(ascii: "%"):
                guard let high = iterator.next().flatMap(hexValue), let low = iterator.next().flatMap(hexValue) else {
                    return nil
                }
                bytes.append(high << 4 | low)
            default: bytes.append(byte)
            }
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): return byte - UInt8(ascii: "A") + 10
        default: return nil
        }
    }

    /// A provider's words for a terminal: control characters dropped, at most 200 characters.
    static func printable(_ text: String) -> String {
        String(
            String.UnicodeScalarView(text.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F }).prefix(200))
    }
}

/// A TCP listener on 127.0.0.1, on a port the kernel picks, that takes one
/// HTTP/1.1 request at a time: the request line and headers (at most
/// `requestLimit` bytes, within the time left), then a short answer.
final class LoopbackListener {
    /// The most bytes of one request read: a request line with a long code, and the headers.
    static let requestLimit = 16 * 1024
    let fd: Int32
    let port: UInt16

    /// Listens on 127.0.0.1 on an ephemeral port; nil with why not.
    static func open() -> Result<LoopbackListener, SystemError> {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return .failure(SystemError("socket", errno: errno)) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { raw in
                bind(fd, raw, length) == 0 && listen(fd, 8) == 0 && getsockname(fd, raw, &length) == 0
            }
        }
        guard bound else {
            let failure = SystemError("listen on 127.0.0.1", errno: errno)
            close(fd)
            return .failure(failure)
        }
        return .success(LoopbackListener(fd: fd, port: UInt16(bigEndian: address.sin_port)))
    }

    private init(fd: Int32, port: UInt16) {
        self.fd = fd
        self.port = port
    }

    deinit { close(fd) }

    /// The redirect URI of this listener.
    var redirectURI: String { "http://127.0.0.1:\(port)/" }

    /// Waits up to `milliseconds` for a connection; nil when none came.
    func accept(within milliseconds: Int32) -> Int32? {
        var poller = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&poller, 1, max(0, milliseconds)) == 1 else { return nil }
        // accept4 is not in Glibc's Swift module; vaultctl spawns nothing meanwhile.
        let client = Glibc.accept(fd, nil, nil)
        guard client >= 0 else { return nil }
        _ = fcntl(client, F_SETFD, FD_CLOEXEC)
        return client
    }

    /// The request line of the request on `client`, read until the end of
    /// its headers, `requestLimit` bytes or `deadline` (monotonic
    /// milliseconds), whichever comes first; nil when there is none.
    static func requestLine(_ client: Int32, deadline: UInt64) -> String? {
        var bytes: [UInt8] = []
        defer { bytes.wipe() }
        var chunk = [UInt8](repeating: 0, count: 4096)
        defer { chunk.wipe() }
        let end: [UInt8] = [13, 10, 13, 10]
        while bytes.count < requestLimit {
            let now = Monotonic.milliseconds()
            guard now < deadline else { break }
            var poller = pollfd(fd: client, events: Int16(POLLIN), revents: 0)
            guard poll(&poller, 1, Int32(min(deadline - now, 60_000))) == 1 else { break }
            let n = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            bytes += chunk[0..<n]
            if bytes.count >= 4, bytes.indices.dropLast(3).contains(where: { bytes[$0...].starts(with: end) }) {
                break
            }
        }
        guard let lineEnd = bytes.firstIndex(of: 13), lineEnd + 1 < bytes.count, bytes[lineEnd + 1] == 10 else {
            return nil
        }
        return String(validating: bytes[..<lineEnd], as: UTF8.self)
    }

    /// Answers `client` with `status` and a short HTML page saying `text`, then closes it.
    static func answer(_ client: Int32, status: String, _ text: String) {
        let body = Array(
            "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>vaultctl</title></head><body><p>\(text)</p></body></html>\n"
                .utf8)
        let head =
            "HTTP/1.1 \(status)\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: \(body.count)\r\nCache-Control: no-store\r\nReferrer-Policy: no-referrer\r\nConnection: close\r\n\r\n"
        let message = Array(head.utf8) + body
        var sent = 0
        while sent < message.count {
            let n = message[sent...].withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            sent += n
        }
        shutdown(client, Int32(SHUT_WR))
        close(client)
    }
}
