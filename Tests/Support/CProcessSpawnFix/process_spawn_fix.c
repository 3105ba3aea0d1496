/*
 * A workaround, for the test process only, of a crash in the toolchain's
 * Foundation (swift-corelibs-foundation, fixed upstream by pull request
 * #5472, not in Swift 6.3.1): Process.run() lists /proc/self/fd with
 * readdir() and copies each entry's whole 256-byte d_name array, reading past
 * the end of a short record. When the last record ends glibc's 32 KiB
 * directory buffer and the next page is unmapped, the test process dies of
 * SIGSEGV in memmove; the suites start hundreds of processes while holding
 * hundreds of descriptors, and a CI run was lost to it.
 *
 * Served from a mapping of its own, the directory buffer is followed by the
 * rest of its last page (about 4 KiB), so the over-read stays in mapped
 * memory. vaultd and vaultctl never use Foundation's Process.
 */
#include "process_spawn_fix.h"

#include <malloc.h>

static const size_t threshold = 16 * 1024;

__attribute__((constructor)) static void map_large_blocks_apart(void) {
    mallopt(M_MMAP_THRESHOLD, (int)threshold);
}

size_t vaultd_tests_mmap_threshold(void) { return threshold; }
