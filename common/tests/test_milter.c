/*
 * test_milter.c: the milter protocol's packets (common/message/milter.c): the
 * encoders byte for byte against what libmilter reads, the framing at its
 * edges (partial, empty, oversize), every reply the parser takes and the
 * malformed ones it refuses, and the filter addresses of MILTERS.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "message/milter.h"

static void
assert_bytes(const struct buf *b, const char *expected, size_t len)
{
	assert_int_equal(b->len, len);
	assert_memory_equal(b->data, expected, len);
}

static void
test_encode_optneg(void **state)
{
	struct buf b = BUF_INIT;

	milter_encode_optneg(&b, MILTER_ACTIONS_ALL, MILTER_PROTO_OFFERED);
	assert_bytes(&b, "\0\0\0\x0dO\0\0\0\x06\0\0\x01\xff\0\x1f\xf7\xff", 17);
	buf_free(&b);
}

static void
test_encode_connect(void **state)
{
	struct buf b = BUF_INIT;

	milter_encode_connect(&b, "[192.0.2.1]", "192.0.2.1", 25);
	assert_bytes(&b, "\0\0\0\x1a"
					 "C[192.0.2.1]\0"
					 "4\0\x19"
					 "192.0.2.1\0",
				 30);
	buf_reset(&b);
	milter_encode_connect(&b, "[2001:db8::1]", "2001:db8::1", 0);
	assert_int_equal(b.data[4 + 1 + 14], '6');
	buf_reset(&b);
	milter_encode_connect(&b, "localhost", NULL, 0);
	assert_bytes(&b, "\0\0\0\x0c"
					 "Clocalhost\0U",
				 16);
	buf_free(&b);
}

static void
test_encode_strings_and_macros(void **state)
{
	struct buf	b = BUF_INIT;
	const char *mail[] = {"<a@b>", "BODY=8BITMIME"};
	const char *names[] = {"i", "{mail_addr}"};
	const char *values[] = {"42", "a@b"};

	milter_encode_strings(&b, MILTER_CMD_MAIL, mail, 2);
	assert_bytes(&b, "\0\0\0\x15M<a@b>\0BODY=8BITMIME\0", 25);
	buf_reset(&b);
	milter_encode_macros(&b, MILTER_CMD_MAIL, names, values, 2);
	assert_bytes(&b, "\0\0\0\x17"
					 "DMi\0"
					 "42\0"
					 "{mail_addr}\0"
					 "a@b\0",
				 27);
	buf_reset(&b);
	milter_encode(&b, MILTER_CMD_EOM, NULL, 0);
	assert_bytes(&b, "\0\0\0\x01"
					 "E",
				 5);
	buf_free(&b);
}

static void
test_frame(void **state)
{
	char		command;
	const char *payload;
	size_t		len;
	size_t		consumed;
	char		err[256];

	assert_int_equal(milter_frame("\0\0", 2, 100, &command, &payload, &len, &consumed, err, sizeof(err)),
					 MILTER_FRAME_NEED_MORE);
	assert_int_equal(milter_frame("\0\0\0\x03hx", 6, 100, &command, &payload, &len, &consumed, err,
								  sizeof(err)),
					 MILTER_FRAME_NEED_MORE);
	assert_int_equal(milter_frame("\0\0\0\x02hxrest", 10, 100, &command, &payload, &len, &consumed,
								  err, sizeof(err)),
					 MILTER_FRAME_OK);
	assert_int_equal(command, 'h');
	assert_int_equal(len, 1);
	assert_int_equal(consumed, 6);
	assert_int_equal(milter_frame("\0\0\0\0", 4, 100, &command, &payload, &len, &consumed, err,
								  sizeof(err)),
					 MILTER_FRAME_ERROR);
	assert_non_null(strstr(err, "empty packet"));
	assert_int_equal(milter_frame("\x7f\xff\xff\xff", 4, 100, &command, &payload, &len, &consumed,
								  err, sizeof(err)),
					 MILTER_FRAME_ERROR);
	assert_non_null(strstr(err, "2147483647 bytes"));
}

static bool
parse(char command, const char *payload, size_t len, struct milter_reply *r)
{
	char err[256];

	return milter_parse_reply(command, payload, len, r, err, sizeof(err));
}

static void
test_parse_valid(void **state)
{
	struct milter_reply r;

	assert_true(parse('y', "550 5.7.1 spam\0", 15, &r));
	assert_int_equal(r.code, 550);
	assert_string_equal(r.text, "550 5.7.1 spam");
	assert_true(parse('y', "451-4.7.1 one\r\n451 4.7.1 two\0", 29, &r));
	assert_int_equal(r.code, 451);
	assert_true(parse('h', "X-Spam\0yes\0", 11, &r));
	assert_string_equal(r.name, "X-Spam");
	assert_string_equal(r.value, "yes");
	assert_true(parse('m', "\0\0\0\x02Subject\0a\n\tb\0", 17, &r));
	assert_int_equal(r.index, 2);
	assert_string_equal(r.value, "a\n\tb");
	assert_true(parse('i', "\0\0\0\0X\0\0", 7, &r));
	assert_true(parse('e', "<n@x>\0SIZE=1\0", 13, &r));
	assert_string_equal(r.args, "SIZE=1");
	assert_true(parse('e', "<n@x>\0", 6, &r));
	assert_null(r.args);
	assert_true(parse('+', "<a@x>\0", 6, &r));
	assert_true(parse('q', "held\0", 5, &r));
	assert_true(parse('b', "any\0bytes", 9, &r));
	assert_int_equal(r.data_len, 9);
	assert_true(parse('c', "", 0, &r));
	assert_true(parse('O', "\0\0\0\x06\0\0\0\x01\0\0\0\x02\0\0\0\x05i j\0", 20, &r));
	assert_int_equal(r.version, 6);
	assert_int_equal(r.actions, 1);
	assert_int_equal(r.protocol, 2);
	assert_string_equal(r.macros[MILTER_MACROS_EOM], "i j");
	assert_null(r.macros[MILTER_MACROS_CONNECT]);
}

static void
test_parse_malformed(void **state)
{
	struct milter_reply r;

	assert_false(parse('y', "550 no nul", 10, &r));
	assert_false(parse('y', "250 ok\0", 7, &r)); /* not a refusal */
	assert_false(parse('y', "55 x\0", 5, &r));
	assert_false(parse('y', "550 x\0extra", 11, &r));
	assert_false(parse('y', "550 a\n250 b\0", 12, &r)); /* a line that is not the same reply */
	assert_false(parse('h', "X-Spam\0yes", 10, &r));
	assert_false(parse('h', "Bad Name\0v\0", 11, &r));
	assert_false(parse('h', "X:y\0v\0", 6, &r));
	assert_false(parse('h', "\0v\0", 3, &r));
	assert_false(parse('h', "X\0a\nb\0", 6, &r)); /* a line break that is not a fold */
	assert_false(parse('h', "X\0a\rb\0", 6, &r));
	assert_false(parse('m', "\0\0\0", 3, &r));
	assert_false(parse('+', "\0", 1, &r));
	assert_false(parse('+', "<a@x>\r\n\0", 8, &r));
	assert_false(parse('e', "<a@x>\0args", 10, &r));
	assert_false(parse('q', "two\nlines\0", 10, &r));
	assert_false(parse('c', "x", 1, &r));
	assert_false(parse('O', "\0\0\0\x06\0\0", 6, &r));
	assert_false(parse('O', "\0\0\0\x06\0\0\0\x01\0\0\0\x02\0\0\0\x09i\0", 18, &r)); /* no such stage */
	assert_false(parse('O', "\0\0\0\x06\0\0\0\x01\0\0\0\x02\0\0\0\x01i", 17, &r));
	assert_false(parse('Z', "", 0, &r));
}

