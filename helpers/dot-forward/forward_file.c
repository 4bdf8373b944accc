/*
 * forward_file.c: see forward_file.h.
 */
#include "forward_file.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/xalloc.h"

const char *
forward_kind_name(enum forward_kind kind)
{
	switch (kind)
	{
		case FORWARD_ADDRESS:
			return "address";
		case FORWARD_LOCAL:
			return "local";
		case FORWARD_PIPE:
			return "pipe";
		case FORWARD_FILE:
			return "file";
		case FORWARD_INCLUDE:
			return "include";
		case FORWARD_BAD:
			break;
	}
	return "bad";
}

void
forward_list_append(struct forward_list *list, enum forward_kind kind, int line, char *value)
{
	if (list->count == FORWARD_MAX_ENTRIES)
	{
		free(value);
		return;
	}
	if (list->count == FORWARD_MAX_ENTRIES - 1 && kind != FORWARD_BAD)
	{
		free(value);
		kind = FORWARD_BAD;
		value = xasprintf("more than %d entries: the rest is ignored", FORWARD_MAX_ENTRIES - 1);
	}
	list->entries = xrealloc(list->entries, (list->count + 1) * sizeof(*list->entries));
	list->entries[list->count].kind = kind;
	list->entries[list->count].line = line;
	list->entries[list->count].value = value;
	list->count++;
}

static void
forward_bad(struct forward_list *list, int line, const char *why)
{
	forward_list_append(list, FORWARD_BAD, line, xstrdup(why));
}

/* Is any byte of s[0..len) a control character (a tab is one, in an address)? */
static bool
forward_has_control(const char *s, size_t len, bool allow_tab)
{
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) s[i];

		if ((c < 0x20 && !(allow_tab && c == '\t')) || c == 0x7f)
			return true;
	}
	return false;
}

/*
 * An address or a user name: one @ at most with something on each side,
 * none of the characters that delimit addresses in a header or a command
 * line.  Quoted local parts are not supported.
 */
static const char *
forward_address_problem(const char *s, size_t len)
{
	const char *at = memchr(s, '@', len);

	if (len == 0)
		return "an empty address";
	if (len > FORWARD_MAX_ADDRESS)
		return "an address longer than 254 characters";
	for (size_t i = 0; i < len; i++)
		if (strchr(" \t<>()[],;:\"\\", s[i]))
			return "an address with a character it cannot have (quoted local parts are not supported)";
	if (at && (at == s || at == s + len - 1 || memchr(at + 1, '@', (size_t) (s + len - at - 1))))
		return "not an address: local-part@domain, or a user name";
	if (s[0] == '.' || s[0] == '-')
		return "an address that starts with \".\" or \"-\"";
	return NULL;
}

static void
forward_entry(struct forward_list *list, int line, const char *s, size_t len)
{
	const char *problem;

	while (len > 0 && (*s == ' ' || *s == '\t'))
		s++, len--;
	while (len > 0 && (s[len - 1] == ' ' || s[len - 1] == '\t'))
		len--;
	if (len == 0)
		return;
	if (len >= 2 && s[0] == '"' && s[len - 1] == '"')
		s++, len -= 2;
	if (forward_has_control(s, len, s[0] == '|'))
	{
		forward_bad(list, line, "a control character in an entry");
		return;
	}
	if (s[0] == '|')
	{
		s++, len--;
		while (len > 0 && (*s == ' ' || *s == '\t'))
			s++, len--;
		if (len == 0)
			forward_bad(list, line, "a pipe without a command");
		else
			forward_list_append(list, FORWARD_PIPE, line, xstrndup(s, len));
		return;
	}
	if (s[0] == '/')
	{
		if (memchr(s, '"', len))
			forward_bad(list, line, "a file name with a quote");
		else
			forward_list_append(list, FORWARD_FILE, line, xstrndup(s, len));
		return;
	}
	if (len >= 9 && strncasecmp(s, ":include:", 9) == 0)
	{
		s += 9, len -= 9;
		while (len > 0 && (*s == ' ' || *s == '\t'))
			s++, len--;
		if (len == 0 || s[0] != '/')
			forward_bad(list, line, ":include: needs the absolute path of a file");
		else if (memchr(s, '"', len))
			forward_bad(list, line, "a file name with a quote");
		else
			forward_list_append(list, FORWARD_INCLUDE, line, xstrndup(s, len));
		return;
	}
	if (s[0] == '\\')
	{
		s++, len--;
		if ((problem = forward_address_problem(s, len)) != NULL)
			forward_bad(list, line, problem);
		else
			forward_list_append(list, FORWARD_LOCAL, line, xstrndup(s, len));
		return;
	}
	if (len >= 2 && s[0] == '<' && s[len - 1] == '>')
		s++, len -= 2;
	if ((problem = forward_address_problem(s, len)) != NULL)
		forward_bad(list, line, problem);
	else
		forward_list_append(list, FORWARD_ADDRESS, line, xstrndup(s, len));
}

/* One line: its entries, split at commas outside double quotes. */
static void
forward_line(struct forward_list *list, int line, const char *s, size_t len)
{
	const char *start = s;
	bool		quoted = false;
	size_t		i = 0;

	while (i < len && (s[i] == ' ' || s[i] == '\t'))
		i++;
	if (i == len || s[i] == '#')
		return;
	if (memchr(s, '\0', len))
	{
		forward_bad(list, line, "a NUL byte in the line");
		return;
	}
	for (; i < len; i++)
	{
		if (s[i] == '"')
			quoted = !quoted;
		else if (s[i] == ',' && !quoted)
		{
			forward_entry(list, line, start, (size_t) (s + i - start));
			start = s + i + 1;
		}
	}
	if (quoted)
	{
		forward_bad(list, line, "an unterminated double quote");
		return;
	}
	forward_entry(list, line, start, (size_t) (s + len - start));
}

void
forward_parse(const char *text, size_t len, struct forward_list *list)
{
	size_t pos = 0;
	int	   line = 0;

	list->entries = NULL;
	list->count = 0;
	while (pos < len)
	{
		const char *nl = memchr(text + pos, '\n', len - pos);
		size_t		line_len = nl ? (size_t) (nl - text - pos) : len - pos;
		size_t		content = line_len;

		line++;
		if (content > 0 && text[pos + content - 1] == '\r')
			content--;
		if (content > FORWARD_MAX_LINE)
		{
			char why[80];

			snprintf(why, sizeof(why), "a line longer than %d bytes", FORWARD_MAX_LINE);
			forward_bad(list, line, why);
		}
		else
			forward_line(list, line, text + pos, content);
		pos += line_len + (nl ? 1 : 0);
	}
}

void
forward_list_free(struct forward_list *list)
{
	for (size_t i = 0; i < list->count; i++)
		free(list->entries[i].value);
	free(list->entries);
	list->entries = NULL;
	list->count = 0;
}
