/*
 * pgpmime.c: PGP/MIME messages with protected headers (pgpmime.h).
 */
#include <ctype.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "crypto/pgpmime.h"
#include "message/header.h"

static const char *const pgpmime_protected[] = {"Subject", "From", "To", "Cc", "Date", "Message-ID", "Reply-To",
												NULL};

/* Calls fn for each field of a header block (its name's length, the whole field with its CRLF). */
static void
pgpmime_fields(const char *h, size_t len, void (*fn)(const char *field, size_t flen, size_t nlen, void *arg),
			   void *arg)
{
	size_t i = 0;

	while (i < len)
	{
		size_t start = i, colon = 0;

		for (;;)
		{
			const char *nl = memchr(h + i, '\n', len - i);

			i = nl ? (size_t) (nl - h) + 1 : len;
			if (i >= len || (h[i] != ' ' && h[i] != '\t'))
				break;
		}
		while (start + colon < i && h[start + colon] != ':')
			colon++;
		if (i - start > 2 || (h[start] != '\r' && h[start] != '\n'))
			fn(h + start, i - start, colon, arg);
	}
}

static bool
pgpmime_named(const char *field, size_t nlen, const char *name)
{
	return strlen(name) == nlen && strncasecmp(field, name, nlen) == 0;
}

static bool
pgpmime_is_content(const char *field, size_t nlen)
{
	return (nlen > 8 && strncasecmp(field, "Content-", 8) == 0) || pgpmime_named(field, nlen, "MIME-Version");
}

static bool
pgpmime_is_protected(const char *field, size_t nlen)
{
	for (int k = 0; pgpmime_protected[k]; k++)
		if (pgpmime_named(field, nlen, pgpmime_protected[k]))
			return true;
	return false;
}

/* Append a field, with a CRLF if it lacks one. */
static void
pgpmime_append_field(struct buf *out, const char *field, size_t flen)
{
	buf_append(out, field, flen);
	if (flen == 0 || field[flen - 1] != '\n')
		buf_append_str(out, "\r\n");
}

struct pgpmime_copy
{
	struct buf *out;
	int			mode; /* 0: content fields; 1: protected; 2: outer (neither content, Subject replaced) */
	bool		had_type;
};

static void
pgpmime_copy_field(const char *field, size_t flen, size_t nlen, void *arg)
{
	struct pgpmime_copy *c = arg;

	if (c->mode == 0 && pgpmime_is_content(field, nlen) && !pgpmime_named(field, nlen, "MIME-Version"))
	{
		if (pgpmime_named(field, nlen, "Content-Type"))
		{
			size_t end = flen;

			while (end > 0 && (field[end - 1] == '\r' || field[end - 1] == '\n'))
				end--;
			buf_append(c->out, field, end);
			buf_append_str(c->out, ";\r\n protected-headers=\"v1\"\r\n");
			c->had_type = true;
		}
		else
			pgpmime_append_field(c->out, field, flen);
	}
	else if (c->mode == 1 && pgpmime_is_protected(field, nlen))
		pgpmime_append_field(c->out, field, flen);
	else if (c->mode == 2 && !pgpmime_is_content(field, nlen))
	{
		if (pgpmime_named(field, nlen, "Subject"))
			buf_append_str(c->out, "Subject: ...\r\n");
		else
			pgpmime_append_field(c->out, field, flen);
	}
}

void
pgpmime_inner(const char *headers, size_t hlen, const char *body, size_t blen, struct buf *inner)
{
	struct pgpmime_copy c = {inner, 0, false};

	pgpmime_fields(headers, hlen, pgpmime_copy_field, &c);
	if (!c.had_type)
		buf_append_str(inner, "Content-Type: text/plain; charset=us-ascii;\r\n protected-headers=\"v1\"\r\n");
	c.mode = 1;
	pgpmime_fields(headers, hlen, pgpmime_copy_field, &c);
	buf_append_str(inner, "\r\n");
	buf_append(inner, body, blen);
}

void
pgpmime_outer(const char *headers, size_t hlen, const char *armored, size_t alen, const char *extra,
			  struct buf *out_headers, struct buf *out_body)
{
	struct pgpmime_copy c = {out_headers, 2, false};
	unsigned char		r[12];
	char				boundary[40];

	RAND_bytes(r, sizeof(r));
	snprintf(boundary, sizeof(boundary), "pgp-%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2],
			 r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11]);
	pgpmime_fields(headers, hlen, pgpmime_copy_field, &c);
	if (extra)
		buf_append_str(out_headers, extra);
	buf_printf(out_headers,
			   "MIME-Version: 1.0\r\nContent-Type: multipart/encrypted;\r\n protocol=\"application/pgp-encrypted\";\r\n"
			   " boundary=\"%s\"\r\n",
			   boundary);
	buf_printf(out_body,
			   "This is an OpenPGP/MIME encrypted message (RFC 3156).\r\n--%s\r\n"
			   "Content-Type: application/pgp-encrypted\r\nContent-Description: PGP/MIME version identification\r\n"
			   "\r\nVersion: 1\r\n\r\n--%s\r\n"
			   "Content-Type: application/octet-stream; name=\"encrypted.asc\"\r\n"
			   "Content-Description: OpenPGP encrypted message\r\n"
			   "Content-Disposition: inline; filename=\"encrypted.asc\"\r\n\r\n",
			   boundary, boundary);
	/* Line by line (the armor's bare LFs made CRLF), not byte by byte: the armor is the message's whole size. */
	buf_reserve(out_body, alen + alen / 32 + 2);
	for (size_t i = 0; i < alen;)
	{
		const char *nl = memchr(armored + i, '\n', alen - i);
		size_t		end = nl ? (size_t) (nl - armored) : alen;

		buf_append(out_body, armored + i, end - i);
		if (nl == NULL)
			break;
		buf_append_str(out_body, end > 0 && armored[end - 1] == '\r' ? "\n" : "\r\n");
		i = end + 1;
	}
	if (alen && armored[alen - 1] != '\n')
		buf_append_str(out_body, "\r\n");
	buf_printf(out_body, "\r\n--%s--\r\n", boundary);
}

