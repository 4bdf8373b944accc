/*
 * milter_message.c: the message as the filters of a MILTERS list see and edit it.
 *
 * The header block is kept as a list so that the filters' header edits
 * (by position, by the nth occurrence of a name) apply the way Sendmail
 * and Postfix apply them; the row's columns are rebuilt from it only when
 * something changed, so an untouched message is written back untouched.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "message/milter_filter.h"

static void
message_append_header(struct milter_message *m, char *name, char *value)
{
	m->headers = xrealloc(m->headers, (m->nheaders + 1) * sizeof(*m->headers));
	m->headers[m->nheaders].name = name;
	m->headers[m->nheaders].value = value;
	m->nheaders++;
}

/* Split the stored block into fields; a line without a colon stays as it is (name NULL). */
static void
message_parse_headers(struct milter_message *m, const char *headers, size_t hlen)
{
	const char *p = headers;
	const char *end = headers + hlen;

	while (p < end)
	{
		const char *line_end = p;
		const char *colon;

		/* the field: up to a CRLF (or LF) not followed by white space */
		for (;;)
		{
			const char *nl = memchr(line_end, '\n', (size_t) (end - line_end));

			if (nl == NULL)
			{
				line_end = end;
				break;
			}
			line_end = nl + 1;
			if (line_end >= end || (*line_end != ' ' && *line_end != '\t'))
				break;
		}
		colon = memchr(p, ':', (size_t) (line_end - p));
		if (colon && colon > p && memchr(p, '\n', (size_t) (colon - p)) == NULL)
		{
			size_t vlen = (size_t) (line_end - colon - 1);

			/* the value without its final line end */
			if (vlen && colon[vlen] == '\n')
				vlen--;
			if (vlen && colon[vlen] == '\r')
				vlen--;
			message_append_header(m, xstrndup(p, (size_t) (colon - p)), xstrndup(colon + 1, vlen));
		}
		else
		{
			size_t len = (size_t) (line_end - p);

			while (len && (p[len - 1] == '\n' || p[len - 1] == '\r'))
				len--;
			message_append_header(m, NULL, xstrndup(p, len));
		}
		p = line_end;
	}
}

void
milter_message_init(struct milter_message *m, const char *headers, size_t hlen, const char *body,
					size_t blen, const char *mail_from, const char *const *rcpt, size_t nrcpt)
{
	memset(m, 0, sizeof(*m));
	message_parse_headers(m, headers, hlen);
	buf_append(&m->body, body, blen);
	m->mail_from = xstrdup(mail_from);
	m->rcpt = xcalloc(nrcpt ? nrcpt : 1, sizeof(*m->rcpt));
	for (size_t i = 0; i < nrcpt; i++)
		m->rcpt[i].address = xstrdup(rcpt[i]);
	m->nrcpt = nrcpt;
}

static void
message_free_list(char **list, size_t count)
{
	for (size_t i = 0; i < count; i++)
		free(list[i]);
	free(list);
}

void
milter_message_free(struct milter_message *m)
{
	for (size_t i = 0; i < m->nheaders; i++)
	{
		free(m->headers[i].name);
		free(m->headers[i].value);
	}
	free(m->headers);
	buf_free(&m->body);
	free(m->mail_from);
	for (size_t i = 0; i < m->nrcpt; i++)
	{
		free(m->rcpt[i].address);
		free(m->rcpt[i].reply);
		free(m->rcpt[i].filter);
	}
	free(m->rcpt);
	message_free_list(m->deleted, m->ndeleted);
	message_free_list(m->added, m->nadded);
	free(m->quarantine);
	memset(m, 0, sizeof(*m));
}

void
milter_message_headers(const struct milter_message *m, struct buf *out)
{
	for (size_t i = 0; i < m->nheaders; i++)
	{
		if (m->headers[i].name)
		{
			buf_append_str(out, m->headers[i].name);
			buf_append_char(out, ':');
		}
		buf_append_str(out, m->headers[i].value);
		buf_append_str(out, "\r\n");
	}
}

