#ifndef VAULTD_TESTS_PROCESS_SPAWN_FIX_H
#define VAULTD_TESTS_PROCESS_SPAWN_FIX_H

#include <stddef.h>

/* The malloc mmap threshold this test process set before main, in bytes:
 * every block at least this large gets a mapping of its own. */
size_t vaultd_tests_mmap_threshold(void);

#endif
