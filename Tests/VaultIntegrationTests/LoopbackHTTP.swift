import Foundation
import Glibc

/// A blocking HTTP/1.1 client for the test servers on loopback: one request
/// per connection (`Connection: close`), the answer read to the end of the
/// stream, every wait bounded by a socket timeout.
///
/// The tests used URLSession.shared, whose task registry in
/// swift-corelibs-foundation aborted the whole test process once under load
/// ("TaskRegistry.swift:118: Fatal error"); the test servers need nothing
/// more than this.
enum LoopbackHTTP {
    struct Response {
        var status: Int
        var body: [UInt8]
        /// The header fields, by their names in lowercase (the last of a repeated one).
        var headers: [String: String] = [:]
    }

    /// Sends `method path` to the server at `url` (`http://127.0.0.1:PORT`)
    /// with `headers` and `body`, and returns the status and body.
    static func request(
        _ method: String, url: String, path: String, headers: [String: String] = [:], body: [UInt8] = [],
        timeoutSeconds: Int = 30
    ) throws -> Response {
        guard url.hasPrefix("http://127.0.0.1:"), let port = UInt16(url.dropFirst("http://127.0.0.1:".count)) else {
            throw HarnessError("not a loopback URL: \(url)")
        }
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw HarnessError("socket: errno \(errno)") }
        defer { close(fd) }
        var timeout = timeval(tv_sec: timeoutSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7f00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else { throw HarnessError("connect to \(url): errno \(errno)") }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
        for (name, value) in headers { head += "\(name): \(value)\r\n" }
        head += "Content-Length: \(body.count)\r\n\r\n"
        let message = Array(head.utf8) + body
        var sent = 0
        while sent < message.count {
            let n = message[sent...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            guard n > 0 else { throw HarnessError("send to \(url): errno \(errno)") }
            sent += n
        }
        var answer: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while answer.count < 64 << 20 {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n < 0 && errno == EINTR { continue }
            guard n >= 0 else {
                throw HarnessError("receive from \(url): errno \(errno) (timeout \(timeoutSeconds) s)")
            }
            if n == 0 { break }
            answer += chunk[0..<n]
        }
        let separator: [UInt8] = [13, 10, 13, 10]
        guard let end = answer.indices.first(where: { answer[$0...].starts(with: separator) }),
            case let lines = String(decoding: answer[..<end], as: UTF8.self).split(separator: "\r\n"),
            let statusLine = lines.first, let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "")
        else { throw HarnessError("no HTTP answer from \(url)\(path)") }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { continue }
            headers[line[..<colon].lowercased()] = line[line.index(after: colon)...]
                .trimmingCharacters(in: .whitespaces)
        }
        return Response(status: status, body: Array(answer[(end + 4)...]), headers: headers)
    }
}
