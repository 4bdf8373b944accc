/* mime_downgrade.c: see mime_downgrade.h. */
#include "message/mime_downgrade.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base64.h"
#include "base/xalloc.h"
#include "message/header.h"
#include "message/message.h"
#include "message/mime.h"

/* RFC 2045 6.7 (5): encoded lines of at most 76 characters. */
#define MIME_LINE_MAX 76

bool
mime_has_binary(const char *s, size_t len)
{
	if (memchr(s, '\0', len) != NULL)
		return true;
	for (const char *p = memchr(s, '\r', len); p; p = memchr(p + 1, '\r', len - (size_t) (p + 1 - s)))
		if (p + 1 == s + len || p[1] != '\n')
			return true;
	return false;
}

static bool
mime_unfit(const char *s, size_t len, enum mime_downgrade_target target)
{
	return mime_has_binary(s, len) || (target == MIME_TO_7BIT && message_has_8bit(s, len));
}

bool
mime_needs_downgrade(const char *raw, size_t len, enum mime_downgrade_target target)
{
	return mime_unfit(raw, len, target);
}

void
mime_encode_quoted_printable(const char *in, size_t len, struct buf *out)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t			  column = 0;

	buf_reserve(out, len + len / 8 + 8);
	for (size_t i = 0; i < len; i++)
	{
		unsigned char ch = (unsigned char) in[i];
		bool		  line_end_next;
		char		  token[3];
		size_t		  n;

		if (ch == '\n' || (ch == '\r' && i + 1 < len && in[i + 1] == '\n'))
		{
			if (ch == '\r')
				i++;
			buf_append(out, "\r\n", 2);
			column = 0;
			continue;
		}
		/* Whitespace before a line end would be lost in transit (6.7 (3)). */
		line_end_next = i + 1 == len || in[i + 1] == '\n'
						|| (in[i + 1] == '\r' && i + 2 < len && in[i + 2] == '\n');
		if ((ch >= 33 && ch <= 126 && ch != '=') || ((ch == ' ' || ch == '\t') && !line_end_next))
		{
			token[0] = (char) ch;
			n = 1;
		}
		else
		{
			token[0] = '=';
			token[1] = hex[ch >> 4];
			token[2] = hex[ch & 15];
			n = 3;
		}
		/* Room for the token and a soft break's "=" (6.7 (5)). */
		if (column + n > MIME_LINE_MAX - 1)
		{
			buf_append(out, "=\r\n", 3);
			column = 0;
		}
		buf_append(out, token, n);
		column += n;
	}
}

void
mime_encode_base64(const char *in, size_t len, struct buf *out)
{
	/* 57 octets make one line of 76 characters. */
	for (size_t i = 0; i < len; i += 57)
	{
		size_t n = len - i < 57 ? len - i : 57;

		base64_append(out, in + i, n);
		buf_append(out, "\r\n", 2);
	}
}

/* ---------------------------------------------------------------------------
 * Walking the entities
 * ------------------------------------------------------------------------- */

struct mime_walk
{
	enum mime_downgrade_target target;
	char					  *why;
	size_t					   whylen;
	bool					   changed;
};

/* The headers with Content-Transfer-Encoding replaced by encoding (and MIME-Version added at the top). */
static void
mime_rewrite_headers(const char *h, size_t hlen, const char *encoding, bool top, struct buf *out)
{
	char *version = top ? header_get(h, hlen, "MIME-Version") : NULL;

	header_remove(h, hlen, "Content-Transfer-Encoding", out);
	if (top && version == NULL)
		buf_append_str(out, "MIME-Version: 1.0\r\n");
	buf_printf(out, "Content-Transfer-Encoding: %s\r\n", encoding);
	free(version);
}

static bool mime_walk_entity(struct mime_walk *w, const char *s, size_t len, int depth, bool top,
							 struct buf *out);

/*
 * A delimiter line: kept as it is when it fits, else the delimiter alone.
 * What follows the boundary on its line is padding, not content (RFC 2046
 * 5.1.1): an 8-bit octet, a NUL or a bare CR there is dropped.
 */
static void
mime_append_delimiter(struct mime_walk *w, const char *line, size_t len, size_t dlen, bool closing,
					  struct buf *out)
{
	if (!mime_unfit(line, len, w->target))
	{
		buf_append(out, line, len);
		return;
	}
	buf_append(out, line, dlen + (closing ? 2 : 0));
	buf_append(out, "\r\n", 2);
	w->changed = true;
}

/* A multipart body: each part walked, the delimiters kept, an unfit preamble or epilogue dropped. */
static bool
mime_walk_multipart(struct mime_walk *w, const char *b, size_t len, const char *boundary, int depth,
					struct buf *out)
{
	char  *d = xasprintf("--%s", boundary);
	size_t dlen = strlen(d);
	bool   closing;
	size_t at = mime_next_delimiter(b, len, 0, d, dlen, &closing);
	bool   ok = true;

