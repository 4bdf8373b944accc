/* header.c: see header.h. */
#include "message/header.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"

/* Walk the fields: calls visit(start, field_len) for each whole (folded) field. */
static size_t
header_field_end(const char *h, size_t len, size_t start)
{
	size_t pos = start;

	for (;;)
	{
		const char *nl = memchr(h + pos, '\n', len - pos);

		if (nl == NULL)
			return len;
		pos = (size_t) (nl - h) + 1;
		if (pos >= len || (h[pos] != ' ' && h[pos] != '\t'))
			return pos;
	}
}

/*
 * Where the value of a field named name starts (after its colon), or 0
 * when the field has another name.  White space may come before the
 * colon (RFC 5322 4.5, obs-optional): a reader that took "Bcc :" or
 * "Authentication-Results :" for another field would keep it.
 */
static size_t
header_field_value(const char *field, size_t flen, const char *name)
{
	size_t n = strlen(name);

	if (flen <= n || strncasecmp(field, name, n) != 0)
		return 0;
	while (n < flen && (field[n] == ' ' || field[n] == '\t'))
		n++;
	return n < flen && field[n] == ':' ? n + 1 : 0;
}

static bool
header_field_is(const char *field, size_t flen, const char *name)
{
	return header_field_value(field, flen, name) > 0;
}

static void
header_unfold(const char *value, size_t len, struct buf *out)
{
	for (size_t i = 0; i < len; i++)
	{
		if (value[i] == '\r' || value[i] == '\n')
			continue;
		buf_append_char(out, value[i]);
	}
}

void
header_get_all(const char *headers, size_t len, const char *name, struct buf *out)
{
	for (size_t start = 0; start < len;)
	{
		size_t end = header_field_end(headers, len, start);

		size_t value = header_field_value(headers + start, end - start, name);

		if (value > 0)
		{
			size_t vstart = start + value;

			if (out->len > 0)
				buf_append_str(out, ", ");
			header_unfold(headers + vstart, end - vstart, out);
		}
		start = end;
	}
}

char *
header_get(const char *headers, size_t len, const char *name)
{
	for (size_t start = 0; start < len;)
	{
		size_t end = header_field_end(headers, len, start);

		size_t field_value = header_field_value(headers + start, end - start, name);

		if (field_value > 0)
		{
			struct buf out = BUF_INIT;
			size_t	   vstart = start + field_value;
			char	  *value;
			char	  *p;

			header_unfold(headers + vstart, end - vstart, &out);
			buf_append_char(&out, '\0');
			for (p = out.data; isspace((unsigned char) *p); p++)
				;
			value = xstrdup(p);
			buf_free(&out);
			return value;
		}
		start = end;
	}
	return NULL;
}

void
header_remove(const char *headers, size_t len, const char *name, struct buf *out)
{
	for (size_t start = 0; start < len;)
	{
		size_t end = header_field_end(headers, len, start);

		if (!header_field_is(headers + start, end - start, name))
			buf_append(out, headers + start, end - start);
		start = end;
	}
}

size_t
header_count(const char *headers, size_t len, const char *name)
{
	size_t count = 0;

	for (size_t start = 0; start < len;)
	{
		size_t end = header_field_end(headers, len, start);

		count += header_field_is(headers + start, end - start, name);
		start = end;
	}
	return count;
}

/*
 * The authserv-id of an Authentication-Results value: the first token or
 * quoted-string after white space, line folds and comments (RFC 8601 2.2:
 * CFWS allowed, authserv-id = value, RFC 2045's token / quoted-string).
 */
