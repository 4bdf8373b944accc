/*
 * keycache.c: the keys a crypto stage worker's OpenPGP session holds
 * (keycache.h).
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <openssl/sha.h>

#include "crypto/keycache.h"

void
pgp_digest(const void *data, size_t len, unsigned char digest[PGP_DIGEST_LEN])
{
	SHA256(data, len, digest);
}

struct pgp_cached_key *
pgp_cache_find(struct pgp_key_cache *c, const char *fingerprint)
{
	for (size_t i = 0; i < PGP_SESSION_KEYS; i++)
		if (c->keys[i].fingerprint[0] && strcasecmp(c->keys[i].fingerprint, fingerprint) == 0)
		{
			c->keys[i].used = ++c->clock;
			return &c->keys[i];
		}
	return NULL;
}

void
pgp_cache_drop(struct pgp_key_cache *c, struct pgp_cached_key *k)
{
	if (k->key)
		c->release(k->key);
	memset(k, 0, sizeof(*k));
}

struct pgp_cached_key *
pgp_cache_slot(struct pgp_key_cache *c, const char *fingerprint)
{
	struct pgp_cached_key *k = pgp_cache_find(c, fingerprint);
	struct pgp_cached_key *oldest = &c->keys[0];

	if (k)
	{
		pgp_cache_drop(c, k);
		return k;
	}
	for (size_t i = 0; i < PGP_SESSION_KEYS; i++)
	{
		if (c->keys[i].fingerprint[0] == '\0')
			return &c->keys[i];
		if (c->keys[i].used < oldest->used)
			oldest = &c->keys[i];
	}
	pgp_cache_drop(c, oldest);
	return oldest;
}

void
pgp_cache_fill(struct pgp_key_cache *c, struct pgp_cached_key *k, const char *fingerprint,
			   const unsigned char digest[PGP_DIGEST_LEN], bool secret, void *key)
{
	snprintf(k->fingerprint, sizeof(k->fingerprint), "%s", fingerprint);
	memcpy(k->digest, digest, PGP_DIGEST_LEN);
	k->secret = secret;
	k->key = key;
	k->used = ++c->clock;
}

bool
pgp_cache_has_secret(struct pgp_key_cache *c, const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN])
{
	struct pgp_cached_key *k = pgp_cache_find(c, fingerprint);

	return k && k->secret && memcmp(k->digest, digest, PGP_DIGEST_LEN) == 0;
}

struct pgp_cached_key *
pgp_cache_public(struct pgp_key_cache *c, const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN])
{
	struct pgp_cached_key *k = pgp_cache_find(c, fingerprint);

	return k && (k->secret || memcmp(k->digest, digest, PGP_DIGEST_LEN) == 0) ? k : NULL;
}

bool
pgp_key_verdict(const char *fingerprint, const char *address, bool revoked, bool expired, bool uid_ok, bool encrypts,
				char *err, size_t errlen)
{
	if (revoked)
		snprintf(err, errlen, "key %s is revoked", fingerprint);
	else if (expired)
		snprintf(err, errlen, "key %s has expired", fingerprint);
	else if (!uid_ok)
		snprintf(err, errlen, "key %s has no User ID with the address %s", fingerprint, address);
	else if (!encrypts)
		snprintf(err, errlen, "key %s cannot encrypt", fingerprint);
	else
		return true;
	return false;
}

void
pgp_cache_clear(struct pgp_key_cache *c)
{
	for (size_t i = 0; i < PGP_SESSION_KEYS; i++)
		if (c->keys[i].key)
			pgp_cache_drop(c, &c->keys[i]);
}
