/*
 * keys.h: the private keys Pepsi signs with (DKIM and ARC) and the public
 * key records of the DNS (RFC 6376 3.6.1, RFC 8463 4).
 *
 * A key is named by a file-only section of pepsi.conf (the overlay in the
 * database may not point the signer at another file):
 *
 *   [dkim-key-<name>]
 *   DOMAIN     = example.org          the d= it signs for
 *   SELECTOR   = 2026a                its s=
 *   ALGORITHM  = rsa-sha256 | ed25519-sha256   what the selector publishes
 *   KEY_FILE   = /etc/pepsi/dkim/2026a.pem     PEM private key, mode 0600/0400
 *
 * A file readable by group or others, a key of another type than
 * ALGORITHM says, or an RSA key shorter than 2048 bits is refused with a
 * message naming the file and the fix.
 */
#ifndef PEPSI_AUTH_KEYS_H
#define PEPSI_AUTH_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <openssl/evp.h>

#include "auth/canon.h"
#include "base/buf.h"
#include "config/config.h"

#define KEYS_SECTION_PREFIX "dkim-key-"
#define KEYS_RSA_MIN_BITS 2048
#define KEYS_RSA_MAX_BITS 8192

enum sign_algorithm
{
	SIGN_RSA_SHA256,
	SIGN_ED25519_SHA256
};

struct signing_key
{
	char			   *section; /* dkim-key-<name> */
	char			   *domain;	 /* lower case */
	char			   *selector;
	char			   *path;
	enum sign_algorithm algorithm;
	EVP_PKEY		   *pkey; /* NULL until loaded, or after a failed load */
	dev_t				dev;  /* the file it was loaded from, to notice a new one */
	ino_t				ino;
	time_t				mtime;
	long long			checked_ms; /* when the file was last found unchanged (monotonic) */
};

struct keyring
{
	struct signing_key *key;
	size_t				count;
};

bool		sign_algorithm_parse(const char *text, size_t len, enum sign_algorithm *out);
const char *sign_algorithm_name(enum sign_algorithm a);		/* "rsa-sha256" */
const char *sign_algorithm_key_type(enum sign_algorithm a); /* "rsa", "ed25519" */

/* Every [dkim-key-*] section of cfg; false with err (file:line) for a bad one. */
bool keyring_from_config(const struct pepsi_config *cfg, struct keyring *ring,
						 char *err, size_t errlen);
void keyring_free(struct keyring *ring);
/* The key of a section name ("dkim-key-x" or just "x"), or NULL. */
struct signing_key *keyring_find(struct keyring *ring, const char *name);

/*
 * Load (or reload, when its file changed) the private key; false with a
 * reason naming the file.  A loaded key's file is looked at again at most
 * once a second (KEYS_RECHECK_MS): a replaced or removed file is noticed
 * within that second, without a stat for every message signed.
 */
#define KEYS_RECHECK_MS 1000
bool signing_key_ready(struct signing_key *key, char *err, size_t errlen);

/* Read a PEM private key file, checking its mode and its type against algorithm. */
EVP_PKEY *keys_load_private(const char *path, enum sign_algorithm algorithm, char *err,
							size_t errlen);

/*
 * Sign the SHA-256 hash of the canonical data; appends the base64 signature.
 * The key's signing context is set up at its first signature and kept (a
 * reference on the key held with it) for the next ones of the thread.
 */
bool keys_sign_hash(EVP_PKEY *pkey, enum sign_algorithm algorithm,
					const unsigned char hash[CANON_HASH_LEN], struct buf *b64);
bool keys_verify_hash(EVP_PKEY *pub, enum sign_algorithm algorithm,
					  const unsigned char  hash[CANON_HASH_LEN],
					  const unsigned char *sig, size_t siglen);

/* A new key pair: RSA of bits, or Ed25519 (bits ignored). */
EVP_PKEY *keys_generate(enum sign_algorithm algorithm, int bits);
/*
 * Write a new private key to path (PEM, mode 0600), never over an existing
 * file (O_EXCL: a key in use is not overwritten by accident); false with
 * the reason, and nothing left behind.
 */
bool keys_write_private(const char *path, EVP_PKEY *pkey, char *err, size_t errlen);
/* The TXT record to publish: "v=DKIM1; k=rsa; p=..." */
void keys_public_record(EVP_PKEY *pkey, enum sign_algorithm algorithm, struct buf *out);
/*
 * The public key of a published record (the TXT strings joined).  NULL with
 * a reason for a malformed or revoked record, or one whose k= is not the
 * algorithm's key type.
 */
EVP_PKEY *keys_parse_record(const char *record, size_t len, enum sign_algorithm algorithm,
							char *err, size_t errlen);
/* Do two keys hold the same public key? */
bool keys_same_public(EVP_PKEY *a, EVP_PKEY *b);

struct dns_resolver;
/*
 * Is key's published record (SELECTOR._domainkey.DOMAIN, in name) its
 * public key?  The verdict in verdict: "ok", or what is wrong (the private
 * key cannot be loaded, no record, a malformed or revoked one, another key).
 */
bool keys_check_published(struct dns_resolver *resolver, struct signing_key *key, char *name,
						  size_t namelen, char *verdict, size_t verdictlen);

#endif
