/*
 * pubkey_cache.h: decoded DKIM public keys, kept so that a key seen again
 * is not decoded again.
 *
 * Why: libopendkim decodes the key record of every signature it checks
 * with d2i_PUBKEY_bio, and on OpenSSL 3 that call goes through the
 * provider decoder framework: about 175 us on this class of machine, where
 * the RSA-2048 verification itself takes about 25 us.  Mail arrives from
 * few signers with few keys, so at a few thousand messages a second
 * decoding the same key over and over was most of what verification cost
 * pepsi-ingress.  libopendkim has no hook for a decoded key, so this file
 * defines d2i_PUBKEY_bio itself: the dynamic linker binds libopendkim's
 * reference to the program's definition before libcrypto's (ELF symbol
 * interposition), and the definition answers from a small cache keyed by
 * the key's exact DER bytes, decoding with d2i_PUBKEY on a miss.  The
 * result is what libcrypto's own function returns (a new reference to an
 * equal key, which the caller frees); a call it cannot serve that way (an
 * out-parameter, a BIO that is not memory) goes to libcrypto unchanged.
 *
 * The cache is bounded in entries and in key size, so hostile mail with a
 * fresh key per message costs what it did before and no more memory.
 */
#ifndef PEPSI_AUTH_PUBKEY_CACHE_H
#define PEPSI_AUTH_PUBKEY_CACHE_H

#include <stddef.h>

/* Keys kept; the oldest is replaced when full. */
#define PUBKEY_CACHE_ENTRIES 64
/* A DER key longer than this is decoded but not kept (RSA-8192 is ~1,100). */
#define PUBKEY_CACHE_MAX_DER 2048

/*
 * Finds libcrypto's own function, for the calls the cache passes on.
 * Call it before the first verification: it is also what links this file
 * into a program (a static library's object is linked only when something
 * names it, and libopendkim comes after the library on the command line).
 */
void pubkey_cache_init(void);

/* Decodes served from the cache, and decodes made. */
void pubkey_cache_counts(size_t *hits, size_t *misses);

#endif