void
pgpmime_outer_fields(const char *headers, size_t hlen, struct buf *out_headers)
{
	struct pgpmime_copy c = {out_headers, 2, false};

	pgpmime_fields(headers, hlen, pgpmime_copy_field, &c);
}

bool
pgpmime_is_encrypted(const char *headers, size_t hlen)
{
	char *type = header_get(headers, hlen, "Content-Type");
	bool  yes = type && strncasecmp(type, "multipart/encrypted", 19) == 0
			   && strcasestr(type, "application/pgp-encrypted") != NULL;

	free(type);
	return yes;
}

bool
pgpmime_ciphertext(const char *body, size_t blen, struct buf *armored)
{
	static const char begin[] = "-----BEGIN PGP MESSAGE-----";
	static const char end[] = "-----END PGP MESSAGE-----";
	const char		 *b = memmem(body, blen, begin, sizeof(begin) - 1);
	const char		 *e = b ? memmem(b, blen - (size_t) (b - body), end, sizeof(end) - 1) : NULL;

	if (b == NULL || e == NULL)
		return false;
	buf_reset(armored);
	buf_append(armored, b, (size_t) (e - b) + sizeof(end) - 1);
	buf_append_str(armored, "\n");
	return true;
}

struct pgpmime_restore_arg
{
	struct buf *out;
	const char *entity_headers;
	size_t		ehlen;
	int			mode; /* 0: outer fields kept; 1: entity's fields */
};

static void
pgpmime_restore_field(const char *field, size_t flen, size_t nlen, void *arg)
{
	struct pgpmime_restore_arg *r = arg;

	if (r->mode == 0)
	{
		char name[64];

		if (pgpmime_is_content(field, nlen))
			return;
		if (pgpmime_is_protected(field, nlen) && nlen < sizeof(name))
		{
			memcpy(name, field, nlen);
			name[nlen] = '\0';
			if (header_count(r->entity_headers, r->ehlen, name) > 0)
				return;
		}
		pgpmime_append_field(r->out, field, flen);
	}
	else if (pgpmime_is_protected(field, nlen))
		pgpmime_append_field(r->out, field, flen);
	else if (pgpmime_is_content(field, nlen))
	{
		/* The protected-headers parameter is the entity's marker, not the message's: dropped. */
		struct buf	f = BUF_INIT;
		const char *mark;

		buf_append(&f, field, flen);
		mark = strcasestr(f.data, "protected-headers=");
		if (mark)
		{
			size_t start = (size_t) (mark - f.data), end = start + strlen("protected-headers=");

			while (start > 0 && f.data[start - 1] != ';')
				start--;
			if (start > 0)
				start--;
			if (end < f.len && f.data[end] == '"')
			{
				const char *q = memchr(f.data + end + 1, '"', f.len - end - 1);
				end = q ? (size_t) (q - f.data) + 1 : f.len;
			}
			else
				while (end < f.len && f.data[end] != ';' && f.data[end] != '\r' && f.data[end] != '\n')
					end++;
			memmove(f.data + start, f.data + end, f.len - end);
			f.len -= end - start;
		}
		pgpmime_append_field(r->out, f.data, f.len);
		buf_free(&f);
	}
}

void
pgpmime_restore(const char *headers, size_t hlen, const char *entity, size_t elen, const char *extra,
				struct buf *out_headers, struct buf *out_body)
{
	const char				  *sep = memmem(entity, elen, "\r\n\r\n", 4);
	size_t					   ehlen = sep ? (size_t) (sep - entity) + 2 : elen;
	size_t					   skip = sep ? 4 : 0;
	struct pgpmime_restore_arg r = {out_headers, entity, ehlen, 0};

	if (sep == NULL && (sep = memmem(entity, elen, "\n\n", 2)) != NULL)
		ehlen = (size_t) (sep - entity) + 1, skip = 2;
	if (extra)
		buf_append_str(out_headers, extra);
	pgpmime_fields(headers, hlen, pgpmime_restore_field, &r);
	r.mode = 1;
	buf_append_str(out_headers, "MIME-Version: 1.0\r\n");
	pgpmime_fields(entity, ehlen, pgpmime_restore_field, &r);
	if (sep)
		buf_append(out_body, sep + skip, elen - (size_t) (sep - entity) - skip);
}
