/*
 * test_smtp_syntax.c: the validators and decoders of smtp_syntax.c against
 * the vectors in data/ (one case per line): mailboxes with and without
 * SMTPUTF8, UTF-8 well-formedness, and the base64 of AUTH (common/base/base64.c
 * read strictly, as smtp.c reads an AUTH response).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "tests/data_cases.h"

#include "base/base64.h"
#include "smtp_syntax.h"

static bool
expect_valid(const struct data_case *c)
{
	const char *expect = data_case_field(c, 0);

	if (strcmp(expect, "valid") != 0 && strcmp(expect, "invalid") != 0)
		fail_msg("%s: expect \"valid\" or \"invalid\", not \"%s\"", c->name, expect);
	return strcmp(expect, "valid") == 0;
}

static void
test_mailbox(void **state)
{
	const struct data_case *c = *state;
	bool					want = expect_valid(c);
	const char			   *mode = data_case_field(c, 1);
	const char			   *mailbox = data_case_field(c, 2);

	if (strcmp(mode, "ascii") != 0 && strcmp(mode, "utf8") != 0)
		fail_msg("%s: mode \"ascii\" or \"utf8\", not \"%s\"", c->name, mode);
	if (smtp_mailbox_valid(mailbox, strcmp(mode, "utf8") == 0) != want)
		fail_msg("%s: \"%s\" (%s) should be %s", c->name, mailbox, mode, want ? "valid" : "invalid");
}

static void
test_utf8(void **state)
{
	const struct data_case *c = *state;
	bool					want = expect_valid(c);
	const char			   *text = c->nfields > 1 ? c->field[1] : "";
	size_t					len = c->nfields > 1 ? c->len[1] : 0;

	if (smtp_utf8_valid(text, len) != want)
		fail_msg("%s: should be %s", c->name, want ? "valid" : "invalid");
}

static void
test_base64(void **state)
{
	const struct data_case *c = *state;
	const char			   *in = data_case_field(c, 0);
	const char			   *want = data_case_field(c, 1);
	bool					refused = strcmp(want, "-") == 0;
	unsigned char			out[64];
	long					n;

	n = base64_decode(in, c->len[0], out, refused ? sizeof(out) : c->len[1], BASE64_STRICT);
	if (refused)
	{
		if (n != -1)
			fail_msg("%s: \"%s\" decoded (%ld octets) but should be refused", c->name, in, n);
		return;
	}
	if (n != (long) c->len[1] || memcmp(out, want, c->len[1]) != 0)
		fail_msg("%s: \"%s\" decoded to %ld octets, want %zu", c->name, in, n, c->len[1]);
	/* One octet less room than the result needs is a refusal, not an overflow. */
	if (c->len[1] > 0 && base64_decode(in, c->len[0], out, c->len[1] - 1, BASE64_STRICT) != -1)
		fail_msg("%s: \"%s\" decoded into too small a buffer", c->name, in);
}

int
main(void)
{
	struct
	{
		const char		  *file;
		CMUnitTestFunction fn;
	} suites[] = {
		{"mailbox.txt", test_mailbox},
		{"utf8.txt", test_utf8},
		{"base64.txt", test_base64},
	};
	int failed = 0;

	for (size_t i = 0; i < sizeof(suites) / sizeof(suites[0]); i++)
	{
		size_t			  count;
		struct data_case *cases = data_cases_load(__FILE__, suites[i].file, &count);

		failed += data_cases_run(suites[i].file, cases, count, suites[i].fn);
	}
	return failed;
}
