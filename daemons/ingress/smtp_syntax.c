/*
 * smtp_syntax.c: the syntax of what an SMTP client sends (RFC 5321 4.1.2
 * paths and mailboxes, RFC 3461 xtext, RFC 4648 base64 for AUTH, UTF-8 for
 * SMTPUTF8).  Pure functions of their input: the state machine in smtp.c
 * calls them, the unit tests in tests/ feed them vectors.
 */
#include "smtp_syntax.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "smtp.h"

bool
smtp_utf8_valid(const char *str, size_t len)
{
	const unsigned char *p = (const unsigned char *) str;
	const unsigned char *end = p + len;

	while (p < end)
	{
		unsigned c = *p++;
		int		 more;
		uint32_t cp;

		if (c < 0x80)
			continue;
		if (c >= 0xc2 && c <= 0xdf)
			more = 1, cp = c & 0x1f;
		else if (c >= 0xe0 && c <= 0xef)
			more = 2, cp = c & 0x0f;
		else if (c >= 0xf0 && c <= 0xf4)
			more = 3, cp = c & 0x07;
		else
			return false;
		if (end - p < more)
			return false;
		for (int i = 0; i < more; i++, p++)
		{
			if ((*p & 0xc0) != 0x80)
				return false;
			cp = (cp << 6) | (*p & 0x3f);
		}
		if ((more == 2 && cp < 0x800) || (more == 3 && (cp < 0x10000 || cp > 0x10ffff))
			|| (cp >= 0xd800 && cp <= 0xdfff))
			return false;
	}
	return true;
}

bool
smtp_atext(unsigned char c, bool utf8)
{
	return isalnum(c) || strchr("!#$%&'*+-/=?^_`{|}~", c) != NULL || (utf8 && c >= 0x80);
}

/* A domain or an address literal, RFC 5321 4.1.2 (U-labels with SMTPUTF8). */
bool
smtp_domain_valid(const char *d, size_t len, bool utf8)
{
	size_t label = 0;

	if (len == 0 || len > 255)
		return false;
	if (d[0] == '[')
	{
		if (len < 3 || d[len - 1] != ']')
			return false;
		for (size_t i = 1; i + 1 < len; i++)
			if (d[i] < 33 || d[i] > 126 || d[i] == '[' || d[i] == ']' || d[i] == '\\')
				return false;
		return true;
	}
	for (size_t i = 0; i < len; i++)
	{
		unsigned char c = (unsigned char) d[i];

		if (c == '.')
		{
			if (label == 0)
				return false;
			label = 0;
			continue;
		}
		if (!isalnum(c) && c != '-' && c != '_' && !(utf8 && c >= 0x80))
			return false;
		if (++label > 63 && !utf8)
			return false;
	}
	return label > 0 || len > 1; /* a trailing dot is tolerated, a lone one not */
}

bool
smtp_mailbox_valid(const char *mailbox, bool utf8)
{
	size_t		len = strlen(mailbox);
	const char *at;
	size_t		local;

	if (len == 0 || len > SMTP_PATH_MAX || !smtp_utf8_valid(mailbox, len))
		return false;
	if (mailbox[0] == '"')
	{
		size_t i = 1;

		for (; i < len && mailbox[i] != '"'; i++)
		{
			unsigned char c = (unsigned char) mailbox[i];

			if (c == '\\')
			{
				if (++i >= len || mailbox[i] < 32 || mailbox[i] > 126)
					return false;
			}
			else if (c < 32 || c == 127 || (c >= 0x80 && !utf8))
				return false;
		}
		if (i >= len)
			return false;
		at = mailbox + i + 1;
		if (*at != '@')
			return false;
	}
	else
	{
		at = strrchr(mailbox, '@');
		if (at == NULL || at == mailbox)
			return false;
		for (const char *p = mailbox; p < at; p++)
			if (*p != '.' && !smtp_atext((unsigned char) *p, utf8))
				return false;
	}
	local = (size_t) (at - mailbox);
	if (local > 64 && !utf8)
		return false;
	return smtp_domain_valid(at + 1, len - local - 1, utf8);
}

long
smtp_base64_decode(const char *in, size_t len, char *out, size_t outlen)
{
	static const char alphabet[] =
		"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	uint32_t acc = 0;
	size_t	 n = 0;
	size_t	 pad = 0;

	if (len % 4 != 0)
		return -1;
	for (size_t i = 0; i < len; i++)
	{
		const char *p;

		if (in[i] == '=')
		{
			if (i + 2 < len || ++pad > 2)
				return -1;
			acc <<= 6;
		}
		else
		{
			if (pad || in[i] == '\0' || (p = strchr(alphabet, in[i])) == NULL)
				return -1;
			acc = (acc << 6) | (uint32_t) (p - alphabet);
		}
		if (i % 4 == 3)
		{
			unsigned char bytes[3] = {acc >> 16, (acc >> 8) & 0xff, acc & 0xff};
			size_t		  take = 3 - (i + 1 == len ? pad : 0);

			if (n + take > outlen)
				return -1;
			memcpy(out + n, bytes, take);
			n += take;
			acc = 0;
		}
	}
	return (long) n;
}

/* RFC 3461 xtext, decoded in place; false if malformed or a control character. */
bool
smtp_xtext_decode(char *s, bool utf8)
{
	char *w = s;

	for (const char *r = s; *r; r++)
	{
		unsigned char c = (unsigned char) *r;

		if (c == '+')
		{
			unsigned v;

			if (!isxdigit((unsigned char) r[1]) || !isxdigit((unsigned char) r[2])
				|| sscanf(r + 1, "%2x", &v) != 1 || v < 32 || v > 126)
				return false;
			*w++ = (char) v;
			r += 2;
		}
		else if ((c >= 33 && c <= 126 && c != '=') || (utf8 && c >= 0x80))
			*w++ = (char) c;
		else
			return false;
	}
	*w = '\0';
	return smtp_utf8_valid(s, strlen(s));
}

/*
 * "<path>" at *p: the mailbox without brackets and source route into out.
 * Returns false on a syntax error.  *p is left after the '>'.
 */
bool
smtp_parse_path(char **p, char *out, size_t outlen)
{
	char  *s = *p;
	bool   quoted = false;
	size_t n = 0;

	if (*s == ' ') /* "MAIL FROM: <a@b>" is common enough to allow */
		s++;
	if (*s++ != '<')
		return false;
	if (*s == '@') /* an obsolete source route: @a,@b:mailbox */
	{
		char *colon = strchr(s, ':');

		if (colon == NULL)
			return false;
		s = colon + 1;
	}
	for (; *s; s++)
	{
		if (*s == '"' && (n == 0 || out[n - 1] != '\\' || !quoted))
			quoted = !quoted;
		else if (*s == '>' && !quoted)
			break;
		if (n + 1 >= outlen)
			return false;
		out[n++] = *s;
	}
	if (*s != '>')
		return false;
	out[n] = '\0';
	*p = s + 1;
	return true;
}

/* The next "KEY[=VALUE]" of a parameter list; NULL at the end. */
char *
smtp_next_param(char **p, char **value)
{
	char *s = *p;
	char *key;

	while (*s == ' ')
		s++;
	if (*s == '\0')
		return NULL;
	key = s;
	while (*s && *s != ' ')
		s++;
	if (*s)
		*s++ = '\0';
	*p = s;
	*value = strchr(key, '=');
	if (*value)
		*(*value)++ = '\0';
	return key;
}
