/*
 * test_smtp_dsn.c: the pure pieces of the delivery path: SMTP reply lines,
 * dot-stuffing and xtext (smtp_client.c), and the layout of an RFC 3464
 * report (dsn.c).  The conversations themselves are tested against real
 * servers in t/050_delivery*.pl.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "message/dsn.h"
#include "smtp/smtp_client.h"

static void
test_reply_lines(void **state)
{
	int			code;
	bool		last;
	const char *text;

	assert_true(smtp_reply_parse_line("250-PIPELINING", 14, &code, &last, &text));
	assert_int_equal(code, 250);
	assert_false(last);
	assert_string_equal(text, "PIPELINING");
	assert_true(smtp_reply_parse_line("550 5.1.1 no such user", 22, &code, &last, &text));
	assert_int_equal(code, 550);
	assert_true(last);
	assert_string_equal(text, "5.1.1 no such user");
	assert_true(smtp_reply_parse_line("250", 3, &code, &last, &text));
	assert_true(last);
	assert_string_equal(text, "");
	/* Not replies: a bad first digit, letters, a missing separator. */
	assert_false(smtp_reply_parse_line("150 x", 5, &code, &last, &text));
	assert_false(smtp_reply_parse_line("25x ok", 6, &code, &last, &text));
	assert_false(smtp_reply_parse_line("250ok", 5, &code, &last, &text));
	assert_false(smtp_reply_parse_line("25", 2, &code, &last, &text));
}

static void
check_stuffed(const char *raw, const char *want)
{
	struct buf out = BUF_INIT;

	smtp_dot_stuff(raw, strlen(raw), &out);
	assert_string_equal(out.data, want);
	buf_free(&out);
}

static void
test_dot_stuffing(void **state)
{
	check_stuffed("Subject: x\r\n\r\n.hidden\r\n..two\r\nend\r\n",
				  "Subject: x\r\n\r\n..hidden\r\n...two\r\nend\r\n.\r\n");
	/* A last line without its end gets one; bare LF becomes CRLF. */
	check_stuffed("a\nb", "a\r\nb\r\n.\r\n");
	check_stuffed(".", "..\r\n.\r\n");
	check_stuffed("", ".\r\n");
	/* A dot inside a line is left alone. */
	check_stuffed("a.b\r\n", "a.b\r\n.\r\n");
	/* A bare CR never reaches the wire: smuggling a "." line behind it fails. */
	check_stuffed("a\r.\rb\r\n", "a\r\n..\r\nb\r\n.\r\n");
	check_stuffed("end\r", "end\r\n.\r\n");
}

/* The rule octet by octet (as smtp_dot_stuff once ran), for the line-at-a-time one to match. */
static void
reference_stuffed(const char *raw, size_t len, struct buf *out)
{
	bool line_start = true;

	for (size_t i = 0; i < len; i++)
	{
		char ch = raw[i];

		if (line_start && ch == '.')
			buf_append_char(out, '.');
		line_start = false;
		if (ch == '\r' && (i + 1 == len || raw[i + 1] != '\n'))
		{
			buf_append(out, "\r\n", 2);
			line_start = true;
			continue;
		}
		if (ch == '\n')
		{
			if (i == 0 || raw[i - 1] != '\r')
				buf_append_char(out, '\r');
			line_start = true;
		}
		buf_append_char(out, ch);
	}
	if (!line_start)
		buf_append(out, "\r\n", 2);
	buf_append(out, ".\r\n", 3);
}

