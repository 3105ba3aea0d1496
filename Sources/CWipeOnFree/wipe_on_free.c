#define _GNU_SOURCE
#include <malloc.h>
#include <string.h>

#include "vaultd_wipe_on_free.h"

/* glibc's own free, which this one calls once the block is zeroed. */
extern void __libc_free(void *p);

/* Defined in the executable, this free() takes the place of libc's for the
 * Swift runtime and every shared library (the dynamic linker binds to the
 * executable's definition first). glibc's internal frees (realloc's move,
 * stdio) do not come here. malloc_usable_size covers the whole block, slack
 * included, for blocks from malloc, calloc, realloc and the aligned
 * allocators alike. */
void free(void *p) {
    if (p != NULL) explicit_bzero(p, malloc_usable_size(p));
    __libc_free(p);
}

int vaultd_wipe_on_free_enabled(void) { return 1; }
