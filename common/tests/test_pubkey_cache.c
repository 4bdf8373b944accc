/*
 * test_pubkey_cache.c: the decoded-key cache that stands in for
 * libcrypto's d2i_PUBKEY_bio (auth/pubkey_cache.h).  A key decoded twice
 * is decoded once and both answers are the same key; each answer is a
 * reference of its own; the BIO is consumed as libcrypto's decoder
 * consumes it; garbage is still refused; calls the cache does not serve
 * (an out-parameter, a BIO that is not memory) still work, through
 * libcrypto.  libopendkim verifying through it is t/072's business.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>

#include "auth/pubkey_cache.h"

static unsigned char *
fresh_der(int *len)
{
	EVP_PKEY	  *key = EVP_RSA_gen(2048);
	unsigned char *der = NULL;

	assert_non_null(key);
	*len = i2d_PUBKEY(key, &der);
	assert_true(*len > 0);
	EVP_PKEY_free(key);
	return der;
}

static EVP_PKEY *
decode(const unsigned char *der, int len, int *left)
{
	BIO		 *bio = BIO_new_mem_buf(der, len);
	EVP_PKEY *key = d2i_PUBKEY_bio(bio, NULL);

	*left = (int) BIO_pending(bio);
	BIO_free(bio);
	return key;
}

static void
test_second_decode_is_a_hit(void **state)
{
	int			   len, left;
	unsigned char *der = fresh_der(&len);
	size_t		   hits0, misses0, hits, misses;
	EVP_PKEY	  *a, *b;

	pubkey_cache_init();
	pubkey_cache_counts(&hits0, &misses0);
	a = decode(der, len, &left);
	assert_non_null(a);
	assert_int_equal(left, 0);
	b = decode(der, len, &left);
	assert_non_null(b);
	assert_int_equal(left, 0);
	pubkey_cache_counts(&hits, &misses);
	assert_int_equal(misses - misses0, 1);
	assert_int_equal(hits - hits0, 1);
	assert_int_equal(EVP_PKEY_eq(a, b), 1);
	/* Each answer is the caller's to free: freeing both leaves the cache's. */
	EVP_PKEY_free(a);
	EVP_PKEY_free(b);
	b = decode(der, len, &left);
	assert_non_null(b);
	assert_int_equal(EVP_PKEY_get_bits(b), 2048);
	EVP_PKEY_free(b);
	OPENSSL_free(der);
}

static void
test_trailing_bytes_left_in_the_bio(void **state)
{
	int			   len, left;
	unsigned char *der = fresh_der(&len);
	unsigned char *padded = malloc((size_t) len + 5);
	EVP_PKEY	  *key;

	memcpy(padded, der, (size_t) len);
	memcpy(padded + len, "extra", 5);
	for (int round = 0; round < 2; round++) /* a miss, then a hit */
	{
		key = decode(padded, len + 5, &left);
		assert_non_null(key);
		assert_int_equal(left, 5);
		EVP_PKEY_free(key);
	}
	free(padded);
	OPENSSL_free(der);
}

static void
test_garbage_is_refused(void **state)
{
	static const unsigned char garbage[] = "not a key at all";
	int						   left;

	assert_null(decode(garbage, sizeof(garbage), &left));
	assert_null(decode(garbage, sizeof(garbage), &left)); /* and not remembered as a key */
}

static void
test_calls_the_cache_does_not_serve(void **state)
{
	int			   len;
	unsigned char *der = fresh_der(&len);
	BIO			  *mem = BIO_new_mem_buf(der, len);
	BIO			  *chain = BIO_push(BIO_new(BIO_f_buffer()), BIO_new_mem_buf(der, len));
	EVP_PKEY	  *out = NULL;
	EVP_PKEY	  *key;

	/* An out-parameter: libcrypto fills it. */
	key = d2i_PUBKEY_bio(mem, &out);
	assert_non_null(key);
	assert_ptr_equal(key, out);
	EVP_PKEY_free(key);
	/* A BIO that is not memory (a filter in front of one). */
	key = d2i_PUBKEY_bio(chain, NULL);
	assert_non_null(key);
	EVP_PKEY_free(key);
	BIO_free(mem);
	BIO_free_all(chain);
	OPENSSL_free(der);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_second_decode_is_a_hit),
		cmocka_unit_test(test_trailing_bytes_left_in_the_bio),
		cmocka_unit_test(test_garbage_is_refused),
		cmocka_unit_test(test_calls_the_cache_does_not_serve),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
