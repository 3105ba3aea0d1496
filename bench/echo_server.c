/* Floor for scripts/bench: a minimal thread-per-connection server on a Unix
 * stream socket. Every NUL-terminated message is answered with a fixed reply
 * of REPLY_SIZE bytes (default 100, about a GetToken reply) plus a NUL.
 * usage: echo_server SOCKET [REPLY_SIZE] */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char reply[4096];
static size_t reply_len;

static void *serve(void *arg) {
    int fd = (int)(long)arg;
    char buf[65536];
    size_t have = 0;
    for (;;) {
        ssize_t n = read(fd, buf + have, sizeof buf - have);
        if (n <= 0) break;
        have += (size_t)n;
        size_t start = 0;
        for (size_t i = 0; i < have; i++) {
            if (buf[i] == 0) {
                size_t off = 0;
                while (off < reply_len) {
                    ssize_t w = write(fd, reply + off, reply_len - off);
                    if (w <= 0) goto done;
                    off += (size_t)w;
                }
                start = i + 1;
            }
        }
        memmove(buf, buf + start, have - start);
        have -= start;
        if (have == sizeof buf) break;
    }
done:
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: echo_server SOCKET [REPLY_SIZE]\n"); return 2; }
    size_t size = argc > 2 ? (size_t)atoi(argv[2]) : 100;
    if (size < 2 || size >= sizeof reply) size = 100;
    /* A JSON-looking reply of exactly `size` bytes, then the NUL. */
    const char *head = "{\"parameters\":{\"token\":\"";
    const char *tail = "\"}}";
    size_t fill = size - strlen(head) - strlen(tail);
    strcpy(reply, head);
    memset(reply + strlen(head), 'x', fill);
    strcpy(reply + strlen(head) + fill, tail);
    reply_len = size + 1; /* includes the NUL */
    signal(SIGPIPE, SIG_IGN);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    unlink(argv[1]);
    if (bind(s, (struct sockaddr *)&a, sizeof a) || listen(s, 1024)) { perror("bind/listen"); return 1; }
    fprintf(stderr, "echo_server: ready\n");
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 * 1024);
        if (pthread_create(&t, &at, serve, (void *)(long)c)) close(c);
        pthread_attr_destroy(&at);
    }
}
