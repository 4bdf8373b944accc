/*
 * openpgp.h: OpenPGP keys through GPGME (pepsi-crypto).  Each call here
 * works in a private GNUPGHOME of its own (mode 0700, removed with its
 * gpg-agent when done), into which only the keys it was given are
 * imported: the key store, not a keyring on disk, holds the keys.  The
 * stages encrypt and decrypt in their worker's one session instead
 * (pgpsession.h).
 */
#ifndef PEPSI_OPENPGP_H
#define PEPSI_OPENPGP_H

#include <stdbool.h>
#include <stddef.h>
#include <time.h>

#include "base/buf.h"

/* What a key is: its primary key's fingerprint and algorithm, and its state. */
struct pgp_key_info
{
	char	   fingerprint[65];
	char	   algorithm[32];
	time_t	   expires;	   /* 0: never */
	bool	   has_secret; /* the secret half was given (and can sign or decrypt) */
	bool	   can_sign;
	bool	   can_encrypt;
	struct buf public_key; /* the public key, binary (RFC 4880 transferable public key) */
	struct buf secret_key; /* the secret key, binary, when has_secret; wipe it (buf_wipe) */
};

void pgp_key_info_free(struct pgp_key_info *info);

/*
 * Make a key pair for address ("ed25519": an Ed25519 primary that signs
 * and a Curve25519 subkey that encrypts; "rsa3072" likewise in RSA),
 * expiring after days (0: never), with the User ID <address>.
 */
bool pgp_generate(const char *address, const char *type, int days, struct pgp_key_info *info, char *err,
				  size_t errlen);

/*
 * Read one key (armored or binary, public or secret) and check it is one
 * address may use: not revoked, not expired, a User ID with that address
 * (a revoked or mismatched key is refused with the reason), and, when
 * want_secret, with its secret half.
 */
bool pgp_inspect(const void *data, size_t len, const char *address, bool want_secret, struct pgp_key_info *info,
				 char *err, size_t errlen);

/* The armored form of a binary key. */
bool pgp_armor(const void *data, size_t len, struct buf *out, char *err, size_t errlen);

/* A key handed to an import: its bytes (binary or armored). */
struct pgp_blob
{
	const void *data;
	size_t		len;
};

/* What the signatures of a decrypted or verified message say. */
struct pgp_verdict
{
	bool signed_;		  /* it carried a signature */
	bool good;			  /* one signature verified with a key given */
	char fingerprint[65]; /* the first signature's key */
	char reason[160];	  /* why not good, when signed_ and not good */
};

#endif
