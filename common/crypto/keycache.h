/*
 * keycache.h: the keys a crypto stage worker's OpenPGP session holds, by
 * fingerprint (pepsi-crypto): each remembered with the digest of the
 * stored bytes it came from (the row's version, as the session sees it)
 * and whether its secret half came in; at most PGP_SESSION_KEYS, the least
 * recently used released first.  The GPGME session (pgpsession.c) and the
 * librnp one (rnp_session.c) keep their keys in one each.
 */
#ifndef PEPSI_KEYCACHE_H
#define PEPSI_KEYCACHE_H

#include <stdbool.h>
#include <stddef.h>

#define PGP_SESSION_KEYS 64
#define PGP_DIGEST_LEN 32

struct pgp_cached_key
{
	char			   fingerprint[65]; /* empty: a free slot */
	unsigned char	   digest[PGP_DIGEST_LEN];
	bool			   secret;
	void			  *key; /* the session's handle */
	unsigned long long used;
};

struct pgp_key_cache
{
	struct pgp_cached_key keys[PGP_SESSION_KEYS];
	unsigned long long	  clock;
	void (*release)(void *key); /* take the key out of the session and free its handle */
};

/* SHA-256 of bytes read from the key store. */
void pgp_digest(const void *data, size_t len, unsigned char digest[PGP_DIGEST_LEN]);

/* fingerprint's slot (now the most recently used), or NULL. */
struct pgp_cached_key *pgp_cache_find(struct pgp_key_cache *c, const char *fingerprint);

/* Release k's key and free the slot. */
void pgp_cache_drop(struct pgp_key_cache *c, struct pgp_cached_key *k);

/* A free slot for fingerprint: its old version dropped, or the least recently used key if need be. */
struct pgp_cached_key *pgp_cache_slot(struct pgp_key_cache *c, const char *fingerprint);

/* Fill slot k with key, imported from the stored bytes of digest. */
void pgp_cache_fill(struct pgp_key_cache *c, struct pgp_cached_key *k, const char *fingerprint,
					const unsigned char digest[PGP_DIGEST_LEN], bool secret, void *key);

/* Is fingerprint's secret key held, from the stored bytes of digest? */
bool pgp_cache_has_secret(struct pgp_key_cache *c, const char *fingerprint, const unsigned char digest[PGP_DIGEST_LEN]);

/*
 * fingerprint's key as held for public data of digest: NULL when it must be
 * imported (not held, or held from other bytes; an identity's secret key
 * held has its public half with it).
 */
struct pgp_cached_key *pgp_cache_public(struct pgp_key_cache *c, const char *fingerprint,
										const unsigned char digest[PGP_DIGEST_LEN]);

/*
 * May fingerprint's key be encrypted to for address, given its state?
 * The reason in err when not, in the words both sessions give.
 */
bool pgp_key_verdict(const char *fingerprint, const char *address, bool revoked, bool expired, bool uid_ok,
					 bool encrypts, char *err, size_t errlen);

/* Release every key. */
void pgp_cache_clear(struct pgp_key_cache *c);

#endif
