/* smtp_address.c: see smtp_address.h. */
#include "smtp/smtp_address.h"

#include <ctype.h>
#include <stdint.h>
#include <string.h>

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
