/*
 * test_mime_downgrade.c: what the MIME downgrade (common/message/mime_downgrade.c)
 * makes of a multipart message must fit the hop it was made for: the
 * parts re-encoded, and what follows a boundary on its delimiter line
 * (padding, or text after the closing delimiter) dropped when the hop
 * could not take it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "base/buf.h"
#include "message/mime_downgrade.h"

#define MULTIPART_HEAD                             \
	"From: a@example.org\r\nMIME-Version: 1.0\r\n" \
	"Content-Type: multipart/mixed; boundary=x\r\n\r\n"

static void
downgrade(const char *raw, size_t len, enum mime_downgrade_target target, struct buf *out)
{
	char why[256] = "";

	assert_int_equal(mime_downgrade(raw, len, target, out, why, sizeof(why)), MIME_DOWNGRADE_DONE);
	assert_false(mime_needs_downgrade(out->data, out->len, target));
}

static bool
contains(const struct buf *b, const char *s)
{
	return memmem(b->data, b->len, s, strlen(s)) != NULL;
}

/* The parts are encoded; the delimiters stay. */
static void
test_multipart_parts_encoded(void **state)
{
	static const char raw[] = MULTIPART_HEAD "--x\r\nContent-Type: text/plain\r\n\r\ncaf\xc3\xa9\r\n"
											 "--x\r\nContent-Type: application/octet-stream\r\n\r\n\xff\xfe\r\n"
											 "--x--\r\n";
	struct buf		  out = BUF_INIT;

	downgrade(raw, sizeof(raw) - 1, MIME_TO_7BIT, &out);
	assert_true(contains(&out, "caf=C3=A9"));
	assert_true(contains(&out, "\r\n--x\r\n"));
	assert_true(contains(&out, "\r\n--x--\r\n"));
	buf_free(&out);
}

/* A bare CR after the closing delimiter, the last line (found by fuzz_mime). */
static void
test_closing_delimiter_bare_cr(void **state)
{
	static const char raw[] = MULTIPART_HEAD "--x\r\nContent-Type: image/png\r\n"
											 "Content-Transfer-Encoding: binary\r\n\r\n\x89PNG\r\n\x1a\n\x00\x00\r\n"
											 "--x--\rT";
	struct buf		  out = BUF_INIT;

	downgrade(raw, sizeof(raw) - 1, MIME_TO_8BIT, &out);
	assert_true(contains(&out, "\r\n--x--\r\n"));
	buf_free(&out);
}

/* 8-bit padding after a boundary, for a 7-bit hop. */
static void
test_delimiter_padding_8bit(void **state)
{
	static const char raw[] = MULTIPART_HEAD "--x \xe9\r\nContent-Type: text/plain\r\n\r\nplain\r\n"
											 "--x--\xe9\r\n";
	struct buf		  out = BUF_INIT;

	downgrade(raw, sizeof(raw) - 1, MIME_TO_7BIT, &out);
	assert_true(contains(&out, "\r\n\r\n--x\r\nContent-Type: text/plain"));
	assert_true(contains(&out, "plain\r\n--x--\r\n"));
	buf_free(&out);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_multipart_parts_encoded),
		cmocka_unit_test(test_closing_delimiter_bare_cr),
		cmocka_unit_test(test_delimiter_padding_8bit),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
