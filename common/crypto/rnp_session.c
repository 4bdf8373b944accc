/*
 * rnp_session.c: pepsi-stage-encrypt's OpenPGP encryption and signing in
 * process, through librnp (rnp_session.h).
 *
 * Why librnp here and not GPGME, which the project's guide names for
 * OpenPGP: GPGME drives a gpg process per operation, so a stage that
 * encrypts through it runs no faster than gpg run once per message, the
 * content filter it is meant to beat (bench/crypto measured the two about
 * even).  librnp (RNP, the library Thunderbird uses; Debian's librnp0) is
 * a maintained OpenPGP implementation that works in the calling process:
 * the keys are parsed once per worker and each message costs only its own
 * cryptography.  GPGME stays where one operation per message is not the
 * cost that matters: the decrypt stage, key generation and import
 * (openpgp.c, pgpsession.c).
 *
 * Keys live in one rnp_ffi_t per worker, which holds no file: the key
 * store, not a keyring, holds the keys.  Each key is remembered with the
 * digest of the stored bytes it came from, as in pgpsession.c, so a row
 * that changed (a key replaced, resealed) is removed and imported afresh;
 * the caller reads the row before every use.  Encryption names its
 * recipients and its signer: nothing is picked from the ring.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <jansson.h>
#include <rnp/rnp.h>
#include <rnp/rnp_err.h>

#include "crypto/rnp_session.h"

static void rnp_session_release(void *key);

static rnp_ffi_t			rnp_ffi;
static struct pgp_key_cache rnp_keys = {.release = rnp_session_release};

const struct pgp_secret_store rnp_session_secrets = {rnp_session_has_secret, rnp_session_add_secret};

/* "what: librnp's reason" into err; false. */
static bool
rnp_fail(char *err, size_t errlen, const char *what, rnp_result_t e)
{
	snprintf(err, errlen, "%s: %s", what, rnp_result_to_string(e));
	return false;
}

static bool
rnp_session_start(char *err, size_t errlen)
{
	rnp_result_t e;

	if (rnp_ffi)
		return true;
	e = rnp_ffi_create(&rnp_ffi, "GPG", "GPG");
	if (e)
	{
		rnp_ffi = NULL;
		return rnp_fail(err, errlen, "starting librnp", e);
	}
	return true;
}

static struct pgp_cached_key *
rnp_session_find(const char *fingerprint)
{
	return pgp_cache_find(&rnp_keys, fingerprint);
}

/* Remove key (both halves, its subkeys) from the ring and release the handle. */
static void
rnp_session_remove(rnp_key_handle_t key)
{
	rnp_key_remove(key, RNP_KEY_REMOVE_PUBLIC | RNP_KEY_REMOVE_SECRET | RNP_KEY_REMOVE_SUBKEYS);
	rnp_key_handle_destroy(key);
}

static void
rnp_session_release(void *key)
{
	rnp_session_remove(key);
}

/* The primary key among the keys librnp's import results name, or NULL. */
static rnp_key_handle_t
rnp_imported_primary(const char *results, char *fpr, size_t fprlen)
{
	json_t			*doc = json_loads(results ? results : "", 0, NULL);
	json_t			*keys = json_object_get(doc, "keys");
	json_t			*entry;
	size_t			 i;
	rnp_key_handle_t found = NULL;

	json_array_foreach (keys, i, entry)
	{
		const char		*f = json_string_value(json_object_get(entry, "fingerprint"));
		rnp_key_handle_t key = NULL;
		bool			 primary = false;

		if (found || f == NULL || rnp_locate_key(rnp_ffi, "fingerprint", f, &key) || key == NULL)
			continue;
		if (rnp_key_is_primary(key, &primary) == RNP_SUCCESS && primary)
		{
			found = key;
			snprintf(fpr, fprlen, "%s", f);
		}
		else
			rnp_key_handle_destroy(key);
	}
	json_decref(doc);
	return found;
}

