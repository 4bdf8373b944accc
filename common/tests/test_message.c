/*
 * test_message.c: the header/body split the queue stores messages by
 * (raw = headers || CRLF || body), for CRLF and bare-LF input, and the
 * shapes at its edges: no blank line, no headers, blank lines in the body.
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
#include "message/message.h"

struct split
{
	struct buf headers;
	struct buf body;
};

static void
split(const char *raw, struct split *s)
{
	memset(s, 0, sizeof(*s));
	message_split(raw, strlen(raw), &s->headers, &s->body);
}

static void
split_free(struct split *s)
{
	buf_free(&s->headers);
	buf_free(&s->body);
}

/* Compare with the byte counts too: a string may hold what strcmp stops at. */
static void
assert_buf_equal(const struct buf *b, const char *want)
{
	size_t len = strlen(want);

	if (b->len != len || (len > 0 && memcmp(b->data, want, len) != 0))
		fail_msg("got %zu bytes \"%.*s\", want %zu bytes \"%s\"", b->len, (int) b->len,
				 b->data ? b->data : "", len, want);
}

/* The invariant: joining the parts gives back exactly the CRLF message. */
static void
assert_joins_to(const struct split *s, const char *raw)
{
	struct buf joined = BUF_INIT;

	message_join(s->headers.data ? s->headers.data : "", s->headers.len,
				 s->body.data ? s->body.data : "", s->body.len, &joined);
	assert_buf_equal(&joined, raw);
	buf_free(&joined);
}

/* Every line end in b is CRLF. */
static void
assert_crlf_only(const struct buf *b)
{
	for (size_t i = 0; i < b->len; i++)
		if (b->data[i] == '\n' && (i == 0 || b->data[i - 1] != '\r'))
			fail_msg("bare LF at byte %zu of \"%.*s\"", i, (int) b->len, b->data);
}

static void
test_crlf_message(void **state)
{
	const char	*raw = "From: a@example.org\r\nTo: b@example.net\r\nSubject: hi\r\n\r\nHello.\r\nBye.\r\n";
	struct split s;

	split(raw, &s);
	assert_buf_equal(&s.headers, "From: a@example.org\r\nTo: b@example.net\r\nSubject: hi\r\n");
	assert_buf_equal(&s.body, "Hello.\r\nBye.\r\n");
	assert_joins_to(&s, raw);
	split_free(&s);
}

/* A folded header (continuation line) stays in the headers. */
static void
test_folded_header(void **state)
{
	const char	*raw = "Subject: a long\r\n\tsubject\r\nX: y\r\n\r\nbody";
	struct split s;

	split(raw, &s);
	assert_buf_equal(&s.headers, "Subject: a long\r\n\tsubject\r\nX: y\r\n");
	assert_buf_equal(&s.body, "body");
	assert_joins_to(&s, raw);
	split_free(&s);
}

static void
test_bare_lf_normalised(void **state)
{
	struct split s;

	split("From: a@example.org\nSubject: hi\n\nline one\n\nline three\n", &s);
	assert_buf_equal(&s.headers, "From: a@example.org\r\nSubject: hi\r\n");
	assert_buf_equal(&s.body, "line one\r\n\r\nline three\r\n");
	assert_crlf_only(&s.headers);
	assert_crlf_only(&s.body);
	assert_joins_to(&s, "From: a@example.org\r\nSubject: hi\r\n\r\nline one\r\n\r\nline three\r\n");
	split_free(&s);
}

/* Mixed line ends: each bare LF becomes CRLF, an existing CRLF is not doubled. */
static void
test_mixed_line_ends(void **state)
{
	struct split s;

	split("A: 1\r\nB: 2\n\r\nx\ny\r\n", &s);
	assert_buf_equal(&s.headers, "A: 1\r\nB: 2\r\n");
	assert_buf_equal(&s.body, "x\r\ny\r\n");
	split_free(&s);

	/* The blank line itself may be a bare LF after CRLF headers. */
	split("A: 1\r\n\nbody\r\n", &s);
	assert_buf_equal(&s.headers, "A: 1\r\n");
	assert_buf_equal(&s.body, "body\r\n");
	split_free(&s);
}

