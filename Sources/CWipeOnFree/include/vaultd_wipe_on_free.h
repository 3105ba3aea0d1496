#ifndef VAULTD_WIPE_ON_FREE_H
#define VAULTD_WIPE_ON_FREE_H

/* vaultd's own free(): every heap block is zeroed when it is released, so
 * that no freed buffer keeps a token (Swift String storage, parse results,
 * library buffers). glibc's mallopt(M_PERTURB) is not enough: it skips the
 * blocks of up to 1032 bytes that go to the per-thread cache (tcache), which
 * is where a token's String lives. Linked into the vaultd executable only.
 * Returns 1: a call from main keeps the dependency visible. */
int vaultd_wipe_on_free_enabled(void);

#endif
