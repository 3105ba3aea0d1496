/* Load client for scripts/bench: one thread per connection, each in a
 * request/response loop over a Unix stream socket (request + NUL, reply up to
 * its NUL). Warm-up, then a timed run; prints one line of key=value:
 *   rps p50_us p99_us p999_us requests errors cpu_us_per_req
 * cpu_us_per_req is the server's utime+stime (/proc/PID/stat) over the timed
 * run divided by the requests served in it.
 * usage: load_client SOCKET CONNS WARMUP_S RUN_S REQUEST [SERVER_PID] [LAT_FILE] */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *path, *request;
static size_t req_len;
static atomic_int phase; /* 0 warm-up, 1 timed, 2 stop */
static atomic_long errors;
static atomic_int connected;

typedef struct { unsigned *lat; size_t n, cap; } thr_t;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *run(void *arg) {
    thr_t *me = arg;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { perror("connect"); errors++; return NULL; }
    connected++;
    char buf[65536];
    int checked = 0;
    while (atomic_load(&phase) < 2) {
        double t0 = now();
        size_t off = 0;
        while (off < req_len) {
            ssize_t w = write(fd, request + off, req_len - off);
            if (w <= 0) { errors++; goto out; }
            off += (size_t)w;
        }
        size_t have = 0;
        for (;;) {
            ssize_t n = read(fd, buf + have, sizeof buf - have);
            if (n <= 0) { errors++; goto out; }
            have += (size_t)n;
            if (buf[have - 1] == 0) break; /* one reply at a time: it ends the read */
            if (have == sizeof buf) { errors++; goto out; }
        }
        double t1 = now();
        if (!checked) {
            checked = 1;
            if (strstr(buf, "\"error\"")) { fprintf(stderr, "load_client: error reply: %.300s\n", buf); errors++; }
        }
        if (atomic_load(&phase) == 1) {
            if (me->n == me->cap) {
                me->cap = me->cap ? me->cap * 2 : 65536;
                me->lat = realloc(me->lat, me->cap * sizeof *me->lat);
            }
            me->lat[me->n++] = (unsigned)((t1 - t0) * 1e9); /* ns */
        }
    }
out:
    close(fd);
    return NULL;
}

static double cpu_ticks(int pid) {
    if (pid <= 0) return 0;
    char p[64], b[4096];
    snprintf(p, sizeof p, "/proc/%d/stat", pid);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    size_t n = fread(b, 1, sizeof b - 1, f);
    fclose(f);
    b[n] = 0;
    char *s = strrchr(b, ')');
    if (!s) return 0;
    unsigned long ut = 0, st = 0;
    /* after ")": state(3) ... utime is field 14, stime 15 */
    sscanf(s + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st);
    return (double)(ut + st);
}

static int cmp(const void *a, const void *b) {
    unsigned x = *(const unsigned *)a, y = *(const unsigned *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc < 6) { fprintf(stderr, "usage: load_client SOCKET CONNS WARMUP_S RUN_S REQUEST [SERVER_PID] [LAT_FILE]\n"); return 2; }
    path = argv[1];
    int conns = atoi(argv[2]);
    double warm = atof(argv[3]), dur = atof(argv[4]);
    size_t rl = strlen(argv[5]);
    char *r = malloc(rl + 1);
    memcpy(r, argv[5], rl + 1); /* includes the NUL terminator */
    request = r;
    req_len = rl + 1;
    int pid = argc > 6 ? atoi(argv[6]) : 0;
    const char *latfile = argc > 7 ? argv[7] : NULL;
    pthread_t *th = calloc(conns, sizeof *th);
    thr_t *ts = calloc(conns, sizeof *ts);
    for (int i = 0; i < conns; i++) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 256 * 1024);
        pthread_create(&th[i], &at, run, &ts[i]);
        pthread_attr_destroy(&at);
    }
    usleep((useconds_t)(warm * 1e6));
    long hz = sysconf(_SC_CLK_TCK);
    double c0 = cpu_ticks(pid), t0 = now();
    atomic_store(&phase, 1);
    usleep((useconds_t)(dur * 1e6));
    atomic_store(&phase, 2);
    double t1 = now(), c1 = cpu_ticks(pid);
    /* Give every thread a bounded time to finish its last request. */
    for (int i = 0; i < conns; i++) pthread_join(th[i], NULL);
    size_t total = 0;
    for (int i = 0; i < conns; i++) total += ts[i].n;
    unsigned *all = malloc((total ? total : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < conns; i++) { memcpy(all + k, ts[i].lat, ts[i].n * sizeof *all); k += ts[i].n; }
    qsort(all, total, sizeof *all, cmp);
#define PCT(p) (total ? all[(size_t)((p) * (total - 1))] / 1000.0 : 0)
    double cpu_us = pid > 0 && total ? (c1 - c0) / hz * 1e6 / total : 0;
    printf("rps=%.0f p50_us=%.1f p99_us=%.1f p999_us=%.1f requests=%zu errors=%ld conns=%d cpu_us_per_req=%.2f\n",
           total / (t1 - t0), PCT(0.50), PCT(0.99), PCT(0.999), total, (long)errors, conns, cpu_us);
    if (latfile) {
        FILE *f = fopen(latfile, "w");
        if (f) {
            /* At most 200k samples, evenly spaced over the sorted set: enough for a CDF. */
            size_t step = total > 200000 ? total / 200000 : 1;
            for (size_t i = 0; i < total; i += step) fprintf(f, "%.2f\n", all[i] / 1000.0);
            fclose(f);
        }
    }
    return 0;
}
