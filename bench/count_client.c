/* Fixed-count client for instruction counting (bench/callgrind.sh): CONNS
 * threads, each on its own connection sends COUNT requests one at a time
 * (request + NUL, then reads the reply up to its NUL). Prints the number of
 * replies and of error replies. A fixed amount of work, unlike load_client's
 * timed runs, so that two runs differing only in COUNT give the cost per call.
 * usage: count_client SOCKET CONNS COUNT REQUEST */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static const char *path, *request;
static size_t req_len;
static long count;
static atomic_long replies, errors;

static void *run(void *arg) {
    (void)arg;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, path, sizeof a.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a)) { perror("connect"); errors++; return NULL; }
    char buf[65536];
    for (long i = 0; i < count; i++) {
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
            if (buf[have - 1] == 0) break;
            if (have == sizeof buf) { errors++; goto out; }
        }
        if (memmem(buf, have, "\"error\"", 7)) errors++;
        replies++;
    }
out:
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: count_client SOCKET CONNS COUNT REQUEST\n"); return 2; }
    path = argv[1];
    int conns = atoi(argv[2]);
    count = atol(argv[3]);
    request = argv[4];
    req_len = strlen(request) + 1; /* the NUL terminator too */
    pthread_t *th = calloc(conns, sizeof *th);
    for (int i = 0; i < conns; i++) pthread_create(&th[i], NULL, run, NULL);
    for (int i = 0; i < conns; i++) pthread_join(th[i], NULL);
    printf("replies=%ld errors=%ld\n", (long)replies, (long)errors);
    return errors ? 1 : 0;
}
