#ifndef VAULTD_TESTS_PROCESS_SPAWN_FIX_H
#define VAULTD_TESTS_PROCESS_SPAWN_FIX_H

#include <stddef.h>

/* The malloc mmap threshold this test process set before main, in bytes:
 * every block at least this large that needs new memory gets a mapping. */
size_t vaultd_tests_mmap_threshold(void);

/* 1 when readdir() resolves to this workaround's, not glibc's. */
int vaultd_tests_readdir_is_replaced(void);

/* How many directory entries this thread's readdir() returned as a copy. */
int vaultd_tests_whole_entry_copies(void);

/* Runs the workaround on `record` (a struct dirent64 whose d_reclen says its
 * length): sets `returned` to what readdir() would return, and says 1 when
 * that is a whole copy instead of the record. */
int vaultd_tests_whole_entry_for(const void *record, size_t record_length, const void **returned);

/* 1 when pipe() resolves to this test process's, which makes both
 * descriptors close-on-exec. */
int vaultd_tests_pipe_is_replaced(void);

#endif
