#ifndef VAULTD_CSECRET_SHIM_H
#define VAULTD_CSECRET_SHIM_H
/* The D-Bus path calls (secret-paths.h) read items without a proxy object
 * per item; libsecret files them under its "unstable" API, unchanged since 0.7. */
#define SECRET_API_SUBJECT_TO_CHANGE 1
#define SECRET_WITH_UNSTABLE 1
#include <libsecret/secret.h>
#endif
