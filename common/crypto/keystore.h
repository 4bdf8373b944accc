/*
 * keystore.h: reading the key store (pepsi.crypto_identity, pepsi.peer_key)
 * for the crypto stages: an identity's private key opened with the KEK, a
 * correspondent's current key.
 */
#ifndef PEPSI_KEYSTORE_H
#define PEPSI_KEYSTORE_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "base/buf.h"
#include "crypto/kek.h"
#include "crypto/pgpsession.h"

struct keystore_keks
{
	struct kek cur, prev;
	bool	   has_prev;
};

/*
 * address's primary active OpenPGP identity that can do capability
 * ("sign" or "encrypt"): its fingerprint, public key and, when secret is
 * not NULL, its private key opened with the KEKs.  0 when found, 1 when
 * the address has none, -1 on an error (err: a database error, a key that
 * does not open).
 */
int keystore_identity(PGconn *conn, const struct keystore_keks *keks, const char *address, const char *capability,
					  char *fingerprint, struct buf *public_key, struct buf *secret, char *err, size_t errlen);

/*
 * keystore_identity with the secret key put in the worker's OpenPGP
 * session (store: pgp_session_secrets of pgpsession.h, or
 * rnp_session_secrets of rnp_session.h) rather than returned: the row is read every time,
 * so a key revoked, expired, no longer primary or resealed is never used
 * from the session; the key is opened with the KEKs of cfg and imported
 * only when the session lacks the row's sealed bytes.  0 found, 1 none,
 * -1 an error (err), -2 the KEKs cannot be read (err).
 */
int keystore_identity_in_session(PGconn *conn, const struct pepsi_config *cfg, const struct pgp_secret_store *store,
								 const char *address, const char *capability, char *fingerprint, struct buf *public_key, char *err,
								 size_t errlen);

/*
 * address's newest OpenPGP key whose last verdict was valid and whose
 * cache deadline has not passed: 0 found (key, fingerprint), 1 none, -1
 * an error.
 */
int keystore_peer_key(PGconn *conn, const char *address, char *fingerprint, struct buf *key, char *err,
					  size_t errlen);

/*
 * address's newest usable key of either protocol, as keystore_peer_key:
 * protocol ("openpgp" or "smime", KEYSTORE_PROTOCOL_LEN) says which; gcm
 * whether the correspondent announced AES-256-GCM among its S/MIME
 * capabilities (peer_key.smime_capabilities).
 */
#define KEYSTORE_PROTOCOL_LEN 8
int keystore_peer_any(PGconn *conn, const char *address, char *protocol, char *fingerprint, struct buf *key, bool *gcm,
					  char *err, size_t errlen);

/*
 * address's primary active S/MIME identity that can do capability: its
 * fingerprint, certificate (DER) and, when key is not NULL, its PKCS#8
 * private key opened with the KEKs of cfg (wipe it).  0 found, 1 none, -1
 * an error (err), -2 the KEKs cannot be read (err).
 */
int keystore_smime_identity(PGconn *conn, const struct pepsi_config *cfg, const char *address,
							const char *capability, char *fingerprint, struct buf *cert, struct buf *key, char *err,
							size_t errlen);

/* The certificates (DER) of pepsi.ca_trust not past their end: 0, or -1 (err).  Free with keystore_bufs_free. */
int	 keystore_ca_certs(PGconn *conn, struct buf **cas, size_t *count, char *err, size_t errlen);
void keystore_bufs_free(struct buf *bufs, size_t count);

#endif
