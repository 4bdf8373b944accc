/*
 * test_securelink.c: the secure-link portal's seal (common/message/
 * securelink.c): a token gives back the same identifier and key, the
 * identifier is not the key, a seal opens under its link and recipient
 * only, and an altered ciphertext, nonce or tag does not open.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "message/securelink.h"

static void
token_gives_back_the_link(void **state)
{
	struct securelink a, b;

	assert_true(securelink_new(&a));
	assert_int_equal(strlen(a.token), SECURELINK_TOKEN_LEN);
	assert_true(securelink_from_token(a.token, &b));
	assert_memory_equal(a.id, b.id, SECURELINK_ID_LEN);
	assert_memory_equal(a.key, b.key, SECURELINK_KEY_LEN);
	assert_memory_not_equal(a.id, a.key, SECURELINK_ID_LEN);
	assert_true(securelink_new(&b));
	assert_memory_not_equal(a.id, b.id, SECURELINK_ID_LEN);
}

static void
refuses_what_is_no_token(void **state)
{
	struct securelink l;
	char			  upper[SECURELINK_TOKEN_LEN + 1];

	assert_false(securelink_from_token(NULL, &l));
	assert_false(securelink_from_token("", &l));
	assert_false(securelink_from_token("abc", &l));
	memset(upper, 'A', SECURELINK_TOKEN_LEN);
	upper[SECURELINK_TOKEN_LEN] = '\0';
	assert_false(securelink_from_token(upper, &l));
	memset(upper, 'a', SECURELINK_TOKEN_LEN);
	upper[10] = 'g';
	assert_false(securelink_from_token(upper, &l));
}

static void
opens_under_its_link_and_recipient_only(void **state)
{
	static const char plain[] = "Subject: the secret plans\r\n\r\nThe wombat.\r\n";
	struct securelink link, other;
	unsigned char	  nonce[SECURELINK_NONCE_LEN];
	struct buf		  sealed = BUF_INIT, out = BUF_INIT;

	assert_true(securelink_new(&link));
	assert_true(securelink_new(&other));
	assert_true(securelink_seal(&link, "Bob@Example.org", plain, strlen(plain), nonce, &sealed));
	assert_int_equal(sealed.len, strlen(plain) + 16);
	assert_null(memmem(sealed.data, sealed.len, "wombat", 6));
	assert_true(securelink_open(&link, "bob@example.org", nonce, (unsigned char *) sealed.data, sealed.len, &out));
	assert_int_equal(out.len, strlen(plain));
	assert_memory_equal(out.data, plain, out.len);
	assert_false(securelink_open(&other, "bob@example.org", nonce, (unsigned char *) sealed.data, sealed.len, &out));
	assert_int_equal(out.len, 0);
	assert_false(securelink_open(&link, "carol@example.org", nonce, (unsigned char *) sealed.data, sealed.len, &out));
	for (size_t i = 0; i < sealed.len; i += 7)
	{
		sealed.data[i] ^= 1;
		assert_false(securelink_open(&link, "bob@example.org", nonce, (unsigned char *) sealed.data, sealed.len, &out));
		sealed.data[i] ^= 1;
	}
	nonce[0] ^= 1;
	assert_false(securelink_open(&link, "bob@example.org", nonce, (unsigned char *) sealed.data, sealed.len, &out));
	assert_false(securelink_open(&link, "bob@example.org", nonce, (unsigned char *) sealed.data, 15, &out));
	buf_free(&sealed);
	securelink_buf_wipe(&out);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(token_gives_back_the_link),
		cmocka_unit_test(refuses_what_is_no_token),
		cmocka_unit_test(opens_under_its_link_and_recipient_only),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