static bool
header_authserv_id_is(const char *value, size_t len, const char *authserv_id)
{
	size_t	   i = 0;
	int		   comment = 0;
	struct buf id = BUF_INIT;
	bool	   is;

	for (; i < len; i++)
	{
		char c = value[i];

		if (comment)
		{
			if (c == '\\' && i + 1 < len)
				i++;
			else if (c == '(')
				comment++;
			else if (c == ')')
				comment--;
		}
		else if (c == '(')
			comment = 1;
		else if (!isspace((unsigned char) c))
			break;
	}
	if (i < len && value[i] == '"')
	{
		/* The quoted-string's content, its quoted-pairs undone. */
		for (i++; i < len && value[i] != '"'; i++)
		{
			if (value[i] == '\\' && i + 1 < len)
				i++;
			if (value[i] != '\r' && value[i] != '\n')
				buf_append_char(&id, value[i]);
		}
		if (i >= len)
		{
			buf_free(&id);
			return false;
		}
	}
	else
		/* The whole token: what follows ends it (a version, a ";", a comment). */
		for (; i < len && !isspace((unsigned char) value[i]) && value[i] != ';' && value[i] != '(';
			 i++)
			buf_append_char(&id, value[i]);
	is = id.len == strlen(authserv_id) && id.len > 0 && strncasecmp(id.data, authserv_id, id.len) == 0;
	buf_free(&id);
	return is;
}

size_t
header_remove_results_of(const char *headers, size_t len, const char *authserv_id, struct buf *out)
{
	size_t removed = 0;

	for (size_t start = 0; start < len;)
	{
		size_t end = header_field_end(headers, len, start);
		size_t value = header_field_value(headers + start, end - start, "Authentication-Results");

		if (value > 0 && header_authserv_id_is(headers + start + value, end - start - value, authserv_id))
			removed++;
		else
			buf_append(out, headers + start, end - start);
		start = end;
	}
	return removed;
}

static void
header_add_address(char ***list, size_t *count, const char *start, size_t n)
{
	while (n > 0 && isspace((unsigned char) *start))
	{
		start++;
		n--;
	}
	while (n > 0 && isspace((unsigned char) start[n - 1]))
		n--;
	if (n == 0 || memchr(start, '@', n) == NULL)
		return;
	*list = xrealloc(*list, (*count + 1) * sizeof(char *));
	(*list)[(*count)++] = xstrndup(start, n);
}

void
header_addresses(const char *value, char ***list, size_t *count)
{
	const char *p = value;

	while (*p)
	{
		/* One mailbox: up to a comma outside quotes, comments and angle brackets. */
		const char *angle_start = NULL;
		const char *angle_end = NULL;
		const char *start = p;
		bool		quoted = false;
		int			comment = 0;
		struct buf	bare = BUF_INIT;

		for (; *p; p++)
		{
			if (quoted)
			{
				if (*p == '\\' && p[1])
					p++;
				else if (*p == '"')
					quoted = false;
				continue;
			}
			if (comment)
			{
				if (*p == '(')
					comment++;
				else if (*p == ')')
					comment--;
				continue;
			}
			if (*p == '"')
				quoted = true;
			else if (*p == '(')
				comment = 1;
			else if (*p == '<')
				angle_start = p + 1;
			else if (*p == '>' && angle_start)
				angle_end = p;
			else if (*p == ':' && !angle_start)
				start = p + 1; /* a group's display name */
			else if (*p == ',' || *p == ';')
				break;
			else if (!angle_start)
				buf_append_char(&bare, *p);
		}
		if (angle_start && angle_end)
			header_add_address(list, count, angle_start, (size_t) (angle_end - angle_start));
		else if (bare.len)
		{
			/* A bare addr-spec: the last word holding an @. */
			(void) start;
			header_add_address(list, count, bare.data, bare.len);
		}
		buf_free(&bare);
		if (*p)
			p++;
	}
}

char *
header_from_address(const char *headers, size_t len)
{
	char  *from = header_get(headers, len, "From");
	char **list = NULL;
	size_t count = 0;
	char  *address = NULL;

	if (from != NULL)
		header_addresses(from, &list, &count);
	if (count == 1 && strchr(list[0], '@') != NULL)
	{
		address = xstrdup(list[0]);
		for (char *p = address; *p; p++)
			*p = (char) tolower((unsigned char) *p);
	}
	for (size_t i = 0; i < count; i++)
		free(list[i]);
	free(list);
	free(from);
	return address;
}
