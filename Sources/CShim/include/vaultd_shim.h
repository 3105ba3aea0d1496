#ifndef VAULTD_SHIM_H
#define VAULTD_SHIM_H

/* System calls that Swift's Glibc module does not export, as tiny wrappers.
 * No logic lives here. */

#include <spawn.h>
#include <stdint.h>
#include <sys/types.h>

/* epoll */
int vaultd_epoll_create(void);
int vaultd_epoll_add(int epfd, int fd, uint32_t events, uint64_t data);
int vaultd_epoll_mod(int epfd, int fd, uint32_t events, uint64_t data);
int vaultd_epoll_del(int epfd, int fd);

/* One ready event, as returned by vaultd_epoll_wait. */
typedef struct {
    uint32_t events;
    uint64_t data;
} vaultd_event;

/* Waits for up to `max` events; returns their count or -1 with errno. */
int vaultd_epoll_wait(int epfd, vaultd_event *out, int max, int timeout_ms);

extern const uint32_t VAULTD_EPOLLIN;
extern const uint32_t VAULTD_EPOLLOUT;
extern const uint32_t VAULTD_EPOLLERR;
extern const uint32_t VAULTD_EPOLLHUP;
extern const uint32_t VAULTD_EPOLLRDHUP;

/* accept4 with SOCK_NONBLOCK | SOCK_CLOEXEC. */
int vaultd_accept_nonblocking(int fd);

/* eventfd (non-blocking, close-on-exec) to wake the loop from other threads. */
int vaultd_eventfd(void);

/* timerfd on CLOCK_REALTIME (non-blocking, close-on-exec): the engine's alarm. */
int vaultd_timerfd(void);
/* Arms it to expire at `seconds` + `nanoseconds` since the epoch (already
 * past: at once), or disarms it when `seconds` is negative; cancelled when
 * the clock is set. */
int vaultd_timerfd_at(int fd, int64_t seconds, int64_t nanoseconds);

/* signalfd for SIGTERM, SIGINT and SIGHUP, which are blocked in every thread. */
int vaultd_signalfd_termination(void);
/* Reads one signal from a signalfd; returns the signal number or -1. */
int vaultd_signalfd_read(int fd);

/* SO_PEERCRED of a connected Unix socket. */
int vaultd_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid);

/* SO_PEERGROUPS: the peer's supplementary groups at connect time. Returns
 * their count (at most max) or -1. */
int vaultd_peer_groups(int fd, gid_t *groups, int max);

/* PR_SET_DUMPABLE 0 and RLIMIT_CORE 0: secrets never reach a core dump. */
int vaultd_disable_core_dumps(void);

/* Names the calling thread (cut to 15 bytes), as comm and gdb show it. */
void vaultd_set_thread_name(const char *name);

/* Zeroes memory in a way the compiler may not remove. */
void vaultd_explicit_bzero(void *p, size_t n);

/* pipe2(fds, O_CLOEXEC): a pipe no other child started meanwhile inherits. */
int vaultd_pipe_cloexec(int fds[2]);

/* posix_spawn_file_actions_addclosefrom_np: the child starts with no
 * descriptor from `lowest` up (glibc 2.34+); 0 on success. */
int vaultd_spawn_close_from(posix_spawn_file_actions_t *actions, int lowest);

/* fstatfs(fd)'s f_type (TMPFS_MAGIC, ...) into *type; 0 or -1 with errno. */
int vaultd_fstatfs_type(int fd, long *type);


#endif