static void
test_dot_stuffing_random(void **state)
{
	static const char octets[] = "a.\r\n\r\n.";
	unsigned		  seed = 5321;
	struct buf		  raw = BUF_INIT;
	struct buf		  want = BUF_INIT;
	struct buf		  got = BUF_INIT;

	for (int round = 0; round < 20000; round++)
	{
		size_t n = (size_t) (rand_r(&seed) % 48);

		buf_reset(&raw);
		buf_reset(&want);
		buf_reset(&got);
		for (size_t i = 0; i < n; i++)
			buf_append_char(&raw, octets[rand_r(&seed) % (sizeof(octets) - 1)]);
		reference_stuffed(raw.data ? raw.data : "", raw.len, &want);
		smtp_dot_stuff(raw.data ? raw.data : "", raw.len, &got);
		if (got.len != want.len || memcmp(got.data, want.data, got.len) != 0)
			fail_msg("dot-stuffing %zu octets gave %zu octets, the rule %zu", raw.len, got.len, want.len);
	}
	buf_free(&raw);
	buf_free(&want);
	buf_free(&got);
}

static void
test_xtext(void **state)
{
	struct buf out = BUF_INIT;

	smtp_xtext_encode("a+b=c d\xc3\xa9@x", &out);
	assert_string_equal(out.data, "a+2Bb+3Dc+20d+C3+A9@x");
	buf_free(&out);
}

static void
test_dsn_layout(void **state)
{
	struct dsn_recipient r = {
		.final_recipient = "gone@remote.test",
		.original_recipient = "rfc822;Gone@Remote.Test",
		.action = "failed",
		.status = "5.1.1",
		.remote_mta = "mx.remote.test",
		.diagnostic_code = "smtp; 550 5.1.1 no such user",
	};
	struct dsn_report report = {
		.kind = DSN_FAILURE,
		.reporting_mta = "mx.pepsi.test",
		.original_sender = "sender@local.test",
		.envid = "id+1",
		.now = 1796031614,
		.unique = "42",
		.return_full = true,
		.headers = "Subject: hi\r\n",
		.headers_len = 13,
		.body = "the body\r\n",
		.body_len = 10,
		.recipients = &r,
		.nrecipients = 1,
	};
	struct buf	headers = BUF_INIT;
	struct buf	body = BUF_INIT;
	const char *boundary;
	char		delimiter[128];

	dsn_build(&report, &headers, &body);
	assert_non_null(strstr(headers.data, "To: <sender@local.test>\r\n"));
	assert_non_null(strstr(headers.data, "Auto-Submitted: auto-replied\r\n"));
	assert_non_null(strstr(headers.data, "Date: Mon, 30 Nov 2026 "));
	assert_non_null(strstr(headers.data, "multipart/report; report-type=delivery-status;"));
	boundary = strstr(headers.data, "boundary=\"");
	assert_non_null(boundary);
	snprintf(delimiter, sizeof(delimiter), "--%.*s", (int) strcspn(boundary + 10, "\""), boundary + 10);
	/* Three parts and the closing delimiter. */
	{
		int parts = 0;

		for (const char *p = body.data; (p = strstr(p, delimiter)) != NULL; p++)
			parts++;
		assert_int_equal(parts, 4);
	}
	assert_non_null(strstr(body.data, "Content-Type: message/delivery-status\r\n\r\n"
									  "Reporting-MTA: dns; mx.pepsi.test\r\n"
									  "Original-Envelope-Id: id+2B1\r\n\r\n"
									  "Original-Recipient: rfc822; Gone@Remote.Test\r\n"
									  "Final-Recipient: rfc822; gone@remote.test\r\n"
									  "Action: failed\r\nStatus: 5.1.1\r\n"
									  "Remote-MTA: dns; mx.remote.test\r\n"
									  "Diagnostic-Code: smtp; 550 5.1.1 no such user\r\n"));
	assert_non_null(strstr(body.data, "Content-Type: message/rfc822\r\n\r\nSubject: hi\r\n\r\nthe body\r\n"));
	buf_free(&headers);
	buf_free(&body);

	/* Headers only, and no Content-Transfer-Encoding for 7-bit content. */
	report.kind = DSN_DELAY;
	report.return_full = false;
	r.action = "delayed";
	dsn_build(&report, &headers, &body);
	assert_non_null(strstr(body.data, "Content-Type: text/rfc822-headers\r\n\r\nSubject: hi\r\n"));
	assert_null(strstr(body.data, "the body"));
	assert_null(strstr(headers.data, "Content-Transfer-Encoding"));
	assert_non_null(strstr(headers.data, "Subject: Delayed Mail"));
	buf_free(&headers);
	buf_free(&body);
}

