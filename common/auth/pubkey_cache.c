/*
 * pubkey_cache.c: see pubkey_cache.h.  One mutex around a small array:
 * the cache is consulted once per signature checked, and a linear scan of
 * 64 lengths is nothing beside the decode it saves.
 */
#include "auth/pubkey_cache.h"

#include <dlfcn.h> /* RTLD_NEXT: the build defines _GNU_SOURCE */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/x509.h>

#include "base/xalloc.h"

struct pubkey_cache_entry
{
	unsigned char *der; /* the bytes the key was decoded from (the whole BIO) */
	size_t		   der_len;
	size_t		   consumed; /* of them, what the decoder read */
	EVP_PKEY	  *key;
};

static struct
{
	pthread_mutex_t			  lock;
	struct pubkey_cache_entry entry[PUBKEY_CACHE_ENTRIES];
	size_t					  next; /* the slot the next new key takes */
	size_t					  hits;
	size_t					  misses;
} pubkey_cache = {.lock = PTHREAD_MUTEX_INITIALIZER};

typedef EVP_PKEY *(*d2i_pubkey_bio_fn)(BIO *, EVP_PKEY **);

/* libcrypto's own d2i_PUBKEY_bio, for the calls the cache does not serve. */
static d2i_pubkey_bio_fn pubkey_libcrypto_decode;

void
pubkey_cache_init(void)
{
	if (pubkey_libcrypto_decode == NULL)
		pubkey_libcrypto_decode = (d2i_pubkey_bio_fn) dlsym(RTLD_NEXT, "d2i_PUBKEY_bio");
}

static EVP_PKEY *
pubkey_decode_by_libcrypto(BIO *bp, EVP_PKEY **a)
{
	pubkey_cache_init();
	return pubkey_libcrypto_decode ? pubkey_libcrypto_decode(bp, a) : NULL;
}

static struct pubkey_cache_entry *
pubkey_cache_find(const unsigned char *der, size_t len)
{
	for (size_t i = 0; i < PUBKEY_CACHE_ENTRIES; i++)
	{
		struct pubkey_cache_entry *e = &pubkey_cache.entry[i];

		if (e->key && e->der_len == len && memcmp(e->der, der, len) == 0)
			return e;
	}
	return NULL;
}

static void
pubkey_cache_keep(const unsigned char *der, size_t len, size_t consumed, EVP_PKEY *key)
{
	struct pubkey_cache_entry *e = &pubkey_cache.entry[pubkey_cache.next];

	pubkey_cache.next = (pubkey_cache.next + 1) % PUBKEY_CACHE_ENTRIES;
	free(e->der);
	EVP_PKEY_free(e->key);
	e->der = xmalloc(len);
	memcpy(e->der, der, len);
	e->der_len = len;
	e->consumed = consumed;
	EVP_PKEY_up_ref(key);
	e->key = key;
}

/* Reads n bytes off the BIO, as the decoder would have consumed them. */
static void
pubkey_bio_skip(BIO *bp, size_t n)
{
	char scratch[256];

	while (n > 0)
	{
		int got = BIO_read(bp, scratch, (int) (n < sizeof(scratch) ? n : sizeof(scratch)));

		if (got <= 0)
			break;
		n -= (size_t) got;
	}
}

/*
 * Interposes libcrypto's function of the same name (pubkey_cache.h says
 * why); same contract: a new reference the caller frees, or NULL.
 */
EVP_PKEY *
d2i_PUBKEY_bio(BIO *bp, EVP_PKEY **a)
{
	char					  *data;
	long					   len;
	struct pubkey_cache_entry *e;
	EVP_PKEY				  *key = NULL;

	if (a != NULL || bp == NULL || BIO_method_type(bp) != BIO_TYPE_MEM
		|| (len = BIO_get_mem_data(bp, &data)) <= 0 || (size_t) len > PUBKEY_CACHE_MAX_DER)
		return pubkey_decode_by_libcrypto(bp, a);

	pthread_mutex_lock(&pubkey_cache.lock);
	if ((e = pubkey_cache_find((const unsigned char *) data, (size_t) len)) != NULL)
	{
		EVP_PKEY_up_ref(e->key);
		key = e->key;
		pubkey_cache.hits++;
		pubkey_bio_skip(bp, e->consumed);
	}
	else
	{
		const unsigned char *p = (const unsigned char *) data;

		pubkey_cache.misses++;
		key = d2i_PUBKEY(NULL, &p, len);
		if (key)
		{
			size_t consumed = (size_t) (p - (const unsigned char *) data);

			pubkey_cache_keep((const unsigned char *) data, (size_t) len, consumed, key);
			pubkey_bio_skip(bp, consumed);
		}
	}
	pthread_mutex_unlock(&pubkey_cache.lock);
	return key;
}

void
pubkey_cache_counts(size_t *hits, size_t *misses)
{
	pthread_mutex_lock(&pubkey_cache.lock);
	*hits = pubkey_cache.hits;
	*misses = pubkey_cache.misses;
	pthread_mutex_unlock(&pubkey_cache.lock);
}