/* Import data as fingerprint's key (afresh: an older version goes first). */
static struct pgp_cached_key *
rnp_session_import(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *data, size_t len,
				   bool secret, char *err, size_t errlen)
{
	struct pgp_cached_key *k;
	rnp_input_t			   input = NULL;
	rnp_key_handle_t	   key = NULL;
	char				  *results = NULL;
	char				   got[65] = "";
	bool				   has_secret = false;
	rnp_result_t		   e;

	if (!rnp_session_start(err, errlen))
		return NULL;
	k = pgp_cache_slot(&rnp_keys, fingerprint);
	e = rnp_input_from_memory(&input, data, len, false);
	if (!e)
		e = rnp_import_keys(rnp_ffi, input,
							RNP_LOAD_SAVE_PUBLIC_KEYS | (secret ? RNP_LOAD_SAVE_SECRET_KEYS : 0) | RNP_LOAD_SAVE_SINGLE,
							&results);
	rnp_input_destroy(input);
	if (e)
	{
		char what[120];

		rnp_buffer_destroy(results);
		snprintf(what, sizeof(what), "key %s: the stored key does not read", fingerprint);
		rnp_fail(err, errlen, what, e);
		return NULL;
	}
	key = rnp_imported_primary(results, got, sizeof(got));
	rnp_buffer_destroy(results);
	if (key == NULL)
	{
		snprintf(err, errlen, "key %s: the stored bytes hold no primary key", fingerprint);
		return NULL;
	}
	if (strcasecmp(got, fingerprint) != 0)
	{
		snprintf(err, errlen, "the key stored as %s is %s", fingerprint, got);
		/* Another row's key, already in the session, stays. */
		if (rnp_session_find(got) == NULL)
			rnp_session_remove(key);
		else
			rnp_key_handle_destroy(key);
		return NULL;
	}
	if (secret && (rnp_key_have_secret(key, &has_secret) != RNP_SUCCESS || !has_secret))
	{
		snprintf(err, errlen, "key %s: only its public half was stored", fingerprint);
		rnp_session_remove(key);
		return NULL;
	}
	pgp_cache_fill(&rnp_keys, k, fingerprint, digest, secret, key);
	return k;
}

bool
rnp_session_has_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN])
{
	return pgp_cache_has_secret(&rnp_keys, fingerprint, digest);
}

bool
rnp_session_add_secret(const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN], const void *secret,
					   size_t len, char *err, size_t errlen)
{
	return rnp_session_import(fingerprint, digest, secret, len, true, err, errlen) != NULL;
}

/* Is key (a primary key or a subkey) in force now: valid, not revoked, not expired? */
static bool
rnp_key_in_force(rnp_key_handle_t key)
{
	bool valid = false, revoked = true, expired = true;

	return rnp_key_is_valid(key, &valid) == RNP_SUCCESS && valid && rnp_key_is_revoked(key, &revoked) == RNP_SUCCESS
		   && !revoked && rnp_key_is_expired(key, &expired) == RNP_SUCCESS && !expired;
}

/* Can key itself encrypt now? */
static bool
rnp_key_encrypts(rnp_key_handle_t key)
{
	bool can = false;

	return rnp_key_allows_usage(key, "encrypt", &can) == RNP_SUCCESS && can && rnp_key_in_force(key);
}

/* Is uid's address address: "<a>", "Name <a>" or a bare "a" (as GPGME reads a User ID)? */
static bool
rnp_uid_is_address(const char *uid, const char *address)
{
	const char *lt = strrchr(uid, '<');
	const char *gt = lt ? strchr(lt, '>') : NULL;
	size_t		n = strlen(address);

	if (lt && gt)
		return (size_t) (gt - lt - 1) == n && strncasecmp(lt + 1, address, n) == 0;
	return strcasecmp(uid, address) == 0;
}

/* Has key a User ID with address, valid and not revoked? */
static bool
rnp_key_has_address(rnp_key_handle_t key, const char *address)
{
	size_t count = 0;
	bool   ok = false;

	if (rnp_key_get_uid_count(key, &count) != RNP_SUCCESS)
		return false;
	for (size_t i = 0; i < count && !ok; i++)
	{
		rnp_uid_handle_t uid = NULL;
		char			*text = NULL;
		bool			 valid = false, revoked = true;

		if (rnp_key_get_uid_handle_at(key, i, &uid) == RNP_SUCCESS && rnp_key_get_uid_at(key, i, &text) == RNP_SUCCESS
			&& rnp_uid_is_valid(uid, &valid) == RNP_SUCCESS && valid
			&& rnp_uid_is_revoked(uid, &revoked) == RNP_SUCCESS && !revoked)
			ok = rnp_uid_is_address(text, address);
		rnp_buffer_destroy(text);
		rnp_uid_handle_destroy(uid);
	}
	return ok;
}

