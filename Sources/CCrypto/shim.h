#ifndef VAULTD_CCRYPTO_SHIM_H
#define VAULTD_CCRYPTO_SHIM_H
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <string.h>

/* The kinds of private key a JWT is signed with (RFC 7518 section 3.1). */
enum vaultd_jwt_key_kind {
    VAULTD_JWT_KEY_UNSUPPORTED = 0,
    VAULTD_JWT_KEY_RSA = 1,      /* RS256 */
    VAULTD_JWT_KEY_EC_P256 = 2,  /* ES256 */
};

/* What `key` can sign as, and its size in bits: macros Swift does not import
   (EVP_PKEY_RSA, EVP_PKEY_EC) stay on this side. */
static inline int vaultd_jwt_key_kind(const EVP_PKEY *key, int *bits) {
    *bits = EVP_PKEY_get_bits(key);
    if (EVP_PKEY_get_base_id(key) == EVP_PKEY_RSA) return VAULTD_JWT_KEY_RSA;
    if (EVP_PKEY_get_base_id(key) == EVP_PKEY_EC) {
        char group[64];
        size_t length = 0;
        if (EVP_PKEY_get_group_name(key, group, sizeof group, &length) == 1 &&
            (strcmp(group, "prime256v1") == 0 || strcmp(group, "P-256") == 0))
            return VAULTD_JWT_KEY_EC_P256;
    }
    return VAULTD_JWT_KEY_UNSUPPORTED;
}

/* A passphrase callback that gives none: an encrypted key fails to load
   instead of OpenSSL's default prompting on a terminal. */
static inline int vaultd_no_passphrase(char *buffer, int size, int rwflag, void *data) {
    (void)buffer; (void)size; (void)rwflag; (void)data;
    return -1;
}

/* The private key in the PEM text of `length` bytes at `pem`; NULL when
   there is none (or it is encrypted). The error queue is left empty. */
static inline EVP_PKEY *vaultd_read_private_key(const void *pem, int length) {
    BIO *bio = BIO_new_mem_buf(pem, length);
    if (bio == NULL) return NULL;
    EVP_PKEY *key = PEM_read_bio_PrivateKey(bio, NULL, vaultd_no_passphrase, NULL);
    BIO_free(bio);
    ERR_clear_error();
    return key;
}
#endif
