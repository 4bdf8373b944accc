/*
 * test_mime_text.c: the text a reader sees of a message
 * (common/message/mime.c mime_text): transfer encodings undone, charsets
 * made UTF-8, attachments and markup left out, text/html only when there
 * is no text/plain, and the limit cut at a character's start.
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
#include "message/mime.h"

/* The text of raw, NUL-terminated (free it). */
static char *
text_of(const char *raw, size_t max, size_t *parts)
{
	struct buf out = BUF_INIT;
	size_t	   n = mime_text(raw, strlen(raw), max, &out);

	if (parts)
		*parts = n;
	buf_append_char(&out, '\0');
	return out.data;
}

static void
test_plain_8bit(void **state)
{
	size_t parts;
	char  *text = text_of("Subject: x\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nGr\xC3\xBC\xC3\x9F"
						   "e\r\n",
						  0, &parts);

	assert_int_equal(parts, 1);
	assert_string_equal(text, "Gr\xC3\xBC\xC3\x9F"
							  "e\r\n");
	free(text);
}

static void
test_quoted_printable_latin1(void **state)
{
	/* A soft break (with the whitespace a hop added), =FC in Latin-1, a stray "=" kept. */
	char *text = text_of("Content-Type: text/plain; charset=\"ISO-8859-1\"\r\n"
						 "Content-Transfer-Encoding: Quoted-Printable\r\n\r\n"
						 "Gr=FC=DFe aus M=  \r\nnchen =ZZ\r\n",
						 0, NULL);

	assert_string_equal(text, "Gr\xC3\xBC\xC3\x9F"
							  "e aus Mnchen =ZZ\r\n");
	free(text);
}

static void
test_base64_koi8r(void **state)
{
	/* "привет" in KOI8-R, base64 over two lines. */
	char *text = text_of("Content-Type: text/plain; charset=koi8-r\r\nContent-Transfer-Encoding: base64\r\n\r\n"
						 "0NLJ\r\n18XU\r\n",
						 0, NULL);

	assert_string_equal(text, "\xD0\xBF\xD1\x80\xD0\xB8\xD0\xB2\xD0\xB5\xD1\x82");
	free(text);
}

static void
test_unlabelled_8bit_is_windows_1252(void **state)
{
	char *text = text_of("Subject: x\r\n\r\nd\xE9j\xE0 \x80\r\n", 0, NULL);

	assert_string_equal(text, "d\xC3\xA9j\xC3\xA0 \xE2\x82\xAC\r\n");
	free(text);
}

static void
test_multipart_plain_not_attachment(void **state)
{
	size_t parts;
	char  *text = text_of("Content-Type: multipart/mixed; boundary=\"o\"\r\n\r\n"
						   "preamble\r\n--o\r\nContent-Type: multipart/alternative; boundary=i\r\n\r\n"
						   "--i\r\nContent-Type: text/plain\r\n\r\none\r\n"
						   "--i\r\nContent-Type: text/html\r\n\r\n<p>html</p>\r\n--i--\r\n"
						   "--o\r\nContent-Type: text/plain\r\nContent-Disposition: attachment; filename=a.txt\r\n\r\n"
						   "attached\r\n--o\r\nContent-Type: message/rfc822\r\n\r\n"
						   "Subject: inner\r\nContent-Type: text/plain\r\n\r\ntwo\r\n--o--\r\nepilogue\r\n",
						  0, &parts);

	assert_int_equal(parts, 2);
	assert_string_equal(text, "one\n\ntwo");
	free(text);
}

static void
test_html_only(void **state)
{
	char *text = text_of("Content-Type: text/html; charset=utf-8\r\n\r\n"
						 "<html><head><style>p { x: y }</style><script>var a = 1 < 2;</script></head>"
						 "<body><!-- note --><p>caf&eacute; &amp; th&#233; &#x263A;&nbsp;!</p></body></html>",
						 0, NULL);

	/* Tags become spaces; an unknown entity stays as written. */
	assert_string_equal(text, "        caf&eacute; & th\xC3\xA9 \xE2\x98\xBA !   ");
	free(text);
}

static void
test_limit_cuts_at_a_character(void **state)
{
	/* "ééé" is six bytes: a limit of 3 keeps one é, never half of one. */
	char *text = text_of("Content-Type: text/plain; charset=utf-8\r\n\r\n\xC3\xA9\xC3\xA9\xC3\xA9", 3, NULL);

	assert_string_equal(text, "\xC3\xA9");
	free(text);
}

static void
test_unknown_charset_and_no_text(void **state)
{
	size_t parts;
	char  *text = text_of("Content-Type: text/plain; charset=x-no-such-charset\r\n\r\nwords\r\n", 0, &parts);

	assert_int_equal(parts, 0);
	assert_string_equal(text, "");
	free(text);
	text = text_of("Content-Type: image/png\r\nContent-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n", 0, &parts);
	assert_int_equal(parts, 0);
	free(text);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plain_8bit),
		cmocka_unit_test(test_quoted_printable_latin1),
		cmocka_unit_test(test_base64_koi8r),
		cmocka_unit_test(test_unlabelled_8bit_is_windows_1252),
		cmocka_unit_test(test_multipart_plain_not_attachment),
		cmocka_unit_test(test_html_only),
		cmocka_unit_test(test_limit_cuts_at_a_character),
		cmocka_unit_test(test_unknown_charset_and_no_text),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