/* Is key one to encrypt to for address now?  The reason in err if not. */
static bool
rnp_key_encrypts_to(rnp_key_handle_t key, const char *fingerprint, const char *address, char *err, size_t errlen)
{
	bool   revoked = false, expired = false, valid = false, subkey_ok = rnp_key_encrypts(key);
	size_t count = 0;

	if (rnp_key_get_subkey_count(key, &count) != RNP_SUCCESS)
		count = 0;
	for (size_t i = 0; i < count && !subkey_ok; i++)
	{
		rnp_key_handle_t sub = NULL;

		if (rnp_key_get_subkey_at(key, i, &sub) == RNP_SUCCESS && sub)
		{
			subkey_ok = rnp_key_encrypts(sub);
			rnp_key_handle_destroy(sub);
		}
	}
	if (rnp_key_is_revoked(key, &revoked) != RNP_SUCCESS)
		revoked = false;
	if (rnp_key_is_expired(key, &expired) != RNP_SUCCESS)
		expired = false;
	if (rnp_key_is_valid(key, &valid) != RNP_SUCCESS)
		valid = false;
	return pgp_key_verdict(fingerprint, address, revoked, expired, rnp_key_has_address(key, address),
						   valid && subkey_ok, err, errlen);
}

bool
rnp_session_public(const char *fingerprint, const void *data, size_t len, const char *address, char *err,
				   size_t errlen)
{
	unsigned char		   digest[PGP_DIGEST_LEN];
	struct pgp_cached_key *k;

	pgp_digest(data, len, digest);
	k = pgp_cache_public(&rnp_keys, fingerprint, digest);
	if (k == NULL)
		k = rnp_session_import(fingerprint, digest, data, len, false, err, errlen);
	if (k == NULL)
		return false;
	return address == NULL || rnp_key_encrypts_to(k->key, fingerprint, address, err, errlen);
}

bool
rnp_session_encrypt(const char *const *recipients, size_t count, const char *signer, const void *plain, size_t len,
					struct buf *out, char *err, size_t errlen)
{
	rnp_input_t		 input = NULL;
	rnp_output_t	 output = NULL;
	rnp_op_encrypt_t op = NULL;
	rnp_result_t	 e;
	uint8_t			*armored = NULL;
	size_t			 armored_len = 0;
	const char		*what = "encrypting";
	bool			 named = false; /* err names the recipient key at fault */

	if (count == 0 || count > 32)
	{
		snprintf(err, errlen, "%zu recipient keys: 1 to 32 at once", count);
		return false;
	}
	for (size_t i = 0; i < count; i++)
		if (rnp_ffi == NULL || rnp_session_find(recipients[i]) == NULL)
		{
			snprintf(err, errlen, "key %s was not read from the key store", recipients[i]);
			return false;
		}
	if (signer)
	{
		struct pgp_cached_key *k = rnp_session_find(signer);

		if (k == NULL || !k->secret)
		{
			snprintf(err, errlen, "the signing key %s was not read from the key store", signer);
			return false;
		}
	}
	e = rnp_input_from_memory(&input, plain, len, false);
	if (!e)
		e = rnp_output_to_memory(&output, 0);
	if (!e)
		e = rnp_op_encrypt_create(&op, rnp_ffi, input, output);
	if (!e)
		e = rnp_op_encrypt_set_armor(op, true);
	if (!e)
		e = rnp_op_encrypt_set_cipher(op, "AES256");
	for (size_t i = 0; i < count && !e; i++)
	{
		e = rnp_op_encrypt_add_recipient(op, rnp_session_find(recipients[i])->key);
		if (e)
		{
			snprintf(err, errlen, "key %s: %s", recipients[i], rnp_result_to_string(e));
			named = true;
		}
	}
	if (!e && signer)
	{
		e = rnp_op_encrypt_add_signature(op, rnp_session_find(signer)->key, NULL);
		what = "the signing key";
	}
	if (!e)
	{
		what = "encrypting";
		e = rnp_op_encrypt_execute(op);
	}
	if (!e)
		e = rnp_output_memory_get_buf(output, &armored, &armored_len, false);
	if (!e)
		buf_append(out, armored, armored_len);
	else if (!named)
		rnp_fail(err, errlen, what, e);
	rnp_op_encrypt_destroy(op);
	rnp_output_destroy(output);
	rnp_input_destroy(input);
	return e == RNP_SUCCESS;
}
