#define _GNU_SOURCE
#include "vaultd_shim.h"

#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/vfs.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

const uint32_t VAULTD_EPOLLIN = EPOLLIN;
const uint32_t VAULTD_EPOLLOUT = EPOLLOUT;
const uint32_t VAULTD_EPOLLERR = EPOLLERR;
const uint32_t VAULTD_EPOLLHUP = EPOLLHUP;
const uint32_t VAULTD_EPOLLRDHUP = EPOLLRDHUP;

int vaultd_epoll_create(void) { return epoll_create1(EPOLL_CLOEXEC); }

static int epoll_control(int epfd, int op, int fd, uint32_t events, uint64_t data) {
    struct epoll_event ev;
    memset(&ev, 0, sizeof ev);
    ev.events = events;
    ev.data.u64 = data;
    return epoll_ctl(epfd, op, fd, &ev);
}

int vaultd_epoll_add(int epfd, int fd, uint32_t events, uint64_t data) {
    return epoll_control(epfd, EPOLL_CTL_ADD, fd, events, data);
}

int vaultd_epoll_mod(int epfd, int fd, uint32_t events, uint64_t data) {
    return epoll_control(epfd, EPOLL_CTL_MOD, fd, events, data);
}

int vaultd_epoll_del(int epfd, int fd) { return epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL); }

int vaultd_epoll_wait(int epfd, vaultd_event *out, int max, int timeout_ms) {
    struct epoll_event events[256];
    if (max > 256) max = 256;
    int n = epoll_wait(epfd, events, max, timeout_ms);
    for (int i = 0; i < n; i++) {
        out[i].events = events[i].events;
        out[i].data = events[i].data.u64;
    }
    return n;
}

int vaultd_accept_nonblocking(int fd) { return accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC); }

int vaultd_eventfd(void) { return eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC); }

int vaultd_timerfd(void) { return timerfd_create(CLOCK_REALTIME, TFD_NONBLOCK | TFD_CLOEXEC); }

int vaultd_timerfd_at(int fd, int64_t seconds, int64_t nanoseconds) {
    struct itimerspec spec = {0};
    if (seconds < 0) return timerfd_settime(fd, 0, &spec, NULL);
    /* it_value 0 would disarm: a deadline at the epoch is at once all the same. */
    spec.it_value.tv_sec = seconds;
    spec.it_value.tv_nsec = seconds == 0 && nanoseconds == 0 ? 1 : nanoseconds;
    return timerfd_settime(fd, TFD_TIMER_ABSTIME | TFD_TIMER_CANCEL_ON_SET, &spec, NULL);
}

int vaultd_signalfd_termination(void) {
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGTERM);
    sigaddset(&mask, SIGINT);
    sigaddset(&mask, SIGHUP);
    if (pthread_sigmask(SIG_BLOCK, &mask, NULL) != 0) return -1;
    return signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
}

int vaultd_signalfd_read(int fd) {
    struct signalfd_siginfo info;
    ssize_t n = read(fd, &info, sizeof info);
    if (n != (ssize_t)sizeof info) return -1;
    return (int)info.ssi_signo;
}

int vaultd_peer_credentials(int fd, pid_t *pid, uid_t *uid, gid_t *gid) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return -1;
    *pid = cred.pid;
    *uid = cred.uid;
    *gid = cred.gid;
    return 0;
}

int vaultd_peer_groups(int fd, gid_t *groups, int max) {
    socklen_t len = (socklen_t)(sizeof(gid_t) * (size_t)max);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) != 0) return -1;
    return (int)(len / sizeof(gid_t));
}

int vaultd_disable_core_dumps(void) {
    struct rlimit none = {0, 0};
    if (setrlimit(RLIMIT_CORE, &none) != 0) return -1;
    return prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}

void vaultd_set_thread_name(const char *name) { prctl(PR_SET_NAME, name, 0, 0, 0); }

void vaultd_explicit_bzero(void *p, size_t n) { explicit_bzero(p, n); }

int vaultd_pipe_cloexec(int fds[2]) { return pipe2(fds, O_CLOEXEC); }

int vaultd_spawn_close_from(posix_spawn_file_actions_t *actions, int lowest) {
    return posix_spawn_file_actions_addclosefrom_np(actions, lowest);
}

int vaultd_fstatfs_type(int fd, long *type) {
    struct statfs st;
    if (fstatfs(fd, &st) != 0) return -1;
    *type = (long)st.f_type;
    return 0;
}
