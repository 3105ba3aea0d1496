#ifndef VAULTD_CSODIUM_SHIM_H
#define VAULTD_CSODIUM_SHIM_H
#include <sodium.h>
#endif