	if (mime_unfit(b, at, w->target))
		w->changed = true; /* the preamble is for readers without MIME: dropped */
	else
		buf_append(out, b, at);
	while (at < len)
	{
		size_t line_end = mime_line_end(b, len, at);
		size_t start = line_end;
		size_t next;
		size_t part_end;
		bool   next_closing;

		mime_append_delimiter(w, b + at, line_end - at, dlen, closing, out);
		if (closing)
		{
			if (mime_unfit(b + line_end, len - line_end, w->target))
				w->changed = true;
			else
				buf_append(out, b + line_end, len - line_end);
			break;
		}
		next = mime_next_delimiter(b, len, start, d, dlen, &next_closing);
		/* The line end before a delimiter belongs to the delimiter (RFC 2046 5.1.1). */
		part_end = next;
		if (next < len && part_end > start && b[part_end - 1] == '\n')
			part_end--;
		if (next < len && part_end > start && b[part_end - 1] == '\r')
			part_end--;
		if (!mime_walk_entity(w, b + start, part_end - start, depth + 1, false, out))
		{
			ok = false;
			break;
		}
		buf_append(out, b + part_end, next - part_end);
		at = next;
		closing = next_closing;
	}
	free(d);
	return ok;
}

static bool
mime_walk_entity(struct mime_walk *w, const char *s, size_t len, int depth, bool top, struct buf *out)
{
	size_t		hlen;
	size_t		body_start;
	char	   *content_type;
	char	   *encoding;
	char		type[128];
	const char *body;
	size_t		blen;
	bool		ok = true;

	if (depth > MIME_MAX_DEPTH)
	{
		snprintf(w->why, w->whylen, "MIME parts nested more than %d deep", MIME_MAX_DEPTH);
		return false;
	}
	if (!mime_unfit(s, len, w->target))
	{
		buf_append(out, s, len);
		return true;
	}
	mime_entity_split(s, len, &hlen, &body_start);
	if (mime_unfit(s, hlen, w->target))
	{
		snprintf(w->why, w->whylen, "%s",
				 mime_has_binary(s, hlen) ? "a header field holds a NUL or a bare CR"
										  : "a header field holds 8-bit text, which only SMTPUTF8 carries");
		return false;
	}
	body = s + body_start;
	blen = len - body_start;
	content_type = header_get(s, hlen, "Content-Type");
	encoding = header_get(s, hlen, "Content-Transfer-Encoding");
	mime_media_type(content_type, type, sizeof(type));
	if (encoding && (strcasecmp(encoding, "base64") == 0 || strcasecmp(encoding, "quoted-printable") == 0))
	{
		snprintf(w->why, w->whylen, "a %s part encoded as %s holds raw 8-bit or binary octets", type, encoding);
		ok = false;
	}
	else if (strncmp(type, "multipart/", 10) == 0 || strcmp(type, "message/rfc822") == 0)
	{
		char	  *boundary = type[0] == 'm' && type[1] == 'u' ? mime_boundary(content_type) : NULL;
		struct buf inner = BUF_INIT;

		if (strncmp(type, "multipart/", 10) == 0 && boundary == NULL)
		{
			snprintf(w->why, w->whylen, "a %s part has no usable boundary", type);
			ok = false;
		}
		else
			ok = boundary ? mime_walk_multipart(w, body, blen, boundary, depth, &inner)
						  : mime_walk_entity(w, body, blen, depth + 1, false, &inner);
		if (ok)
		{
			/* A composite is never encoded: its own label follows what it now holds (RFC 2045 6.4). */
			mime_rewrite_headers(s, hlen, message_has_8bit(inner.data, inner.len) ? "8bit" : "7bit", top, out);
			buf_append(out, "\r\n", 2);
			buf_append(out, inner.data, inner.len);
		}
		free(boundary);
		buf_free(&inner);
	}
	else
	{
		bool text = strncmp(type, "text/", 5) == 0;

		mime_rewrite_headers(s, hlen, text ? "quoted-printable" : "base64", top, out);
		buf_append(out, "\r\n", 2);
		if (text)
			mime_encode_quoted_printable(body, blen, out);
		else
			mime_encode_base64(body, blen, out);
	}
	if (ok)
		w->changed = true;
	free(content_type);
	free(encoding);
	return ok;
}

enum mime_downgrade_result
mime_downgrade(const char *raw, size_t len, enum mime_downgrade_target target, struct buf *out,
			   char *why, size_t whylen)
{
	struct mime_walk w = {.target = target, .why = why, .whylen = whylen};
	struct buf		 converted = BUF_INIT;

	if (!mime_unfit(raw, len, target))
		return MIME_DOWNGRADE_UNCHANGED;
	if (!mime_walk_entity(&w, raw, len, 0, true, &converted))
	{
		buf_free(&converted);
		return MIME_DOWNGRADE_IMPOSSIBLE;
	}
	buf_append(out, converted.data, converted.len);
	buf_free(&converted);
	return MIME_DOWNGRADE_DONE;
}
