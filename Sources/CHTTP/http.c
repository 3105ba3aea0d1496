#define _GNU_SOURCE
#include "vaultd_http.h"

#include <curl/curl.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The libcurl functions vaultd uses, resolved once. */
static struct {
    CURLcode (*global_init)(long);
    CURL *(*easy_init)(void);
    CURLcode (*easy_setopt)(CURL *, CURLoption, ...);
    CURLcode (*easy_perform)(CURL *);
    CURLcode (*easy_getinfo)(CURL *, CURLINFO, ...);
    void (*easy_cleanup)(CURL *);
    struct curl_slist *(*slist_append)(struct curl_slist *, const char *);
    void (*slist_free_all)(struct curl_slist *);
} curl;

static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static char load_error[256];
static int loaded;

static void load(void) {
    void *library = dlopen("libcurl.so.4", RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        snprintf(load_error, sizeof load_error, "libcurl.so.4 could not be loaded (%s); install libcurl4",
                 dlerror());
        return;
    }
#define RESOLVE(field, name)                                                                              \
    do {                                                                                                  \
        *(void **)&curl.field = dlsym(library, name);                                                     \
        if (!curl.field) {                                                                                \
            snprintf(load_error, sizeof load_error, "libcurl.so.4 lacks %s; install a newer libcurl4", name); \
            return;                                                                                       \
        }                                                                                                 \
    } while (0)
    RESOLVE(global_init, "curl_global_init");
    RESOLVE(easy_init, "curl_easy_init");
    RESOLVE(easy_setopt, "curl_easy_setopt");
    RESOLVE(easy_perform, "curl_easy_perform");
    RESOLVE(easy_getinfo, "curl_easy_getinfo");
    RESOLVE(easy_cleanup, "curl_easy_cleanup");
    RESOLVE(slist_append, "curl_slist_append");
    RESOLVE(slist_free_all, "curl_slist_free_all");
#undef RESOLVE
    if (curl.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        snprintf(load_error, sizeof load_error, "libcurl could not initialise");
        return;
    }
    loaded = 1;
}

int vaultd_http_load(char *error, size_t error_size) {
    pthread_once(&load_once, load);
    if (loaded) return 0;
    if (error && error_size) snprintf(error, error_size, "%s", load_error);
    return -1;
}

/* Where the body goes while it arrives. */
typedef struct {
    vaultd_http_response *response;
    size_t capacity;
    size_t limit;
    int too_large;
} sink;

static size_t take_body(char *data, size_t size, size_t count, void *context) {
    sink *s = context;
    vaultd_http_response *r = s->response;
    size_t n = size * count;
    if (r->body_length + n > s->limit) {
        s->too_large = 1;
        return 0; /* aborts the transfer */
    }
    if (r->body_length + n > s->capacity) {
        size_t capacity = s->capacity ? s->capacity : 4096;
        while (capacity < r->body_length + n) capacity *= 2;
        if (capacity > s->limit) capacity = s->limit; /* never more room than is ever kept */
        unsigned char *grown = malloc(capacity);
        if (!grown) return 0;
        if (r->body) {
            memcpy(grown, r->body, r->body_length);
            explicit_bzero(r->body, s->capacity);
            free(r->body);
        }
        r->body = grown;
        s->capacity = capacity;
    }
    memcpy(r->body + r->body_length, data, n);
    r->body_length += n;
    return n;
}

static size_t take_header(char *data, size_t size, size_t count, void *context) {
    vaultd_http_response *r = context;
    size_t n = size * count;
    static const char name[] = "retry-after:";
    size_t name_length = sizeof name - 1;
    if (n > name_length && strncasecmp(data, name, name_length) == 0) {
        size_t start = name_length, end = n;
        while (start < end && (data[start] == ' ' || data[start] == '\t')) start++;
        while (end > start && (data[end - 1] == '\r' || data[end - 1] == '\n' || data[end - 1] == ' ')) end--;
        size_t length = end - start;
        if (length >= sizeof r->retry_after) length = sizeof r->retry_after - 1;
        memcpy(r->retry_after, data + start, length);
        r->retry_after[length] = 0;
    }
    return n;
}

