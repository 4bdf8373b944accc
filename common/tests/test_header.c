/*
 * test_header.c: the Authentication-Results that ingress drops and
 * pepsi-sendmail too (RFC 8601 5: only we may claim our authserv-id),
 * whatever the form of the claim: a space before the colon, the id a
 * quoted-string, comments and folds before it; and the ones it keeps.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "message/header.h"

/* Whether the one field headers holds is dropped as a claim of mx.test. */
static bool
dropped(const char *headers)
{
	struct buf kept = BUF_INIT;
	size_t	   removed = header_remove_results_of(headers, strlen(headers), "mx.test", &kept);

	assert_int_equal(kept.len + (removed ? strlen(headers) : 0), strlen(headers));
	buf_free(&kept);
	return removed == 1;
}

static void
test_claims_of_our_id_dropped(void **state)
{
	assert_true(dropped("Authentication-Results: mx.test; spf=pass\r\n"));
	assert_true(dropped("authentication-results:MX.TEST;dkim=pass\r\n"));
	assert_true(dropped("Authentication-Results: (c) mx.test 1;\r\n\tdkim=pass\r\n"));
	assert_true(dropped("Authentication-Results:\r\n mx.test; dkim=pass\r\n"));
}

static void
test_space_before_colon(void **state)
{
	assert_true(dropped("Authentication-Results : mx.test; dkim=pass\r\n"));
	assert_true(dropped("Authentication-Results\t: mx.test; dkim=pass\r\n"));
}

static void
test_quoted_authserv_id(void **state)
{
	assert_true(dropped("Authentication-Results: \"mx.test\"; dkim=pass\r\n"));
	assert_true(dropped("Authentication-Results: \"MX.T\\est\" 1; dkim=pass\r\n"));
	assert_true(dropped("Authentication-Results: (x) \"mx.test\"(y); dkim=pass\r\n"));
}

static void
test_others_kept(void **state)
{
	assert_false(dropped("Authentication-Results: other.example; dkim=pass\r\n"));
	assert_false(dropped("Authentication-Results: mx.test.evil.example; dkim=pass\r\n"));
	assert_false(dropped("Authentication-Results: \"mx.test.evil\"; dkim=pass\r\n"));
	assert_false(dropped("Authentication-Results: \"mx.test; dkim=pass\r\n"));
	assert_false(dropped("Authentication-Results: \"\"; dkim=pass\r\n"));
	assert_false(dropped("ARC-Authentication-Results: i=1; mx.test; dkim=pass\r\n"));
	assert_false(dropped("Authentication-Results-X: mx.test; dkim=pass\r\n"));
}

/* The space before the colon counts for every reader of fields (Bcc : is Bcc). */
static void
test_space_before_colon_everywhere(void **state)
{
	const char *h = "Bcc : hidden@example.org\r\nSubject\t: hi\r\n";
	struct buf	out = BUF_INIT;
	char	   *subject = header_get(h, strlen(h), "Subject");

	assert_string_equal(subject, "hi");
	header_remove(h, strlen(h), "Bcc", &out);
	assert_int_equal(out.len, strlen("Subject\t: hi\r\n"));
	assert_int_equal(header_count(h, strlen(h), "Bcc"), 1);
	free(subject);
	buf_free(&out);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_claims_of_our_id_dropped),
		cmocka_unit_test(test_space_before_colon),
		cmocka_unit_test(test_quoted_authserv_id),
		cmocka_unit_test(test_others_kept),
		cmocka_unit_test(test_space_before_colon_everywhere),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