/* No blank line: the whole message is headers and the body is empty. */
static void
test_no_blank_line(void **state)
{
	struct split s;

	split("From: a@example.org\r\nSubject: no body\r\n", &s);
	assert_buf_equal(&s.headers, "From: a@example.org\r\nSubject: no body\r\n");
	assert_buf_equal(&s.body, "");
	assert_joins_to(&s, "From: a@example.org\r\nSubject: no body\r\n\r\n");
	split_free(&s);

	/* Nor a final line end: the headers still end with one, so a header appended later stays a line of its own. */
	split("From: a@example.org\nSubject: cut", &s);
	assert_buf_equal(&s.headers, "From: a@example.org\r\nSubject: cut\r\n");
	assert_buf_equal(&s.body, "");
	split_free(&s);
}

/* A message that starts with the blank line has empty headers. */
static void
test_empty_headers(void **state)
{
	struct split s;

	split("\r\nonly a body\r\n", &s);
	assert_buf_equal(&s.headers, "");
	assert_buf_equal(&s.body, "only a body\r\n");
	assert_joins_to(&s, "\r\nonly a body\r\n");
	split_free(&s);

	split("\nbare\n", &s);
	assert_buf_equal(&s.headers, "");
	assert_buf_equal(&s.body, "bare\r\n");
	split_free(&s);

	/* The empty message. */
	split("", &s);
	assert_buf_equal(&s.headers, "");
	assert_buf_equal(&s.body, "");
	split_free(&s);
}

/* The split is at the first blank line; later blank lines belong to the body. */
static void
test_body_with_blank_lines(void **state)
{
	const char	*raw = "Subject: x\r\n\r\n\r\npara one\r\n\r\n\r\npara two\r\n\r\n";
	struct split s;

	split(raw, &s);
	assert_buf_equal(&s.headers, "Subject: x\r\n");
	assert_buf_equal(&s.body, "\r\npara one\r\n\r\n\r\npara two\r\n\r\n");
	assert_joins_to(&s, raw);
	split_free(&s);
}

/* A line of white space is not the blank line (it is a header continuation). */
static void
test_whitespace_line_is_not_blank(void **state)
{
	const char	*raw = "A: 1\r\n \r\nB: 2\r\n\r\nbody";
	struct split s;

	split(raw, &s);
	assert_buf_equal(&s.headers, "A: 1\r\n \r\nB: 2\r\n");
	assert_buf_equal(&s.body, "body");
	assert_joins_to(&s, raw);
	split_free(&s);
}

/* Bytes that are not text (8-bit, NUL) pass through untouched. */
static void
test_binary_bytes(void **state)
{
	const char raw[] = "A: \xc3\xa9\r\n\r\n\x00\xff\r\n";
	struct buf headers = BUF_INIT;
	struct buf body = BUF_INIT;

	message_split(raw, sizeof(raw) - 1, &headers, &body);
	assert_int_equal(headers.len, 7);
	assert_memory_equal(headers.data, "A: \xc3\xa9\r\n", 7);
	assert_int_equal(body.len, 4);
	assert_memory_equal(body.data, "\x00\xff\r\n", 4);
	buf_free(&headers);
	buf_free(&body);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crlf_message),
		cmocka_unit_test(test_folded_header),
		cmocka_unit_test(test_bare_lf_normalised),
		cmocka_unit_test(test_mixed_line_ends),
		cmocka_unit_test(test_no_blank_line),
		cmocka_unit_test(test_empty_headers),
		cmocka_unit_test(test_body_with_blank_lines),
		cmocka_unit_test(test_whitespace_line_is_not_blank),
		cmocka_unit_test(test_binary_bytes),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
