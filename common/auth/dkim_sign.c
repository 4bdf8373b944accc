/* dkim_sign.c: see dkim_sign.h. */
#include "auth/dkim_sign.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "base/base64.h"
#include "base/log.h"

#define DKIM_FOLD_COLUMN 76

/*
 * The next name of a colon-separated list: its length in *len, and the
 * position after it as the return (NULL at the end).
 */
static const char *
dkim_list_next(const char *p, const char **name, size_t *len)
{
	if (p == NULL || *p == '\0')
		return NULL;
	*name = p;
	*len = strcspn(p, ":");
	p += *len;
	return *p == ':' ? p + 1 : p;
}

/* Is name (name_len) in the colon-separated list? */
static bool
dkim_list_has(const char *list, const char *name, size_t name_len)
{
	const char *item;
	size_t		n;

	for (const char *p = list; (p = dkim_list_next(p, &item, &n)) != NULL;)
		if (n == name_len && strncasecmp(item, name, n) == 0)
			return true;
	return false;
}

/* The count of fields named name (name_len). */
static size_t
dkim_field_count(const struct header_fields *fields, const char *name, size_t name_len)
{
	size_t count = 0;

	for (size_t i = 0; i < fields->count; i++)
		if (header_field_named(&fields->field[i], name, name_len))
			count++;
	return count;
}

static void
dkim_append_name(struct buf *out, const char *name, size_t len)
{
	if (out->len > 0)
		buf_append_char(out, ':');
	for (size_t i = 0; i < len; i++)
		buf_append_char(out, (char) tolower((unsigned char) name[i]));
}

void
dkim_header_list(const struct header_fields *fields, const char *headers, const char *oversigned,
				 struct buf *out)
{
	const char *name;
	size_t		n;

	for (const char *p = headers; (p = dkim_list_next(p, &name, &n)) != NULL;)
	{
		size_t count = dkim_field_count(fields, name, n) + (dkim_list_has(oversigned, name, n) ? 1 : 0);

		for (size_t i = 0; i < count; i++)
			dkim_append_name(out, name, n);
	}
	/* An oversigned name missing from headers is still oversigned. */
	for (const char *p = oversigned; (p = dkim_list_next(p, &name, &n)) != NULL;)
	{
		if (dkim_list_has(headers, name, n))
			continue;
		for (size_t i = 0, count = dkim_field_count(fields, name, n) + 1; i < count; i++)
			dkim_append_name(out, name, n);
	}
}

void
dkim_append_folded(struct buf *out, const char *value, size_t len, size_t *column,
				   const char *breaks)
{
	size_t pos = 0;

	while (pos < len)
	{
		size_t take;

		if (breaks)
		{
			/* One name and the separator after it: never split a name. */
			take = 0;
			while (pos + take < len && strchr(breaks, value[pos + take]) == NULL)
				take++;
			if (pos + take < len)
				take++;
		}
		else
			take = *column < DKIM_FOLD_COLUMN ? DKIM_FOLD_COLUMN - *column : 0;
		if (take > len - pos)
			take = len - pos;
		if ((take == 0 || *column + take > DKIM_FOLD_COLUMN) && *column > 8)
		{
			buf_append_str(out, "\r\n\t");
			*column = 8;
			continue;
		}
		if (take == 0)
			take = 1;
		buf_append(out, value + pos, take);
		*column += take;
		pos += take;
	}
}

/* Append "tag=value;" (a space first), folding before it if the line is full. */
static void
dkim_append_tag(struct buf *out, size_t *column, const char *tag, const char *value)
{
	size_t need = strlen(tag) + 1 + strlen(value) + 2;

	if (*column + need > DKIM_FOLD_COLUMN && *column > 8)
	{
		buf_append_str(out, "\r\n\t");
		*column = 8;
	}
	else
	{
		buf_append_char(out, ' ');
		(*column)++;
	}
	buf_printf(out, "%s=%s;", tag, value);
	*column += need - 1;
}

bool
dkim_sign_field(const struct dkim_signer *s, struct header_fields *fields,
				const unsigned char body_hash[CANON_HASH_LEN], struct buf *out)
{
	struct buf	  field = BUF_INIT;
	struct buf	  list = BUF_INIT;
	struct buf	  bh = BUF_INIT;
	struct buf	  sig = BUF_INIT;
	unsigned char hash[CANON_HASH_LEN];
	char		  canon[32];
	size_t		  column;
	bool		  ok;

	dkim_header_list(fields, s->headers, s->oversigned, &list);
	base64_append(&bh, body_hash, CANON_HASH_LEN);
	snprintf(canon, sizeof(canon), "%s/%s", canon_name(s->header_canon), canon_name(s->body_canon));

	buf_printf(&field, "%s: %s;", s->field_name, s->leading_tags);
	column = field.len;
	dkim_append_tag(&field, &column, "a", sign_algorithm_name(s->algorithm));
	dkim_append_tag(&field, &column, "c", canon);
	dkim_append_tag(&field, &column, "d", s->domain);
	dkim_append_tag(&field, &column, "s", s->selector);
	if (s->timestamp > 0)
	{
		char t[32];

		snprintf(t, sizeof(t), "%lld", (long long) s->timestamp);
		dkim_append_tag(&field, &column, "t", t);
	}
	buf_append_str(&field, "\r\n\th=");
	column = 10;
	dkim_append_folded(&field, list.data ? list.data : "", list.len, &column, ":");
	buf_append_str(&field, ";\r\n\tbh=");
	buf_append(&field, bh.data, bh.len);
	buf_append_str(&field, ";\r\n\tb=\r\n");

	header_fields_reset(fields);
	canon_header_hash(s->header_canon, fields, list.data ? list.data : "", field.data, field.len, hash);
	ok = keys_sign_hash(s->pkey, s->algorithm, hash, &sig);
	if (ok)
	{
		field.len -= 2; /* the CRLF after "b=" */
		column = 10;
		dkim_append_folded(&field, sig.data, sig.len, &column, NULL);
		buf_append_str(&field, "\r\n");
		buf_append(out, field.data, field.len);
	}
	buf_free(&field);
	buf_free(&list);
	buf_free(&bh);
	buf_free(&sig);
	return ok;
}
