/*
 * test_message.c: pepsi-stage-milter's message edits (message.c) applied
 * the way Sendmail and Postfix apply them: headers added, inserted by
 * position, changed and deleted by occurrence, folds and the leading space
 * with and without SMFIP_HDR_LEADSPC, body chunks to CRLF, addresses.
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

static const char headers[] = "Received: from a\r\n\tby b\r\nSubject: one\r\nX-Tag: 1\r\nx-tag: 2\r\n";

static void
init(struct milter_message *m)
{
	const char *rcpt[] = {"a@example.org"};

	milter_message_init(m, headers, sizeof(headers) - 1, "body\r\n", 6, "s@example.net", rcpt, 1);
}

static void
assert_headers(const struct milter_message *m, const char *expected)
{
	struct buf out = BUF_INIT;

	milter_message_headers(m, &out);
	assert_string_equal(out.data ? out.data : "", expected);
	buf_free(&out);
}

static void
test_untouched_round_trip(void **state)
{
	struct milter_message m;

	init(&m);
	assert_int_equal(m.nheaders, 4);
	assert_string_equal(m.headers[0].value, " from a\r\n\tby b");
	assert_headers(&m, headers);
	assert_false(m.headers_changed);
	milter_message_free(&m);
}

static void
test_value_for_filter(void **state)
{
	char *v = milter_header_for_filter(" from a\r\n\tby b", false);

	assert_string_equal(v, "from a\n\tby b");
	free(v);
	v = milter_header_for_filter(" from a\r\n\tby b", true);
	assert_string_equal(v, " from a\n\tby b");
	free(v);
}

static void
test_header_edits(void **state)
{
	struct milter_message m;

	init(&m);
	milter_message_add_header(&m, "X-Spam", "yes\n\tscore 9", false);
	milter_message_insert_header(&m, 0, "X-Top", " lead", true);
	milter_message_change_header(&m, 2, "X-Tag", "two", false);
	milter_message_change_header(&m, 1, "Subject", "", false);
	milter_message_change_header(&m, 5, "X-Absent", "added", false);
	milter_message_change_header(&m, 1, "X-Never", "", false);
	milter_message_insert_header(&m, 1000, "X-Last", "end", false);
	assert_true(m.headers_changed);
	assert_headers(&m, "X-Top: lead\r\nReceived: from a\r\n\tby b\r\nX-Tag: 1\r\nx-tag: two\r\n"
					   "X-Spam: yes\r\n\tscore 9\r\nX-Absent: added\r\nX-Last: end\r\n");
	milter_message_free(&m);
}

static void
test_body_chunks(void **state)
{
	struct milter_message m;

	init(&m);
	milter_message_body_chunk(&m, "one\ntwo\r\n", 9, true);
	milter_message_body_chunk(&m, "\nthree", 6, false);
	assert_true(m.body_changed);
	assert_int_equal(m.body.len, strlen("one\r\ntwo\r\n\r\nthree"));
	assert_memory_equal(m.body.data, "one\r\ntwo\r\n\r\nthree", m.body.len);
	/* a CR at the end of one chunk and its LF in the next stay one line end */
	milter_message_body_chunk(&m, "a\r", 2, true);
	milter_message_body_chunk(&m, "\nb", 2, false);
	assert_memory_equal(m.body.data, "a\r\nb", 4);
	assert_int_equal(m.body.len, 4);
	milter_message_free(&m);
}

static void
test_addresses(void **state)
{
	struct milter_message m;

	init(&m);
	milter_message_change_from(&m, "<new@example.net>");
	assert_string_equal(m.mail_from, "new@example.net");
	milter_message_change_from(&m, "<>");
	assert_string_equal(m.mail_from, "");
	milter_message_add_rcpt(&m, "plain@example.org");
	assert_string_equal(m.added[0], "plain@example.org");
	milter_message_delete_rcpt(&m, "<a@example.org>");
	assert_string_equal(m.deleted[0], "a@example.org");
	milter_message_free(&m);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_untouched_round_trip),
		cmocka_unit_test(test_value_for_filter),
		cmocka_unit_test(test_header_edits),
		cmocka_unit_test(test_body_chunks),
		cmocka_unit_test(test_addresses),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
