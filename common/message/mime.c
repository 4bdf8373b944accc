/* mime.c: see mime.h. */
#include "message/mime.h"

#include <ctype.h>
#include <errno.h>
#include <iconv.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/base64.h"
#include "base/xalloc.h"
#include "message/header.h"
#include "message/message.h"

/* ---------------------------------------------------------------------------
 * Entities, types, delimiters
 * ------------------------------------------------------------------------- */

void
mime_entity_split(const char *s, size_t len, size_t *headers_len, size_t *body_start)
{
	if (len >= 2 && s[0] == '\r' && s[1] == '\n')
	{
		*headers_len = 0;
		*body_start = 2;
		return;
	}
	if (len >= 1 && s[0] == '\n')
	{
		*headers_len = 0;
		*body_start = 1;
		return;
	}
	for (size_t i = 0; i + 1 < len; i++)
	{
		if (s[i] != '\n')
			continue;
		if (s[i + 1] == '\n')
		{
			*headers_len = i + 1;
			*body_start = i + 2;
			return;
		}
		if (s[i + 1] == '\r' && i + 2 < len && s[i + 2] == '\n')
		{
			*headers_len = i + 1;
			*body_start = i + 3;
			return;
		}
	}
	*headers_len = len;
	*body_start = len;
}

void
mime_media_type(const char *content_type, char *out, size_t outlen)
{
	size_t n = 0;

	if (content_type)
	{
		const char *p = content_type + strspn(content_type, " \t");

		while (p[n] && p[n] != ';' && p[n] != ' ' && p[n] != '\t' && p[n] != '(' && n + 1 < outlen)
		{
			out[n] = (char) tolower((unsigned char) p[n]);
			n++;
		}
	}
	out[n] = '\0';
	if (n == 0 || strchr(out, '/') == NULL)
		snprintf(out, outlen, "text/plain");
}

char *
mime_parameter(const char *content_type, const char *name)
{
	const char *p = content_type;
	size_t		name_len = strlen(name);

	while (p != NULL && (p = strchr(p, ';')) != NULL)
	{
		p++;
		p += strspn(p, " \t\r\n");
		if (strncasecmp(p, name, name_len) != 0)
			continue;
		p += name_len;
		p += strspn(p, " \t");
		if (*p != '=')
			continue;
		p++;
		p += strspn(p, " \t");
		if (*p == '"')
		{
			const char *end = strchr(p + 1, '"');

			return end && end > p + 1 ? xstrndup(p + 1, (size_t) (end - p - 1)) : NULL;
		}
		{
			size_t n = strcspn(p, " \t;()<>@,:\\\"/[]?=");

			return n > 0 ? xstrndup(p, n) : NULL;
		}
	}
	return NULL;
}

char *
mime_boundary(const char *content_type)
{
	char *boundary = mime_parameter(content_type, "boundary");

	if (boundary != NULL && strlen(boundary) > 70)
	{
		free(boundary);
		return NULL;
	}
	return boundary;
}

/* Is there a delimiter line for boundary d (dlen) at s[i]? Sets *closing for "--d--". */
static bool
mime_delimiter_at(const char *s, size_t len, size_t i, const char *d, size_t dlen, bool *closing)
{
	const char *after;

	if ((i > 0 && s[i - 1] != '\n') || i + dlen > len || memcmp(s + i, d, dlen) != 0)
		return false;
	after = s + i + dlen;
	*closing = (size_t) (after - s) + 2 <= len && after[0] == '-' && after[1] == '-';
	if (*closing)
		return true;
	return after == s + len || *after == '\r' || *after == '\n' || *after == ' ' || *after == '\t';
}

size_t
mime_next_delimiter(const char *s, size_t len, size_t from, const char *d, size_t dlen, bool *closing)
{
	for (size_t i = from; i + dlen <= len;)
	{
		const char *hit = memmem(s + i, len - i, d, dlen);

		if (hit == NULL)
			break;
		i = (size_t) (hit - s);
		if (mime_delimiter_at(s, len, i, d, dlen, closing))
			return i;
		i++;
	}
	*closing = false;
	return len;
}

size_t
mime_line_end(const char *s, size_t len, size_t from)
{
	const char *nl = memchr(s + from, '\n', len - from);

	return nl ? (size_t) (nl - s) + 1 : len;
}


