/* message.c: see message.h. */
#include "message/message.h"

#include <string.h>

/* Append text to out with every line end as CRLF (bare LF becomes CRLF). */
static void
message_append_crlf(struct buf *out, const char *text, size_t len)
{
	size_t start = 0;

	buf_reserve(out, len);
	for (const char *lf = memchr(text, '\n', len); lf; lf = memchr(lf + 1, '\n', len - (size_t) (lf + 1 - text)))
	{
		size_t i = (size_t) (lf - text);

		if (i > 0 && text[i - 1] == '\r')
			continue;
		buf_append(out, text + start, i - start);
		buf_append(out, "\r\n", 2);
		start = i + 1;
	}
	buf_append(out, text + start, len - start);
}

void
message_split(const char *raw, size_t len, struct buf *headers, struct buf *body)
{
	size_t pos = 0;

	/* Walk lines until an empty one; each header line keeps its line end. */
	while (pos < len)
	{
		const char *nl = memchr(raw + pos, '\n', len - pos);
		size_t		line_end = nl ? (size_t) (nl - raw) + 1 : len;
		size_t		content = line_end - pos - (nl ? 1 : 0);

		if (content > 0 && raw[pos + content - 1] == '\r')
			content--;
		if (content == 0 && nl)
		{
			/* The empty line: what follows is the body. */
			message_append_crlf(headers, raw, pos);
			message_append_crlf(body, raw + line_end, len - line_end);
			return;
		}
		pos = line_end;
	}
	/*
	 * No empty line: all headers, no body.  A last line without its line
	 * end gets one, so that a header a stage appends stays a line of its own.
	 */
	message_append_crlf(headers, raw, len);
	if (len > 0 && raw[len - 1] == '\r')
		buf_append_char(headers, '\n');
	else if (len > 0 && raw[len - 1] != '\n')
		buf_append(headers, "\r\n", 2);
}

void
message_join(const char *headers, size_t hlen, const char *body, size_t blen, struct buf *raw)
{
	buf_append(raw, headers, hlen);
	buf_append(raw, "\r\n", 2);
	buf_append(raw, body, blen);
}

bool
message_has_8bit(const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) s[i] >= 0x80)
			return true;
	return false;
}
