import CHTTP
import Glibc
import VaultSystem

/// How a streaming POST ended.
package struct HTTPStreamEnd: Sendable {
    /// The HTTP status of the answer, 0 when none came.
    package var status: Int
    /// Why the transfer did not end as the server ended it; nil when it did.
    package var failure: HTTPFailure?
    /// True when no byte arrived within the idle timeout.
    package var idle: Bool
    /// True when `HTTPStream.cancel()` ended it (or came before it).
    package var cancelled: Bool
    /// True when the reader asked to stop.
    package var stopped: Bool
}

/// One streaming POST at a time whose answer is read as it arrives (etcd's
/// `/v3/watch`, a long-lived answer of JSON objects), on libcurl. `post`
/// blocks its thread for as long as the answer lasts: run it on a thread of
/// its own, never on the cooperative pool or `WorkerPool` (whose
/// few threads it would hold). `cancel()` ends it at once from any thread.
package final class HTTPStream: @unchecked Sendable {
    // The C handle is thread-safe for cancel; post runs one at a time (the owner's thread).
    private let handle: OpaquePointer

    /// A stream handle; nil when out of memory.
    package init?() {
        guard let handle = vaultd_http_stream_new() else { return nil }
        self.handle = handle
    }

    deinit { vaultd_http_stream_free(handle) }

    /// Ends the transfer in progress at once (its socket is shut down), and
    /// every later `post` before it starts: a stream cancelled stays so.
    package func cancel() { vaultd_http_stream_cancel(handle) }

    /// POSTs `body` (application/json) with the extra `headers` ("Name:
    /// value") to `url` and hands each piece of the answer's body to `onData`
    /// as it arrives, on this thread, until the server ends the answer, the
    /// connection fails or is not made within `connectTimeoutSeconds`, no
    /// byte arrives for `idleTimeoutSeconds` (0: no limit), `onData` returns
    /// false, or `cancel()` is called. The body is the caller's to wipe.
    package func post(
        _ url: String, body: [UInt8], headers: [String] = [], connectTimeoutSeconds: Double,
        idleTimeoutSeconds: Double, onData: (UnsafeRawBufferPointer) -> Bool
    ) -> HTTPStreamEnd {
        withoutActuallyEscaping(onData) { onData in
            let reader = Reader(onData)
            let context = Unmanaged.passUnretained(reader).toOpaque()
            var result = vaultd_http_stream_result()
            var cHeaders = headers.map { strdup($0) }
            defer { for header in cHeaders { free(header) } }
            // The context pointer does not retain the reader: it lives until the call returns.
            let status = withExtendedLifetime(reader) {
                cHeaders.withUnsafeMutableBufferPointer { lines in
                    lines.withMemoryRebound(to: UnsafePointer<CChar>?.self) { lines in
                        body.withUnsafeBytes { raw in
                            vaultd_http_stream_post_json(
                                handle, url, raw.baseAddress?.assumingMemoryBound(to: CChar.self), raw.count,
                                lines.baseAddress, lines.count, Int(max(0, connectTimeoutSeconds) * 1000),
                                Int(max(0, idleTimeoutSeconds) * 1000),
                                { context, data, length in
                                    let reader = Unmanaged<Reader>.fromOpaque(context!).takeUnretainedValue()
                                    return reader.onData(UnsafeRawBufferPointer(start: data, count: length)) ? 0 : 1
                                }, context, &result)
                        }
                    }
                }
            }
            var failure: HTTPFailure?
            if status != 0 {
                let detail = withUnsafeBytes(of: &result.error) { raw in
                    String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
                }
                failure =
                    result.curl_code != 0 && result.idle == 0 && result.cancelled == 0 && result.stopped == 0
                    ? HTTPFailure(
                        curlCode: result.curl_code, tooLarge: false, detail: detail, host: HTTPClient.host(of: url),
                        timeoutSeconds: connectTimeoutSeconds)
                    : HTTPFailure(
                        result.idle != 0 ? .timedOut : .other, reason: "\(HTTPClient.host(of: url)): \(detail)")
            }
            return HTTPStreamEnd(
                status: result.status, failure: failure, idle: result.idle != 0, cancelled: result.cancelled != 0,
                stopped: result.stopped != 0)
        }
    }

    /// Carries the reader's closure through libcurl's context pointer.
    private final class Reader {
        let onData: (UnsafeRawBufferPointer) -> Bool
        init(_ onData: @escaping (UnsafeRawBufferPointer) -> Bool) { self.onData = onData }
    }
}
