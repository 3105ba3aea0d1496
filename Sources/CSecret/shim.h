#ifndef VAULTD_CSECRET_SHIM_H
#define VAULTD_CSECRET_SHIM_H
#include <libsecret/secret.h>
#endif