char *
milter_header_for_filter(const char *value, bool leadspc)
{
	struct buf out = BUF_INIT;

	if (!leadspc)
		value += strspn(value, " \t");
	for (const char *c = value; *c; c++)
		if (!(*c == '\r' && c[1] == '\n'))
			buf_append_char(&out, *c);
	buf_append(&out, "", 0);
	return out.data ? out.data : xstrdup("");
}

/* A filter's value as stored: folds as CRLF, and the space after the colon. */
static char *
message_value_from_filter(const char *value, bool leadspc)
{
	struct buf out = BUF_INIT;

	if (!leadspc)
		buf_append_char(&out, ' ');
	for (const char *c = value; *c; c++)
	{
		if (*c == '\r')
			continue; /* milter.c let it through only before a LF */
		if (*c == '\n')
			buf_append_char(&out, '\r');
		buf_append_char(&out, *c);
	}
	buf_append(&out, "", 0);
	return out.data ? out.data : xstrdup("");
}

void
milter_message_add_header(struct milter_message *m, const char *name, const char *value, bool leadspc)
{
	message_append_header(m, xstrdup(name), message_value_from_filter(value, leadspc));
	m->headers_changed = true;
}

void
milter_message_insert_header(struct milter_message *m, uint32_t position, const char *name,
							 const char *value, bool leadspc)
{
	size_t at = position < m->nheaders ? position : m->nheaders;

	message_append_header(m, NULL, NULL);
	memmove(&m->headers[at + 1], &m->headers[at], (m->nheaders - 1 - at) * sizeof(*m->headers));
	m->headers[at].name = xstrdup(name);
	m->headers[at].value = message_value_from_filter(value, leadspc);
	m->headers_changed = true;
}

/*
 * The occurrence-th (1-based; 0 counts as 1, as Sendmail has it) header
 * of that name gets the value; an empty value deletes it.  A missing one
 * is added, as Sendmail and Postfix do.
 */
void
milter_message_change_header(struct milter_message *m, uint32_t occurrence, const char *name,
							 const char *value, bool leadspc)
{
	uint32_t seen = 0;

	if (occurrence == 0)
		occurrence = 1;
	for (size_t i = 0; i < m->nheaders; i++)
	{
		if (m->headers[i].name == NULL || strcasecmp(m->headers[i].name, name) != 0)
			continue;
		if (++seen != occurrence)
			continue;
		free(m->headers[i].value);
		if (*value == '\0')
		{
			free(m->headers[i].name);
			memmove(&m->headers[i], &m->headers[i + 1], (m->nheaders - i - 1) * sizeof(*m->headers));
			m->nheaders--;
		}
		else
			m->headers[i].value = message_value_from_filter(value, leadspc);
		m->headers_changed = true;
		return;
	}
	if (*value != '\0')
		milter_message_add_header(m, name, value, leadspc);
}

/* Line ends as the row stores them: CRLF, whatever the filter wrote. */
void
milter_message_body_chunk(struct milter_message *m, const char *data, size_t len, bool first)
{
	if (first)
	{
		buf_reset(&m->body);
		m->body_changed = true;
	}
	for (size_t i = 0; i < len; i++)
	{
		if (data[i] == '\n' && (i == 0 ? m->body.len == 0 || m->body.data[m->body.len - 1] != '\r' : data[i - 1] != '\r'))
			buf_append_char(&m->body, '\r');
		buf_append_char(&m->body, data[i]);
	}
}

char *
milter_bare_address(const char *address)
{
	size_t len = strlen(address);

	if (len >= 2 && address[0] == '<' && address[len - 1] == '>')
		return xstrndup(address + 1, len - 2);
	return xstrdup(address);
}

void
milter_message_change_from(struct milter_message *m, const char *address)
{
	free(m->mail_from);
	m->mail_from = milter_bare_address(address);
	m->mail_from_changed = true;
}

void
milter_message_add_rcpt(struct milter_message *m, const char *address)
{
	m->added = xrealloc(m->added, (m->nadded + 1) * sizeof(char *));
	m->added[m->nadded++] = milter_bare_address(address);
}

void
milter_message_delete_rcpt(struct milter_message *m, const char *address)
{
	m->deleted = xrealloc(m->deleted, (m->ndeleted + 1) * sizeof(char *));
	m->deleted[m->ndeleted++] = milter_bare_address(address);
}