static void
test_addresses(void **state)
{
	struct milter_address a;
	char				  err[256];

	assert_true(milter_parse_address("inet:127.0.0.1:11332", &a, err, sizeof(err)));
	assert_int_equal(a.family, MILTER_ADDRESS_INET);
	assert_string_equal(a.host, "127.0.0.1");
	assert_string_equal(a.port, "11332");
	milter_address_free(&a);
	assert_true(milter_parse_address("inet6:[::1]:8891", &a, err, sizeof(err)));
	assert_string_equal(a.host, "::1");
	milter_address_free(&a);
	assert_true(milter_parse_address("unix:/run/spamass.sock", &a, err, sizeof(err)));
	assert_int_equal(a.family, MILTER_ADDRESS_UNIX);
	assert_string_equal(a.path, "/run/spamass.sock");
	milter_address_free(&a);
	assert_false(milter_parse_address("unix:relative", &a, err, sizeof(err)));
	assert_false(milter_parse_address("inet:host", &a, err, sizeof(err)));
	assert_false(milter_parse_address("inet:host:0", &a, err, sizeof(err)));
	assert_false(milter_parse_address("inet:host:99999", &a, err, sizeof(err)));
	assert_false(milter_parse_address("inet:host:12x", &a, err, sizeof(err)));
	assert_false(milter_parse_address("tcp:host:25", &a, err, sizeof(err)));
	assert_non_null(strstr(err, "tcp:host:25"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_encode_optneg),
		cmocka_unit_test(test_encode_connect),
		cmocka_unit_test(test_encode_strings_and_macros),
		cmocka_unit_test(test_frame),
		cmocka_unit_test(test_parse_valid),
		cmocka_unit_test(test_parse_malformed),
		cmocka_unit_test(test_addresses),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
