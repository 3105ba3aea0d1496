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

#endif
