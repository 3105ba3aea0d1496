/*
 * A workaround, for the test process only, of a crash in the toolchain's
 * Foundation (swift-corelibs-foundation, fixed upstream by pull request
 * #5472, not in Swift 6.3.1): Process.run() lists /proc/self/fd with
 * readdir() and copies each entry's whole `struct dirent` (280 bytes, a
 * 256-byte d_name), reading past the end of a short record. When the test
 * process holds more than about 1,350 descriptors (the suites with 1,000
 * clients or subscribers), the records fill glibc's 32 KiB directory buffer
 * and the last one ends it; if the next page is unmapped, the process dies of
 * SIGSEGV in memmove while some other suite starts a process.
 *
 * Two layers:
 * - readdir() and readdir64() are defined here, so they take the place of
 *   glibc's for Foundation too (the executable's definition comes first).
 *   An entry whose full struct would cross into the next page is copied into
 *   a whole, zero-padded struct of this thread's before it is returned; any
 *   other entry is returned where glibc has it. The copy is overwritten by the
 *   thread's next such call, which readdir()'s contract allows for the stream.
 * - Blocks of 16 KiB and more get a mapping of their own when malloc has to
 *   grow (not when it can split its top chunk, which is why the first layer
 *   exists: a CI run crashed with this one alone).
 * vaultd and vaultctl never use Foundation's Process.
 *
 * And a third, for every child of the test process: pipe() makes its two
 * descriptors close-on-exec (pipe2 with O_CLOEXEC), Foundation's Pipe()
 * included. Process.run() lists /proc/self/fd to close what the child must
 * not keep, but a pipe made by another test between that listing and the
 * spawn was inherited, and a long-lived child (a vaultd, a token server, a
 * keyring; posix_spawn without a list inherits every descriptor) then held
 * the other test's pipe open: a `vaultctl login` reading its token from
 * stdin waited for an end of file that never came, and a child's output
 * never ended. The child's own stdin, stdout and stderr are dup2()'d into
 * place by the spawn, which clears the flag on the copies.
 */
#define _GNU_SOURCE
#include "process_spawn_fix.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static const size_t threshold = 16 * 1024;

__attribute__((constructor)) static void map_large_blocks_apart(void) {
    mallopt(M_MMAP_THRESHOLD, (int)threshold);
}

size_t vaultd_tests_mmap_threshold(void) { return threshold; }

static _Thread_local struct dirent64 whole_entry;
static _Thread_local int whole_entry_copies;

/* Whether the `size` bytes from `entry` reach into the page after the one
 * the record itself ends on. */
static int crosses_page(const void *entry, size_t record_length, size_t size) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)entry;
    uintptr_t record_end = start + record_length - 1;
    uintptr_t read_end = start + size - 1;
    return record_end / page != read_end / page;
}

static struct dirent64 *whole(struct dirent64 *entry) {
    if (entry == NULL || !crosses_page(entry, entry->d_reclen, sizeof(struct dirent64))) return entry;
    memset(&whole_entry, 0, sizeof whole_entry);
    memcpy(&whole_entry, entry, entry->d_reclen < sizeof whole_entry ? entry->d_reclen : sizeof whole_entry);
    whole_entry_copies += 1;
    return &whole_entry;
}

struct dirent64 *readdir64(DIR *directory) {
    static struct dirent64 *(*next)(DIR *);
    if (next == NULL) next = (struct dirent64 * (*)(DIR *)) dlsym(RTLD_NEXT, "readdir64");
    return whole(next(directory));
}

/* On 64-bit glibc, struct dirent and struct dirent64 are the same layout. */
struct dirent *readdir(DIR *directory) {
    static struct dirent *(*next)(DIR *);
    if (next == NULL) next = (struct dirent * (*)(DIR *)) dlsym(RTLD_NEXT, "readdir");
    return (struct dirent *)whole((struct dirent64 *)next(directory));
}

int vaultd_tests_readdir_is_replaced(void) { return dlsym(RTLD_DEFAULT, "readdir") == (void *)readdir; }

int vaultd_tests_whole_entry_copies(void) { return whole_entry_copies; }

int vaultd_tests_whole_entry_for(const void *record, size_t record_length, const void **returned) {
    struct dirent64 *entry = (struct dirent64 *)record;
    (void)record_length;
    *returned = whole(entry);
    return *returned != record;
}

int pipe(int descriptors[2]) { return pipe2(descriptors, O_CLOEXEC); }

int vaultd_tests_pipe_is_replaced(void) { return dlsym(RTLD_DEFAULT, "pipe") == (void *)pipe; }