static int post(const char *content_type, const char *url, const char *body, size_t body_length,
                long timeout_ms, size_t max_body, const vaultd_http_tls *tls, vaultd_http_response *out);

int vaultd_http_post_form(const char *url, const char *body, size_t body_length, long timeout_ms,
                          size_t max_body, vaultd_http_response *out) {
    return post("Content-Type: application/x-www-form-urlencoded", url, body, body_length, timeout_ms, max_body,
                NULL, out);
}

int vaultd_http_post_json(const char *url, const char *body, size_t body_length, long timeout_ms,
                          size_t max_body, vaultd_http_response *out) {
    return post("Content-Type: application/json", url, body, body_length, timeout_ms, max_body, NULL, out);
}

int vaultd_http_post_json_tls(const char *url, const char *body, size_t body_length, long timeout_ms,
                              size_t max_body, const vaultd_http_tls *tls, vaultd_http_response *out) {
    return post("Content-Type: application/json", url, body, body_length, timeout_ms, max_body, tls, out);
}

static int post(const char *content_type, const char *url, const char *body, size_t body_length,
                long timeout_ms, size_t max_body, const vaultd_http_tls *tls, vaultd_http_response *out) {
    memset(out, 0, sizeof *out);
    if (vaultd_http_load(out->error, sizeof out->error) != 0) return -1;
    CURL *handle = curl.easy_init();
    if (!handle) {
        snprintf(out->error, sizeof out->error, "libcurl could not make a request handle");
        return -1;
    }
    struct curl_slist *headers = curl.slist_append(NULL, content_type);
    headers = curl.slist_append(headers, "Accept: application/json");
    char curl_error[CURL_ERROR_SIZE] = "";
    sink s = {.response = out, .limit = max_body};
    curl.easy_setopt(handle, CURLOPT_URL, url);
    curl.easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
    curl.easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl.easy_setopt(handle, CURLOPT_TIMEOUT_MS, timeout_ms);
    /* A Content-Length above the cap ends the request before any of the body is read. */
    curl.easy_setopt(handle, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)max_body);
    curl.easy_setopt(handle, CURLOPT_POST, 1L);
    curl.easy_setopt(handle, CURLOPT_POSTFIELDS, body);
    curl.easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_length);
    curl.easy_setopt(handle, CURLOPT_HTTPHEADER, headers);
    curl.easy_setopt(handle, CURLOPT_USERAGENT, "vaultd");
    curl.easy_setopt(handle, CURLOPT_WRITEFUNCTION, take_body);
    curl.easy_setopt(handle, CURLOPT_WRITEDATA, &s);
    curl.easy_setopt(handle, CURLOPT_HEADERFUNCTION, take_header);
    curl.easy_setopt(handle, CURLOPT_HEADERDATA, out);
    curl.easy_setopt(handle, CURLOPT_ERRORBUFFER, curl_error);
    if (tls && tls->ca_file) curl.easy_setopt(handle, CURLOPT_CAINFO, tls->ca_file);
    if (tls && tls->cert_file) curl.easy_setopt(handle, CURLOPT_SSLCERT, tls->cert_file);
    if (tls && tls->key_file) curl.easy_setopt(handle, CURLOPT_SSLKEY, tls->key_file);
    CURLcode result = curl.easy_perform(handle);
    if (result == CURLE_OK) {
        curl.easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &out->status);
    } else if (s.too_large || result == CURLE_FILESIZE_EXCEEDED) {
        out->too_large = 1;
        snprintf(out->error, sizeof out->error, "the response was larger than %zu bytes", max_body);
    } else {
        snprintf(out->error, sizeof out->error, "%s (curl error %d)",
                 curl_error[0] ? curl_error : "the request failed", (int)result);
    }
    if (result != CURLE_OK) out->curl_code = (int)result;
    curl.easy_cleanup(handle);
    curl.slist_free_all(headers);
    return result == CURLE_OK ? 0 : -1;
}

void vaultd_http_response_free(vaultd_http_response *response) {
    if (response->body) {
        explicit_bzero(response->body, response->body_length);
        free(response->body);
    }
    response->body = NULL;
    response->body_length = 0;
}
