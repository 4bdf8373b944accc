/*
 * test_base64.c: the encoder against RFC 4648's vectors, and the decoder's
 * two modes: strict (an AUTH response: whole quads, no whitespace) and
 * folded (a DKIM tag: whitespace skipped, padding optional).  The AUTH
 * vectors proper are daemons/ingress/tests/data/base64.txt.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/base64.h"

static const char *const rfc4648[][2] = {
	{"", ""},
	{"f", "Zg=="},
	{"fo", "Zm8="},
	{"foo", "Zm9v"},
	{"foob", "Zm9vYg=="},
	{"fooba", "Zm9vYmE="},
	{"foobar", "Zm9vYmFy"},
};

static void
encodes_rfc4648_vectors(void **state)
{
	for (size_t i = 0; i < sizeof(rfc4648) / sizeof(rfc4648[0]); i++)
	{
		struct buf out = BUF_INIT;

		buf_append_str(&out, "x:");
		base64_append(&out, rfc4648[i][0], strlen(rfc4648[i][0]));
		/* Appended after what was there, and NUL-terminated. */
		assert_int_equal(out.len, 2 + strlen(rfc4648[i][1]));
		assert_string_equal(out.data + 2, rfc4648[i][1]);
		buf_free(&out);
	}
}

static long
decode(const char *in, enum base64_mode mode, char *out, size_t outlen)
{
	long n = base64_decode(in, strlen(in), (unsigned char *) out, outlen, mode);

	if (n >= 0)
		out[n] = '\0';
	return n;
}

static void
both_modes_decode_rfc4648_vectors(void **state)
{
	char out[16];

	for (size_t i = 0; i < sizeof(rfc4648) / sizeof(rfc4648[0]); i++)
		for (int mode = BASE64_STRICT; mode <= BASE64_FOLDED; mode++)
		{
			assert_int_equal(decode(rfc4648[i][1], mode, out, sizeof(out) - 1), strlen(rfc4648[i][0]));
			assert_string_equal(out, rfc4648[i][0]);
		}
}

static void
strict_refuses_what_folded_reads(void **state)
{
	char out[16];

	assert_int_equal(decode("Zm9v YmFy", BASE64_STRICT, out, sizeof(out) - 1), -1);
	assert_int_equal(decode("Zm9v\r\n\tYmFy", BASE64_FOLDED, out, sizeof(out) - 1), 6);
	assert_string_equal(out, "foobar");
	/* Padding left off: not a whole quad for AUTH, fine in a tag. */
	assert_int_equal(decode("Zm8", BASE64_STRICT, out, sizeof(out) - 1), -1);
	assert_int_equal(decode("Zm8", BASE64_FOLDED, out, sizeof(out) - 1), 2);
	assert_string_equal(out, "fo");
	assert_int_equal(decode("Zg= =", BASE64_FOLDED, out, sizeof(out) - 1), 1);
}

static void
both_modes_refuse_garbage_and_overflow(void **state)
{
	char out[16];

	for (int mode = BASE64_STRICT; mode <= BASE64_FOLDED; mode++)
	{
		assert_int_equal(decode("Zg==Zm8=", mode, out, sizeof(out) - 1), -1);
		assert_int_equal(decode("Zm9v!mFy", mode, out, sizeof(out) - 1), -1);
		/* One octet short of room is a refusal. */
		assert_int_equal(decode("Zm9vYmFy", mode, out, 5), -1);
		assert_int_equal(decode("Zm9vYmFy", mode, out, 6), 6);
	}
	assert_int_equal(decode("Z===", BASE64_STRICT, out, sizeof(out) - 1), -1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(encodes_rfc4648_vectors),
		cmocka_unit_test(both_modes_decode_rfc4648_vectors),
		cmocka_unit_test(strict_refuses_what_folded_reads),
		cmocka_unit_test(both_modes_refuse_garbage_and_overflow),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
