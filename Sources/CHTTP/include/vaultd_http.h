#ifndef VAULTD_HTTP_H
#define VAULTD_HTTP_H

#include <stddef.h>

/* An HTTP client for vaultd's OAuth 2.0 requests, on libcurl. libcurl is
 * loaded with dlopen on first use, so a vaultd whose providers never speak
 * HTTP does not map the TLS stack at all. Every call blocks: run it on a
 * thread of its own, never on Swift's cooperative pool. */

typedef struct {
    /* The HTTP status; 0 when no answer came (see error). */
    long status;
    /* The response body (malloc'd; wiped and freed by vaultd_http_response_free). */
    unsigned char *body;
    size_t body_length;
    /* The Retry-After header, "" when absent. */
    char retry_after[64];
    /* Why the request failed, "" when an answer came. */
    char error[256];
    /* The libcurl error code (CURLE_*) when no answer came, else 0. */
    int curl_code;
    /* 1 when the body passed max_body bytes and the transfer was cut there. */
    int too_large;
} vaultd_http_response;

/* 0 when libcurl could be loaded; else -1 with the reason in error. */
int vaultd_http_load(char *error, size_t error_size);

/* POSTs body (application/x-www-form-urlencoded, Accept: application/json) to
 * url without following redirects. Gives up after timeout_ms in all, and when
 * the response body passes max_body bytes: at once when its Content-Length
 * says so, else as soon as that many bytes arrived, so no more than max_body
 * bytes of a body are ever held. Returns 0 when an answer came (whatever its
 * status), -1 otherwise; out is filled either way. */
int vaultd_http_post_form(const char *url, const char *body, size_t body_length, long timeout_ms,
                          size_t max_body, vaultd_http_response *out);

/* As vaultd_http_post_form, with one more header line (NUL-terminated,
 * "Name: value"; NULL for none), e.g. "Authorization: Basic ..." for RFC 6749
 * section 2.3.1. libcurl's copy of the line is wiped before it is freed. */
int vaultd_http_post_form_header(const char *url, const char *body, size_t body_length, const char *header,
                                 long timeout_ms, size_t max_body, vaultd_http_response *out);

/* As vaultd_http_post_form, with a JSON body (Content-Type: application/json). */
int vaultd_http_post_json(const char *url, const char *body, size_t body_length, long timeout_ms,
                          size_t max_body, vaultd_http_response *out);

/* TLS settings of a request: PEM files, NULL where not set (the system's CA
 * bundle; no client certificate). */
typedef struct {
    const char *ca_file;
    const char *cert_file;
    const char *key_file;
} vaultd_http_tls;

/* As vaultd_http_post_json, with TLS settings (CURLOPT_CAINFO, CURLOPT_SSLCERT,
 * CURLOPT_SSLKEY); tls may be NULL. */
int vaultd_http_post_json_tls(const char *url, const char *body, size_t body_length, long timeout_ms,
                              size_t max_body, const vaultd_http_tls *tls, vaultd_http_response *out);

/* Wipes and frees the body of a response. */
void vaultd_http_response_free(vaultd_http_response *response);

/* How a streaming POST ended. */
typedef struct {
    /* The HTTP status; 0 when no answer came. */
    long status;
    /* Why the transfer ended, "" when the server ended the answer. */
    char error[256];
    /* The libcurl error code (CURLE_*) when the transfer failed, else 0. */
    int curl_code;
    /* 1 when no byte arrived within the idle timeout. */
    int idle;
    /* 1 when vaultd_http_stream_cancel ended it (or came before it). */
    int cancelled;
    /* 1 when on_data asked to stop. */
    int stopped;
} vaultd_http_stream_result;

/* A streaming POST whose answer is read as it arrives (etcd's /v3/watch):
 * one per transfer at a time, cancellable from any thread. */
typedef struct vaultd_http_stream vaultd_http_stream;

/* Called with each piece of the body as it arrives, on the transfer's
 * thread; returning nonzero ends the transfer. */
typedef int (*vaultd_http_chunk_fn)(void *context, const unsigned char *data, size_t length);

/* A new stream handle (not cancelled); NULL when out of memory. */
vaultd_http_stream *vaultd_http_stream_new(void);

/* Cancels the transfer in progress on stream, if any, at once (its socket is
 * shut down), and every later one before it starts. Safe from any thread
 * while vaultd_http_stream_post_json runs on another. */
void vaultd_http_stream_cancel(vaultd_http_stream *stream);

/* Frees stream; no transfer may be running on it. */
void vaultd_http_stream_free(vaultd_http_stream *stream);

/* POSTs body (application/json) to url with the extra header lines headers
 * (header_count of them, "Name: value") and hands the answer's body to
 * on_data as it arrives. Blocks until the server ends the answer, the
 * connection fails or is not made within connect_timeout_ms, no byte of the
 * body arrived for idle_timeout_ms (0: no limit), on_data returned nonzero,
 * or the stream was cancelled. Returns 0 when the server ended the answer,
 * -1 otherwise; out gets the status (0 when none came), the reason and the
 * libcurl code, out->idle = 1 after an idle timeout, out->cancelled = 1 after
 * a cancel; the body went to on_data only. */
int vaultd_http_stream_post_json(vaultd_http_stream *stream, const char *url, const char *body, size_t body_length,
                                 const char *const *headers, size_t header_count, long connect_timeout_ms,
                                 long idle_timeout_ms, vaultd_http_chunk_fn on_data, void *context,
                                 vaultd_http_stream_result *out);

/* Names the calling thread (at most 15 bytes are kept) for a thread that runs
 * streaming transfers, and returns its kernel thread id (/proc/self/task/ID). */
int vaultd_http_stream_thread_begin(const char *name);

#endif
