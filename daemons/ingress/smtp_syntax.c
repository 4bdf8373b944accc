/*
 * smtp_syntax.c: the syntax of what an SMTP client sends (RFC 5321 4.1.2
 * paths and mailboxes, RFC 3461 xtext, UTF-8 for SMTPUTF8; AUTH's base64
 * is common/base/base64.c's strict mode).  Pure functions of their input: the state machine in smtp.c
 * calls them, the unit tests in tests/ feed them vectors.
 */
#include "smtp_syntax.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "smtp.h"
#include "smtp/smtp_address.h"

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