/* The boundary of a report: random, never the same twice, never in the content. */
static void
test_dsn_boundary_and_header_cap(void **state)
{
	struct dsn_recipient r = {.final_recipient = "gone@remote.test", .action = "failed", .status = "5.1.1"};
	struct dsn_report	 report = {
		   .kind = DSN_FAILURE,
		   .reporting_mta = "mx.pepsi.test",
		   .original_sender = "s@local.test",
		   .now = 1796031614,
		   .unique = "42",
		   .return_full = true,
		   .headers = "Subject: guess\r\n",
		   .headers_len = 16,
		   .body = "--=_pepsi_dsn_42_1796031614_0\r\nContent-Type: text/plain\r\n\r\nforged\r\n",
		   .body_len = 67,
		   .recipients = &r,
		   .nrecipients = 1,
	   };
	struct buf headers[2] = {BUF_INIT, BUF_INIT};
	struct buf body = BUF_INIT;
	char	   boundary[2][64];
	struct buf big = BUF_INIT;

	for (int i = 0; i < 2; i++)
	{
		const char *b;

		dsn_build(&report, &headers[i], &body);
		b = strstr(headers[i].data, "boundary=\"");
		assert_non_null(b);
		snprintf(boundary[i], sizeof(boundary[i]), "%.*s", (int) strcspn(b + 10, "\""), b + 10);
		/* "=_pepsi_dsn_" and 32 hex digits: nothing of the row or the time. */
		assert_int_equal(strlen(boundary[i]), 12 + 32);
		assert_int_equal(strncmp(boundary[i], "=_pepsi_dsn_", 12), 0);
		assert_int_equal(strspn(boundary[i] + 12, "0123456789abcdef"), 32);
		assert_null(strstr(boundary[i], "1796031614"));
		assert_null(memmem(report.body, report.body_len, boundary[i], strlen(boundary[i])));
		buf_free(&body);
	}
	assert_string_not_equal(boundary[0], boundary[1]);
	buf_free(&headers[0]);
	buf_free(&headers[1]);

	/* RET=HDRS of a message with 200 KB of headers returns 64 KB of whole fields. */
	for (int i = 0; big.len < 200 * 1024; i++)
		buf_printf(&big, "X-Filler-%d: %s\r\n\tfolded\r\n", i,
				   "0123456789012345678901234567890123456789012345678901234567890123456789");
	report.headers = big.data;
	report.headers_len = big.len;
	report.return_full = true;
	dsn_build(&report, &headers[0], &body);
	assert_true(body.len < DSN_RETURNED_HEADERS_MAX + 4096);
	assert_non_null(strstr(body.data, "Content-Type: text/rfc822-headers\r\n"));
	assert_null(strstr(body.data, "forged"));
	{
		/* The cut is at a field's end: the returned block ends "folded" CRLF. */
		const char *returned = strstr(body.data, "X-Filler-0:");
		const char *end = strstr(returned, "\r\n\r\n--=_pepsi_dsn_");

		assert_non_null(end);
		assert_true(end - returned <= DSN_RETURNED_HEADERS_MAX);
		assert_memory_equal(end - 7, "\tfolded", 7);
	}
	buf_free(&headers[0]);
	buf_free(&body);
	buf_free(&big);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_reply_lines),
		cmocka_unit_test(test_dot_stuffing),
		cmocka_unit_test(test_dot_stuffing_random),
		cmocka_unit_test(test_xtext),
		cmocka_unit_test(test_dsn_layout),
		cmocka_unit_test(test_dsn_boundary_and_header_cap),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
