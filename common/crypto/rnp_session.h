/*
 * rnp_session.h: pepsi-stage-encrypt's OpenPGP session in process, through
 * librnp (pepsi-crypto).
 *
 * The same shape as pgpsession.h, for encryption and signing only: keys
 * come in from the key store once per fingerprint and version of the
 * stored bytes (a row that changed is imported afresh), at most
 * PGP_SESSION_KEYS of them, the least recently used going first; the
 * caller reads the key store's row before every use.
 */
#ifndef PEPSI_RNP_SESSION_H
#define PEPSI_RNP_SESSION_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "crypto/pgpsession.h"

/* The session's secret keys, for keystore_identity_in_session. */
extern const struct pgp_secret_store rnp_session_secrets;

bool rnp_session_has_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN]);
bool rnp_session_add_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *secret,
							size_t len, char *err, size_t errlen);

/*
 * Make fingerprint's public key data present, imported once per version;
 * with address, check it is one to encrypt to for it (not revoked or
 * expired, a User ID of address, a key that encrypts), the reason in err
 * otherwise, worded as pgp_session_public words it.
 */
bool rnp_session_public(const char *fingerprint, const void *data, size_t len, const char *address, char *err,
						size_t errlen);

/*
 * Encrypt plain to the keys of recipients (made present by
 * rnp_session_public), signed with signer's secret key when signer is not
 * NULL; armored into out.
 */
bool rnp_session_encrypt(const char *const *recipients, size_t count, const char *signer, const void *plain,
						 size_t len, struct buf *out, char *err, size_t errlen);

#endif
