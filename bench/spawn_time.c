// Times whole commands, interleaved, with no shell in the loop: each run
// starts every command once with posix_spawn (in an order that rotates from
// run to run, so no command always goes first after another), its stdin from
// a file, stdout and stderr to /dev/null, and waits for it with wait4. Wall
// time is CLOCK_MONOTONIC from just before posix_spawn to wait4's return;
// CPU time is the child's utime + stime from wait4's rusage.
//
//   spawn_time RUNS WARMUP OUT.json -- LABEL STDIN PROGRAM [ARGS...] [-- LABEL STDIN PROGRAM ...]
//
// STDIN is a file or - for /dev/null; PROGRAM is a path (no PATH search).
// WARMUP rounds run first and are not recorded. A command that exits non-zero
// or dies is counted in "failures" (its time is still recorded). Writes
// {"runs": N, "commands": [{"label", "program", "failures", "wall_us": [...],
// "cpu_us": [...]}]} to OUT.json.
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct command {
    const char *label, *input;
    char **argv;
    long *wall_us, *cpu_us;
    int failures;
};

static long now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

// Runs `c` once; stores its wall and CPU microseconds; returns 0 when it exited 0.
static int run(struct command *c, long *wall, long *cpu) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, strcmp(c->input, "-") ? c->input : "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    long t0 = now_us();
    int err = posix_spawn(&pid, c->argv[0], &fa, NULL, c->argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err) {
        fprintf(stderr, "spawn_time: cannot start %s: %s\n", c->argv[0], strerror(err));
        exit(1);
    }
    int status;
    struct rusage ru;
    while (wait4(pid, &status, 0, &ru) < 0) {
        if (errno == EINTR) continue;
        perror("spawn_time: wait4");
        exit(1);
    }
    *wall = now_us() - t0;
    *cpu = ru.ru_utime.tv_sec * 1000000L + ru.ru_utime.tv_usec + ru.ru_stime.tv_sec * 1000000L + ru.ru_stime.tv_usec;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20)
            fprintf(f, "\\u%04x", *s);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

static void json_list(FILE *f, const long *v, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%ld", i ? "," : "", v[i]);
    fputc(']', f);
}

int main(int argc, char **argv) {
    if (argc < 8 || strcmp(argv[4], "--")) {
        fprintf(stderr, "usage: spawn_time RUNS WARMUP OUT.json -- LABEL STDIN PROGRAM [ARGS...] [-- ...]\n");
        return 2;
    }
    int runs = atoi(argv[1]), warmup = atoi(argv[2]);
    if (runs < 1 || runs > 100000 || warmup < 0 || warmup > 10000) {
        fprintf(stderr, "spawn_time: RUNS must be 1-100000 and WARMUP 0-10000\n");
        return 2;
    }
    struct command cmds[16];
    int n = 0;
    for (int i = 4; i < argc;) {
        // argv[i] is "--": LABEL STDIN PROGRAM follow, then arguments up to the next "--".
        if (n == 16 || i + 3 >= argc) {
            fprintf(stderr, "spawn_time: each command needs LABEL STDIN PROGRAM; at most 16 commands\n");
            return 2;
        }
        argv[i] = NULL;  // ends the previous command's argv
        struct command *c = &cmds[n++];
        c->label = argv[i + 1];
        c->input = argv[i + 2];
        c->argv = &argv[i + 3];
        c->failures = 0;
        c->wall_us = calloc(runs, sizeof(long));
        c->cpu_us = calloc(runs, sizeof(long));
        int j = i + 3;
        while (j < argc && strcmp(argv[j], "--")) j++;
        i = j;
    }
    long wall, cpu;
    for (int r = 0; r < warmup; r++)
        for (int k = 0; k < n; k++) run(&cmds[(r + k) % n], &wall, &cpu);
    for (int r = 0; r < runs; r++) {
        for (int k = 0; k < n; k++) {
            struct command *c = &cmds[(r + k) % n];
            c->failures += run(c, &c->wall_us[r], &c->cpu_us[r]);
        }
    }
    FILE *f = fopen(argv[3], "w");
    if (!f) {
        perror(argv[3]);
        return 1;
    }
    fprintf(f, "{\"runs\": %d, \"warmup\": %d, \"commands\": [", runs, warmup);
    for (int k = 0; k < n; k++) {
        struct command *c = &cmds[k];
        fprintf(f, "%s\n {\"label\": ", k ? "," : "");
        json_string(f, c->label);
        fprintf(f, ", \"program\": ");
        json_string(f, c->argv[0]);
        fprintf(f, ", \"failures\": %d, \"wall_us\": ", c->failures);
        json_list(f, c->wall_us, runs);
        fprintf(f, ", \"cpu_us\": ");
        json_list(f, c->cpu_us, runs);
        fputc('}', f);
    }
    fprintf(f, "\n]}\n");
    fclose(f);
    for (int k = 0; k < n; k++)
        if (cmds[k].failures) fprintf(stderr, "spawn_time: %s failed %d of %d runs\n", cmds[k].label, cmds[k].failures, runs);
    return 0;
}
