/*
 * guard.c: posts a list holds for its moderators rather than send
 * (pepsi-stage-list, docs/pepsi-stage-list.8.md): one bigger than the
 * list's max_post_size (a huge attachment), and one whose MIME structure
 * is broken (a multipart without its boundary, a boundary that never
 * occurs, parts never closed), which receivers would show garbled or
 * refuse.  The moderators see the reason and may still approve it.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/xalloc.h"
#include "list.h"
#include "message/header.h"

/* The boundary parameter of a Content-Type value, or NULL. */
static char *
guard_boundary(const char *type)
{
	for (const char *p = strcasestr(type, "boundary"); p; p = strcasestr(p + 1, "boundary"))
	{
		const char *v = p + strlen("boundary");

		if (p > type && !(isspace((unsigned char) p[-1]) || p[-1] == ';'))
			continue;
		v += strspn(v, " \t");
		if (*v != '=')
			continue;
		v++;
		v += strspn(v, " \t");
		if (*v == '"')
		{
			const char *end = strchr(v + 1, '"');

			return end && end > v + 1 ? xstrndup(v + 1, (size_t) (end - v - 1)) : NULL;
		}
		if (strcspn(v, "; \t\r\n") > 0)
			return xstrndup(v, strcspn(v, "; \t\r\n"));
	}
	return NULL;
}

/* Does line occur at the start of a line of body (followed by an end of line, space or the end)? */
static bool
guard_line(const struct buf *body, const char *line)
{
	size_t len = strlen(line);

	for (size_t i = 0; i + len <= body->len; i++)
		if ((i == 0 || body->data[i - 1] == '\n') && memcmp(body->data + i, line, len) == 0
			&& (i + len == body->len || body->data[i + len] == '\r' || body->data[i + len] == '\n'
				|| body->data[i + len] == ' ' || body->data[i + len] == '\t'))
			return true;
	return false;
}

/* Why the post's top-level MIME structure is broken, or NULL. */
static char *
guard_mime(const struct buf *headers, const struct buf *body)
{
	char *type = header_get(headers->data, headers->len, "Content-Type");
	char *boundary;
	char *line;
	char *why = NULL;

	if (type == NULL || strncasecmp(type + strspn(type, " \t"), "multipart/", 10) != 0)
	{
		free(type);
		return NULL;
	}
	if ((boundary = guard_boundary(type)) == NULL)
	{
		free(type);
		return xstrdup("broken MIME: a multipart Content-Type without a boundary parameter");
	}
	line = xasprintf("--%s", boundary);
	if (!guard_line(body, line))
		why = xasprintf("broken MIME: its boundary \"%s\" never occurs in the body", boundary);
	else
	{
		free(line);
		line = xasprintf("--%s--", boundary);
		if (!guard_line(body, line))
			why = xasprintf("broken MIME: its parts are never closed (no \"--%s--\" line)", boundary);
	}
	free(line);
	free(boundary);
	free(type);
	return why;
}

char *
list_post_suspect(struct pepsi_ctx *ctx, json_t *resolved)
{
	const struct buf *headers = pepsi_headers(ctx);
	const struct buf *body = pepsi_body(ctx);
	json_int_t		  limit = json_integer_value(json_object_get(resolved, "max_post_size"));
	size_t			  size = headers->len + 2 + body->len;

	if (limit > 0 && size > (size_t) limit)
		return xasprintf("the post is %zu bytes, over the list's max_post_size of %lld", size, (long long) limit);
	return guard_mime(headers, body);
}
