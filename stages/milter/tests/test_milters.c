/*
 * test_milters.c: the MILTERS option (common/message/milter_list.c): plain addresses, the
 * Postfix-style braces with per-filter settings read through the option
 * schema, and a clear error for each malformed value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "milter_stage.h"

static void
test_plain_addresses(void **state)
{
	struct milter_entry *e;
	size_t				 n;
	char				 err[512];

	(void) state;
	assert_true(milters_parse(" inet:127.0.0.1:11332, unix:/run/spamass.sock\tinet:[::1]:8891 ", &e, &n,
							  err, sizeof(err)));
	assert_int_equal(n, 3);
	assert_string_equal(e[0].address, "inet:127.0.0.1:11332");
	assert_string_equal(e[1].address, "unix:/run/spamass.sock");
	assert_string_equal(e[2].address, "inet:[::1]:8891");
	for (size_t i = 0; i < n; i++)
	{
		assert_int_equal(e[i].connect_ms, -1);
		assert_int_equal(e[i].command_ms, -1);
		assert_int_equal(e[i].final_ms, -1);
		assert_int_equal(e[i].default_action, -1);
	}
	milters_free(e, n);
}

static void
test_postfix_braces(void **state)
{
	struct milter_entry *e;
	size_t				 n;
	char				 err[512];

	(void) state;
	assert_true(milters_parse("inet:127.0.0.1:11332 { inet:127.0.0.1:8891, connect_timeout=10s, "
							  "command_timeout = 2500ms,content_timeout=2m, default_action=accept } "
							  "{unix:/run/clamav.sock default_action=tempfail}",
							  &e, &n, err, sizeof(err)));
	assert_int_equal(n, 3);
	assert_string_equal(e[0].address, "inet:127.0.0.1:11332");
	assert_int_equal(e[0].connect_ms, -1);
	assert_string_equal(e[1].address, "inet:127.0.0.1:8891");
	assert_int_equal(e[1].connect_ms, 10000);
	assert_int_equal(e[1].command_ms, 2500);
	assert_int_equal(e[1].final_ms, 120000);
	assert_int_equal(e[1].default_action, 1); /* tempfail|accept */
	assert_string_equal(e[2].address, "unix:/run/clamav.sock");
	assert_int_equal(e[2].default_action, 0);
	assert_int_equal(e[2].final_ms, -1);
	milters_free(e, n);

	assert_true(milters_parse("{ inet:127.0.0.1:8891, final_timeout=30s }", &e, &n, err, sizeof(err)));
	assert_int_equal(n, 1);
	assert_int_equal(e[0].final_ms, 30000);
	milters_free(e, n);
}

/* Each malformed value is refused with a sentence naming the problem. */
static void
test_errors(void **state)
{
	static const struct
	{
		const char *value;
		const char *says;
	} cases[] = {
		{"", "names no filter"},
		{" , ", "names no filter"},
		{"{ inet:127.0.0.1:1, connect_timeout=10s", "without its \"}\""},
		{"inet:127.0.0.1:1 }", "without its \"{\""},
		{"{ inet:127.0.0.1:1 { unix:/x } }", "without its \"}\""},
		{"{ }", "names no filter"},
		{"{ connect_timeout=10s }", "must begin with the filter's address"},
		{"{ inet:127.0.0.1:1, protocol=6 }", "unknown setting \"protocol\""},
		{"{ inet:127.0.0.1:1, connect_timeout }", "is not a setting"},
		{"{ inet:127.0.0.1:1, connect_timeout= }", "is not a setting"},
		{"{ inet:127.0.0.1:1, connect_timeout=soon }", "connect_timeout=soon for inet:127.0.0.1:1"},
		{"{ inet:127.0.0.1:1, command_timeout=0 }", "command_timeout=0"},
		{"{ inet:127.0.0.1:1, default_action=reject }", "default_action=reject"},
		{"{ inet:127.0.0.1:1, final_timeout=1m, content_timeout=2m }", "FINAL_TIMEOUT is given twice"},
	};

	(void) state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
	{
		struct milter_entry *e = (struct milter_entry *) 1;
		size_t				 n = 99;
		char				 err[512] = "";

		if (milters_parse(cases[i].value, &e, &n, err, sizeof(err)))
			fail_msg("\"%s\" was accepted", cases[i].value);
		if (strstr(err, cases[i].says) == NULL)
			fail_msg("\"%s\": the error \"%s\" does not say \"%s\"", cases[i].value, err, cases[i].says);
		assert_null(e);
		assert_int_equal(n, 0);
	}
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_addresses),
		cmocka_unit_test(test_postfix_braces),
		cmocka_unit_test(test_errors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
