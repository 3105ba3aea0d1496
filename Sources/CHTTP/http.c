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
                const char *header, long timeout_ms, size_t max_body, const vaultd_http_tls *tls,
                vaultd_http_response *out);

int vaultd_http_post_form(const char *url, const char *body, size_t body_length, long timeout_ms,
                          size_t max_body, vaultd_http_response *out) {
    return post("Content-Type: application/x-www-form-urlencoded", url, body, body_length, NULL, timeout_ms,
                max_body, NULL, out);
}

int vaultd_http_post_form_header(const char *url, const char *body, size_t body_length, const char *header,
                                 long timeout_ms, size_t max_body, vaultd_http_response *out) {
    return post("Content-Type: application/x-www-form-urlencoded", url, body, body_length, header, timeout_ms,
                max_body, NULL, out);
}

int vaultd_http_post_json(const char *url, const char *body, size_t body_length, long timeout_ms,
                          size_t max_body, vaultd_http_response *out) {
    return post("Content-Type: application/json", url, body, body_length, NULL, timeout_ms, max_body, NULL, out);
}

int vaultd_http_post_json_tls(const char *url, const char *body, size_t body_length, long timeout_ms,
                              size_t max_body, const vaultd_http_tls *tls, vaultd_http_response *out) {
    return post("Content-Type: application/json", url, body, body_length, NULL, timeout_ms, max_body, tls, out);
}

/* Frees a header list, wiping each line first: a line may carry the client secret. */
static void free_headers(struct curl_slist *headers) {
    for (struct curl_slist *item = headers; item; item = item->next) {
        if (item->data) explicit_bzero(item->data, strlen(item->data));
    }
    curl.slist_free_all(headers);
}

static int post(const char *content_type, const char *url, const char *body, size_t body_length,
                const char *header, long timeout_ms, size_t max_body, const vaultd_http_tls *tls,
                vaultd_http_response *out) {
    memset(out, 0, sizeof *out);
    if (vaultd_http_load(out->error, sizeof out->error) != 0) return -1;
    CURL *handle = curl.easy_init();
    if (!handle) {
        snprintf(out->error, sizeof out->error, "libcurl could not make a request handle");
        return -1;
    }
    struct curl_slist *headers = curl.slist_append(NULL, content_type);
    headers = curl.slist_append(headers, "Accept: application/json");
    if (header) headers = curl.slist_append(headers, header);
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
    free_headers(headers);
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

/* ---- Streaming POST (etcd's /v3/watch) ---- */

#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* At most this many sockets of one transfer at once (libcurl may try an IPv4
 * and an IPv6 address side by side). */
#define STREAM_SOCKETS 4

struct vaultd_http_stream {
    pthread_mutex_t mutex;
    int cancelled;
    /* The transfer's open sockets, -1 for a free slot; guarded by mutex. */
    int sockets[STREAM_SOCKETS];
};

vaultd_http_stream *vaultd_http_stream_new(void) {
    vaultd_http_stream *stream = calloc(1, sizeof *stream);
    if (!stream) return NULL;
    pthread_mutex_init(&stream->mutex, NULL);
    for (int i = 0; i < STREAM_SOCKETS; i++) stream->sockets[i] = -1;
    return stream;
}

void vaultd_http_stream_cancel(vaultd_http_stream *stream) {
    pthread_mutex_lock(&stream->mutex);
    stream->cancelled = 1;
    /* Shut down, never closed here: libcurl closes its sockets itself (through
     * close_socket below), so a descriptor number is never reused under it.
     * A blocked poll or recv on the socket returns at once. */
    for (int i = 0; i < STREAM_SOCKETS; i++)
        if (stream->sockets[i] >= 0) shutdown(stream->sockets[i], SHUT_RDWR);
    pthread_mutex_unlock(&stream->mutex);
}

void vaultd_http_stream_free(vaultd_http_stream *stream) {
    if (!stream) return;
    pthread_mutex_destroy(&stream->mutex);
    free(stream);
}

static int stream_cancelled(vaultd_http_stream *stream) {
    pthread_mutex_lock(&stream->mutex);
    int cancelled = stream->cancelled;
    pthread_mutex_unlock(&stream->mutex);
    return cancelled;
}

static curl_socket_t open_socket(void *context, curlsocktype purpose, struct curl_sockaddr *address) {
    (void)purpose;
    vaultd_http_stream *stream = context;
    pthread_mutex_lock(&stream->mutex);
    int slot = -1;
    for (int i = 0; i < STREAM_SOCKETS && slot < 0; i++)
        if (stream->sockets[i] < 0) slot = i;
    int fd = -1;
    if (!stream->cancelled && slot >= 0) {
        fd = socket(address->family, address->socktype | SOCK_CLOEXEC, address->protocol);
        if (fd >= 0) stream->sockets[slot] = fd;
    }
    pthread_mutex_unlock(&stream->mutex);
    return fd >= 0 ? fd : CURL_SOCKET_BAD;
}

static int close_socket(void *context, curl_socket_t fd) {
    vaultd_http_stream *stream = context;
    pthread_mutex_lock(&stream->mutex);
    for (int i = 0; i < STREAM_SOCKETS; i++)
        if (stream->sockets[i] == fd) stream->sockets[i] = -1;
    int result = close(fd);
    pthread_mutex_unlock(&stream->mutex);
    return result;
}

/* One transfer's state for its callbacks. */
typedef struct {
    vaultd_http_stream *stream;
    vaultd_http_chunk_fn on_data;
    void *context;
    vaultd_http_stream_result *out;
    long idle_timeout_ms;
    curl_off_t last_received;
    long long last_change_ms;
} stream_transfer;

static long long monotonic_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

