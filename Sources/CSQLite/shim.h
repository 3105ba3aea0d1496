#ifndef VAULTD_CSQLITE_SHIM_H
#define VAULTD_CSQLITE_SHIM_H
#include <sqlite3.h>
/* SQLITE_TRANSIENT is a cast of -1 to a function pointer, which Swift does
 * not import: bound values are copied by SQLite before the call returns. */
static inline void (*vaultd_sqlite_transient(void))(void *) { return SQLITE_TRANSIENT; }
#endif