/* ---------------------------------------------------------------------------
 * Decoding
 * ------------------------------------------------------------------------- */

static int
mime_hex_value(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

void
mime_decode_quoted_printable(const char *in, size_t len, struct buf *out)
{
	buf_reserve(out, len);
	for (size_t i = 0; i < len; i++)
	{
		size_t j;
		int	   high;
		int	   low;

		if (in[i] != '=')
		{
			buf_append_char(out, in[i]);
			continue;
		}
		/* A soft line break: "=", perhaps whitespace a hop added, the line end (6.7 (5)). */
		for (j = i + 1; j < len && (in[j] == ' ' || in[j] == '\t'); j++)
			;
		if (j == len || in[j] == '\n' || (in[j] == '\r' && j + 1 < len && in[j + 1] == '\n'))
		{
			i = j == len ? j : j + (in[j] == '\r');
			continue;
		}
		high = i + 1 < len ? mime_hex_value(in[i + 1]) : -1;
		low = i + 2 < len ? mime_hex_value(in[i + 2]) : -1;
		if (high < 0 || low < 0)
		{
			/* Not an encoding: a reader keeps it as it stands (6.7, note 1). */
			buf_append_char(out, '=');
			continue;
		}
		buf_append_char(out, (char) (high << 4 | low));
		i += 2;
	}
}

void
mime_decode_base64(const char *in, size_t len, struct buf *out)
{
	unsigned char *decoded = xmalloc(len / 4 * 3 + 3);
	long		   n = base64_decode(in, len, decoded, len / 4 * 3 + 3, BASE64_FOLDED);

	if (n >= 0)
		buf_append(out, decoded, (size_t) n);
	else
	{
		/* Parts glued together, or junk after the padding: each line that decodes. */
		for (size_t at = 0; at < len;)
		{
			size_t end = mime_line_end(in, len, at);

			n = base64_decode(in + at, end - at, decoded, len / 4 * 3 + 3, BASE64_FOLDED);
			if (n > 0)
				buf_append(out, decoded, (size_t) n);
			at = end;
		}
	}
	free(decoded);
}

/* Is s well-formed UTF-8 (RFC 3629: no overlong form, no surrogate, nothing past U+10FFFF)? */
static bool
mime_valid_utf8(const unsigned char *s, size_t len)
{
	for (size_t i = 0; i < len;)
	{
		unsigned char c = s[i];
		size_t		  n;
		unsigned int  cp;

		if (c < 0x80)
		{
			i++;
			continue;
		}
		if (c >= 0xC2 && c <= 0xDF)
			n = 1, cp = c & 0x1F;
		else if (c >= 0xE0 && c <= 0xEF)
			n = 2, cp = c & 0x0F;
		else if (c >= 0xF0 && c <= 0xF4)
			n = 3, cp = c & 0x07;
		else
			return false;
		if (i + n >= len)
			return false;
		for (size_t k = 1; k <= n; k++)
		{
			if ((s[i + k] & 0xC0) != 0x80)
				return false;
			cp = cp << 6 | (s[i + k] & 0x3F);
		}
		if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
			return false;
		i += n + 1;
	}
	return true;
}

bool
mime_text_to_utf8(const char *in, size_t len, const char *charset, struct buf *out)
{
	iconv_t cd;
	char   *from = (char *) (uintptr_t) in;
	size_t	left = len;

	if (charset == NULL || strcasecmp(charset, "us-ascii") == 0 || strcasecmp(charset, "utf-8") == 0
		|| strcasecmp(charset, "utf8") == 0)
	{
		if (mime_valid_utf8((const unsigned char *) in, len))
		{
			buf_append(out, in, len);
			return true;
		}
		/* Mislabelled 8-bit text: most often Windows' Latin-1. */
		charset = "WINDOWS-1252";
	}
	cd = iconv_open("UTF-8", charset);
	if (cd == (iconv_t) -1)
		return false;
	while (left > 0)
	{
		char   chunk[4096];
		char  *to = chunk;
		size_t room = sizeof(chunk);
		size_t rc = iconv(cd, &from, &left, &to, &room);

		buf_append(out, chunk, sizeof(chunk) - room);
		if (rc != (size_t) -1 || errno == E2BIG)
			continue;
		if (errno == EINVAL)
			break; /* a sequence cut off at the end */
		/* An octet the charset has no character for: U+FFFD, and on. */
		buf_append_str(out, "\xEF\xBF\xBD");
		from++;
		left--;
	}
	iconv_close(cd);
	return true;
}

/* ---------------------------------------------------------------------------
 * The text of a message
 * ------------------------------------------------------------------------- */

struct mime_text_walk
{
	struct buf *out;
	size_t		max;
	bool		html; /* reading text/html parts (there was no text/plain) */
	size_t		parts;
};

/* Append the UTF-8 code point cp. */
static void
mime_append_code_point(struct buf *out, unsigned long cp)
{
	char   u[4];
	size_t n;

	if (cp == 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
		cp = 0xFFFD;
	if (cp < 0x80)
		u[0] = (char) cp, n = 1;
	else if (cp < 0x800)
		u[0] = (char) (0xC0 | cp >> 6), u[1] = (char) (0x80 | (cp & 0x3F)), n = 2;
	else if (cp < 0x10000)
		u[0] = (char) (0xE0 | cp >> 12), u[1] = (char) (0x80 | (cp >> 6 & 0x3F)), u[2] = (char) (0x80 | (cp & 0x3F)),
		n = 3;
	else
		u[0] = (char) (0xF0 | cp >> 18), u[1] = (char) (0x80 | (cp >> 12 & 0x3F)),
		u[2] = (char) (0x80 | (cp >> 6 & 0x3F)), u[3] = (char) (0x80 | (cp & 0x3F)), n = 4;
	buf_append(out, u, n);
}

/*
 * What an HTML part says, without its markup: tags, comments, style and
 * script left out, the character references a text needs decoded.  Not a
 * renderer: enough to read the language of the words.
 */
static void
mime_html_words(const char *s, size_t len, struct buf *out)
{
	static const struct
	{
		const char *name;
		const char *text;
	} entities[] = {{"&nbsp;", " "}, {"&amp;", "&"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""}, {"&apos;", "'"}};

	for (size_t i = 0; i < len;)
	{
		if (s[i] == '<')
		{
			const char *skip_to = ">";
			const char *end;

			if (len - i >= 4 && memcmp(s + i, "<!--", 4) == 0)
				skip_to = "-->";
			else if (len - i >= 6 && strncasecmp(s + i, "<style", 6) == 0)
				skip_to = "</style";
			else if (len - i >= 7 && strncasecmp(s + i, "<script", 7) == 0)
				skip_to = "</script";
			end = memmem(s + i + 1, len - i - 1, skip_to, strlen(skip_to));
			if (end == NULL)
				break;
			i = (size_t) (end - s) + strlen(skip_to);
			if (skip_to[0] == '<')
			{
				end = memchr(s + i, '>', len - i);
				i = end ? (size_t) (end - s) + 1 : len;
			}
			buf_append_char(out, ' ');
			continue;
		}
		if (s[i] == '&')
		{
			size_t k;

			if (i + 2 < len && s[i + 1] == '#')
			{
				char		 *end;
				bool		  hex = s[i + 2] == 'x' || s[i + 2] == 'X';
				char		  digits[16];
				size_t		  n = 0;
				unsigned long cp;

				for (k = i + 2 + hex; k < len && n + 1 < sizeof(digits) && isxdigit((unsigned char) s[k]); k++)
					digits[n++] = s[k];
				digits[n] = '\0';
				cp = strtoul(digits, &end, hex ? 16 : 10);
				if (n > 0 && *end == '\0' && k < len && s[k] == ';')
				{
					mime_append_code_point(out, cp);
					i = k + 1;
					continue;
				}
			}
			for (k = 0; k < sizeof(entities) / sizeof(entities[0]); k++)
			{
				size_t n = strlen(entities[k].name);

				if (len - i >= n && strncasecmp(s + i, entities[k].name, n) == 0)
				{
					buf_append_str(out, entities[k].text);
					i += n;
					break;
				}
			}
			if (k < sizeof(entities) / sizeof(entities[0]))
				continue;
		}
		buf_append_char(out, s[i++]);
	}
}

/* Append text (UTF-8) to the walk's output, at most its max, cut at a character's start. */
static void
mime_text_append(struct mime_text_walk *w, const char *text, size_t len)
{
	size_t room;

	if (w->max > 0)
	{
		room = w->out->len < w->max ? w->max - w->out->len : 0;
		if (len > room)
		{
			len = room;
			while (len > 0 && (text[len] & 0xC0) == 0x80)
				len--;
		}
	}
	buf_append(w->out, text, len);
}

static void mime_text_entity(struct mime_text_walk *w, const char *s, size_t len, int depth);

static void
mime_text_multipart(struct mime_text_walk *w, const char *b, size_t len, const char *boundary, int depth)
{
	char  *d = xasprintf("--%s", boundary);
	size_t dlen = strlen(d);
	bool   closing;
	size_t at = mime_next_delimiter(b, len, 0, d, dlen, &closing);

	while (at < len && !closing)
	{
		size_t start = mime_line_end(b, len, at);
		size_t next = mime_next_delimiter(b, len, start, d, dlen, &closing);
		size_t part_end = next;

		/* The line end before a delimiter belongs to the delimiter (RFC 2046 5.1.1). */
		if (next < len && part_end > start && b[part_end - 1] == '\n')
			part_end--;
		if (next < len && part_end > start && b[part_end - 1] == '\r')
			part_end--;
		mime_text_entity(w, b + start, part_end - start, depth + 1);
		at = next;
	}
	free(d);
}

/* A text part: its transfer encoding undone, its charset made UTF-8, its markup left out. */
static void
mime_text_part(struct mime_text_walk *w, const char *headers, size_t hlen, const char *content_type, const char *body,
			   size_t blen)
{
	char	  *encoding = header_get(headers, hlen, "Content-Transfer-Encoding");
	char	  *charset = mime_parameter(content_type, "charset");
	struct buf decoded = BUF_INIT;
	struct buf utf8 = BUF_INIT;
	struct buf words = BUF_INIT;
	char	   trimmed[64] = "";

	if (encoding != NULL)
		sscanf(encoding, " %63[^ \t;(]", trimmed);
	if (strcasecmp(trimmed, "quoted-printable") == 0)
		mime_decode_quoted_printable(body, blen, &decoded);
	else if (strcasecmp(trimmed, "base64") == 0)
		mime_decode_base64(body, blen, &decoded);
	else
		buf_append(&decoded, body, blen);
	if (mime_text_to_utf8(decoded.data ? decoded.data : "", decoded.len, charset, &utf8))
	{
		const struct buf *text = &utf8;

		if (w->html)
		{
			mime_html_words(utf8.data ? utf8.data : "", utf8.len, &words);
			text = &words;
		}
		if (w->parts > 0)
			mime_text_append(w, "\n\n", 2);
		mime_text_append(w, text->data ? text->data : "", text->len);
		w->parts++;
	}
	buf_free(&decoded);
	buf_free(&utf8);
	buf_free(&words);
	free(encoding);
	free(charset);
}

static void
mime_text_entity(struct mime_text_walk *w, const char *s, size_t len, int depth)
{
	size_t hlen;
	size_t body_start;
	char  *content_type;
	char  *disposition;
	char   type[128];

	if (depth > MIME_MAX_DEPTH || (w->max > 0 && w->out->len >= w->max))
		return;
	mime_entity_split(s, len, &hlen, &body_start);
	content_type = header_get(s, hlen, "Content-Type");
	disposition = header_get(s, hlen, "Content-Disposition");
	mime_media_type(content_type, type, sizeof(type));
	if (strncmp(type, "multipart/", 10) == 0)
	{
		char *boundary = mime_boundary(content_type);

		if (boundary != NULL)
			mime_text_multipart(w, s + body_start, len - body_start, boundary, depth);
		free(boundary);
	}
	else if (strcmp(type, "message/rfc822") == 0)
		mime_text_entity(w, s + body_start, len - body_start, depth + 1);
	else if (strcmp(type, w->html ? "text/html" : "text/plain") == 0
			 && (disposition == NULL || strncasecmp(disposition + strspn(disposition, " \t"), "attachment", 10) != 0))
		mime_text_part(w, s, hlen, content_type, s + body_start, len - body_start);
	free(content_type);
	free(disposition);
}

size_t
mime_text(const char *raw, size_t len, size_t max, struct buf *out)
{
	struct mime_text_walk w = {.out = out, .max = max > 0 ? out->len + max : 0};

	mime_text_entity(&w, raw, len, 0);
	if (w.parts == 0)
	{
		w.html = true;
		mime_text_entity(&w, raw, len, 0);
	}
	return w.parts;
}