static size_t stream_body(char *data, size_t size, size_t count, void *context) {
    stream_transfer *t = context;
    size_t n = size * count;
    t->last_change_ms = monotonic_ms();
    if (stream_cancelled(t->stream)) {
        t->out->cancelled = 1;
        return 0;
    }
    if (t->on_data(t->context, (const unsigned char *)data, n) != 0) {
        t->out->stopped = 1;
        return 0; /* aborts the transfer */
    }
    return n;
}

/* libcurl calls this often while bytes flow and about once a second while
 * none do: it ends a cancelled or idle transfer. */
static int stream_progress(void *context, curl_off_t download_total, curl_off_t downloaded, curl_off_t upload_total,
                           curl_off_t uploaded) {
    (void)download_total, (void)upload_total, (void)uploaded;
    stream_transfer *t = context;
    long long now = monotonic_ms();
    if (stream_cancelled(t->stream)) {
        t->out->cancelled = 1;
        return 1;
    }
    if (downloaded != t->last_received) {
        t->last_received = downloaded;
        t->last_change_ms = now;
    } else if (t->idle_timeout_ms > 0 && now - t->last_change_ms > t->idle_timeout_ms) {
        t->out->idle = 1;
        return 1;
    }
    return 0;
}

int vaultd_http_stream_post_json(vaultd_http_stream *stream, const char *url, const char *body, size_t body_length,
                                 const char *const *headers, size_t header_count, long connect_timeout_ms,
                                 long idle_timeout_ms, vaultd_http_chunk_fn on_data, void *context,
                                 vaultd_http_stream_result *out) {
    memset(out, 0, sizeof *out);
    if (vaultd_http_load(out->error, sizeof out->error) != 0) return -1;
    if (stream_cancelled(stream)) {
        out->cancelled = 1;
        snprintf(out->error, sizeof out->error, "cancelled");
        return -1;
    }
    CURL *handle = curl.easy_init();
    if (!handle) {
        snprintf(out->error, sizeof out->error, "libcurl could not make a request handle");
        return -1;
    }
    struct curl_slist *list = curl.slist_append(NULL, "Content-Type: application/json");
    list = curl.slist_append(list, "Accept: application/json");
    for (size_t i = 0; i < header_count; i++) list = curl.slist_append(list, headers[i]);
    char curl_error[CURL_ERROR_SIZE] = "";
    stream_transfer t = {.stream = stream, .on_data = on_data, .context = context, .out = out,
                         .idle_timeout_ms = idle_timeout_ms, .last_change_ms = monotonic_ms()};
    curl.easy_setopt(handle, CURLOPT_URL, url);
    curl.easy_setopt(handle, CURLOPT_PROTOCOLS_STR, "http,https");
    curl.easy_setopt(handle, CURLOPT_NOSIGNAL, 1L);
    curl.easy_setopt(handle, CURLOPT_CONNECTTIMEOUT_MS, connect_timeout_ms);
    /* A peer host that vanished without closing (power loss, a partition) is
     * found by TCP keep-alive probes; the idle timeout covers the rest. */
    curl.easy_setopt(handle, CURLOPT_TCP_KEEPALIVE, 1L);
    curl.easy_setopt(handle, CURLOPT_TCP_KEEPIDLE, 5L);
    curl.easy_setopt(handle, CURLOPT_TCP_KEEPINTVL, 2L);
    curl.easy_setopt(handle, CURLOPT_POST, 1L);
    curl.easy_setopt(handle, CURLOPT_POSTFIELDS, body);
    curl.easy_setopt(handle, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_length);
    curl.easy_setopt(handle, CURLOPT_HTTPHEADER, list);
    curl.easy_setopt(handle, CURLOPT_USERAGENT, "vaultd");
    curl.easy_setopt(handle, CURLOPT_OPENSOCKETFUNCTION, open_socket);
    curl.easy_setopt(handle, CURLOPT_OPENSOCKETDATA, stream);
    curl.easy_setopt(handle, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
    curl.easy_setopt(handle, CURLOPT_CLOSESOCKETDATA, stream);
    curl.easy_setopt(handle, CURLOPT_WRITEFUNCTION, stream_body);
    curl.easy_setopt(handle, CURLOPT_WRITEDATA, &t);
    curl.easy_setopt(handle, CURLOPT_NOPROGRESS, 0L);
    curl.easy_setopt(handle, CURLOPT_XFERINFOFUNCTION, stream_progress);
    curl.easy_setopt(handle, CURLOPT_XFERINFODATA, &t);
    curl.easy_setopt(handle, CURLOPT_ERRORBUFFER, curl_error);
    CURLcode result = curl.easy_perform(handle);
    curl.easy_getinfo(handle, CURLINFO_RESPONSE_CODE, &out->status);
    if (result != CURLE_OK && stream_cancelled(stream)) out->cancelled = 1;
    if (result != CURLE_OK) {
        out->curl_code = (int)result;
        if (out->cancelled)
            snprintf(out->error, sizeof out->error, "cancelled");
        else if (out->idle)
            snprintf(out->error, sizeof out->error, "no byte arrived for %ld ms", idle_timeout_ms);
        else if (out->stopped)
            snprintf(out->error, sizeof out->error, "stopped by its reader");
        else
            snprintf(out->error, sizeof out->error, "%s (curl error %d)",
                     curl_error[0] ? curl_error : "the request failed", (int)result);
    }
    curl.easy_cleanup(handle);
    curl.slist_free_all(list);
    return result == CURLE_OK ? 0 : -1;
}

int vaultd_http_stream_thread_begin(const char *name) {
    char kept[16];
    snprintf(kept, sizeof kept, "%s", name);
    pthread_setname_np(pthread_self(), kept);
    return (int)gettid();
}
