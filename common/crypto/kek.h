/*
 * kek.h: the key-encryption key of the key store (pepsi-crypto).
 *
 * Every private key in pepsi.crypto_identity.private_wrapped is sealed
 * with AES-256-GCM under the KEK of [crypto] KEK, a secrets.d fragment
 * readable by the pepsi-crypto group alone, so a dump of the database
 * holds ciphertext only.  A KEK is written "ID:BASE64": a name of 1 to 32
 * letters, digits, '-' or '.', and 32 random bytes.  KEK_PREVIOUS keeps
 * the one before it while pepsi-keys kek-rotate rewraps.
 *
 * A sealed key is: the version byte 1, the length of the KEK's id and the
 * id, a 12-byte nonce, the ciphertext and the 16-byte tag.  The version,
 * the id and the key's fingerprint are authenticated with it, so a blob
 * copied onto another row does not open there.
 */
#ifndef PEPSI_KEK_H
#define PEPSI_KEK_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"
#include "config/config.h"

#define KEK_ID_MAX 32
#define KEK_KEY_LEN 32

struct kek
{
	char		  id[KEK_ID_MAX + 1];
	unsigned char key[KEK_KEY_LEN];
};

/* The KEKs of the configuration: cur from [crypto] KEK (required), prev from KEK_PREVIOUS (*has_prev). */
bool kek_from_config(const struct pepsi_config *cfg, struct kek *cur, struct kek *prev, bool *has_prev,
					 char *err, size_t errlen);
/* Parse "ID:BASE64"; false with the reason in err (never the value). */
bool kek_parse(const char *text, struct kek *kek, char *err, size_t errlen);
/* A new KEK named id, as "ID:BASE64" in out. */
bool kek_generate(const char *id, struct buf *out, char *err, size_t errlen);
/* Seal plain (bound to fingerprint) under kek into out. */
bool kek_wrap(const struct kek *kek, const char *fingerprint, const void *plain, size_t len, struct buf *out,
			  char *err, size_t errlen);
/* The id of the KEK that sealed blob, in id; false if blob is not a sealed key. */
bool kek_wrapped_id(const void *blob, size_t len, char *id, size_t idlen);
/* Open blob (sealed for fingerprint) with kek into out, which the caller wipes (buf_wipe). */
bool kek_unwrap(const struct kek *kek, const char *fingerprint, const void *blob, size_t len, struct buf *out,
				char *err, size_t errlen);
/* Overwrite a buffer's bytes before freeing it. */
void buf_wipe(struct buf *b);
/* Forget a KEK. */
void kek_wipe(struct kek *kek);

#endif
