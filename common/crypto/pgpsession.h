/*
 * pgpsession.h: a crypto stage worker's one OpenPGP session (pepsi-crypto).
 *
 * A worker keeps one private GNUPGHOME (0700, owned by its effective user,
 * removed with its gpg-agent when the process exits) and one GPGME context
 * on it for its whole life, instead of a home and an agent per message.
 * Keys come into it from the key store once per fingerprint: a
 * correspondent's public key, an identity's secret key (opened with the
 * KEK by the caller).  Each is remembered with a digest of the stored
 * bytes it came from, so a key whose row changed is imported afresh; at
 * most PGP_SESSION_KEYS keys are kept, the least recently used going
 * first (deleted from the home).  The caller reads the key store's row
 * before every use: the session never decides that a key is current.
 */
#ifndef PEPSI_PGPSESSION_H
#define PEPSI_PGPSESSION_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "crypto/keycache.h"
#include "crypto/openpgp.h"

/*
 * Is fingerprint's secret key in the session, imported from the stored
 * (sealed) bytes whose digest is digest?
 */
bool pgp_session_has_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN]);

/* Import fingerprint's secret key (binary or armored), stored as bytes of digest. */
bool pgp_session_add_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *secret,
							size_t len, char *err, size_t errlen);

/*
 * A session's secret keys as the key store fills them
 * (keystore_identity_in_session): this GPGME session's, or librnp's
 * (rnp_session.h) in pepsi-stage-encrypt.
 */
struct pgp_secret_store
{
	bool (*has_secret)(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN]);
	bool (*add_secret)(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *secret,
					   size_t len, char *err, size_t errlen);
};

extern const struct pgp_secret_store pgp_session_secrets;

/*
 * Make the public key data (fingerprint's row in pepsi.peer_key, or an
 * identity's public half) present in the session, imported once per
 * version.  When address is given, check the key is one to encrypt to for
 * it: not revoked or expired (now), a User ID of address, a subkey that
 * encrypts; refused with the reason otherwise.
 */
bool pgp_session_public(const char *fingerprint, const void *data, size_t len, const char *address, char *err,
						size_t errlen);

/*
 * Encrypt plain to the keys of recipients (fingerprints made present by
 * pgp_session_public), signed with signer's secret key when signer is not
 * NULL; armored into out.
 */
bool pgp_session_encrypt(const char *const *recipients, size_t count, const char *signer, const void *plain,
						 size_t len, struct buf *out, char *err, size_t errlen);

/*
 * Decrypt cipher, which must be encrypted to the key secret (present with
 * its secret half); a signature is good only when made by one of the keys
 * signers (fingerprints made present), whatever else the session holds.
 */
bool pgp_session_decrypt(const char *secret, const char *const *signers, size_t nsigners, const void *cipher,
						 size_t len, struct buf *out, struct pgp_verdict *verdict, char *err, size_t errlen);

#endif
