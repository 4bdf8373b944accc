/*
 * spf_expand.c: macro expansion (RFC 7208 7.2 to 7.4): a macro-string
 * that spf_parse.c found valid, expanded against one check's identity,
 * client address and, for %{p}, its validated name.  Apart from spf.c,
 * which decides when to expand and looks %{p} up when it is needed.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "auth/spf_internal.h"
#include "base/buf.h"
#include "base/xalloc.h"

static void
spf_url_escape(struct buf *out, const char *s, size_t len)
{
	for (size_t i = 0; i < len; i++)
	{
		unsigned char ch = (unsigned char) s[i];

		if (spf_is_alnum((char) ch) || ch == '-' || ch == '.' || ch == '_' || ch == '~')
			buf_append_char(out, (char) ch);
		else
			buf_printf(out, "%%%02X", ch);
	}
}

/* The value of a macro letter; NULL for %{p} while it is not known. */
static char *
spf_macro_value(const struct spf_check *c, char letter, const char *domain)
{
	char buf[128];

	switch (tolower((unsigned char) letter))
	{
		case 's':
			return xstrdup(c->sender);
		case 'l':
			return xstrdup(c->local_part);
		case 'o':
			return xstrdup(c->sender_domain);
		case 'd':
			return xstrdup(domain);
		case 'h':
			return xstrdup(c->helo ? c->helo : "unknown");
		case 'r':
			return xstrdup(c->receiver ? c->receiver : "unknown");
		case 't':
			snprintf(buf, sizeof(buf), "%lld", (long long) time(NULL));
			return xstrdup(buf);
		case 'v':
			return xstrdup(c->ip.family == 4 ? "in-addr" : "ip6");
		case 'c':
			if (c->ip.family == 4)
				inet_ntop(AF_INET, c->ip.addr, buf, sizeof(buf));
			else
				inet_ntop(AF_INET6, c->ip.addr, buf, sizeof(buf));
			return xstrdup(buf);
		case 'i':
			if (c->ip.family == 4)
				inet_ntop(AF_INET, c->ip.addr, buf, sizeof(buf));
			else
			{
				/* Upper case, as RFC 7208 7.4's example and the test suite have it. */
				static const char hex[] = "0123456789ABCDEF";
				size_t			  pos = 0;

				for (int i = 0; i < 16; i++)
				{
					buf[pos++] = hex[c->ip.addr[i] >> 4];
					buf[pos++] = '.';
					buf[pos++] = hex[c->ip.addr[i] & 0xf];
					buf[pos++] = '.';
				}
				buf[pos - 1] = '\0';
			}
			return xstrdup(buf);
		case 'p':
			return c->p_value ? xstrdup(c->p_value) : NULL;
	}
	return xstrdup("");
}

/* Split value at the delimiters, reverse, keep the rightmost keep parts, join with dots. */
static void
spf_transform(struct buf *out, const char *value, const char *delimiters, size_t ndelim,
			  long keep, bool reverse, bool escape)
{
	const char *parts[512];
	size_t		lens[512];
	size_t		n = 0,
		   first;
	const char *p = value;
	struct buf	joined = BUF_INIT;

	for (;;)
	{
		const char *q = p;

		while (*q && !(ndelim ? memchr(delimiters, *q, ndelim) != NULL : *q == '.'))
			q++;
		if (n < 512)
		{
			parts[n] = p;
			lens[n] = (size_t) (q - p);
			n++;
		}
		if (*q == '\0')
			break;
		p = q + 1;
	}
	if (reverse)
		for (size_t i = 0; i < n / 2; i++)
		{
			const char *tp = parts[i];
			size_t		tl = lens[i];

			parts[i] = parts[n - 1 - i];
			lens[i] = lens[n - 1 - i];
			parts[n - 1 - i] = tp;
			lens[n - 1 - i] = tl;
		}
	first = keep > 0 && (size_t) keep < n ? n - (size_t) keep : 0;
	for (size_t i = first; i < n; i++)
	{
		if (i > first)
			buf_append_char(&joined, '.');
		buf_append(&joined, parts[i], lens[i]);
	}
	if (escape)
		spf_url_escape(out, joined.data ? joined.data : "", joined.len);
	else if (joined.len)
		buf_append(out, joined.data, joined.len);
	buf_free(&joined);
}

/* Expand a macro-string already checked by spf_macro_valid. */
enum spf_expand_status
spf_expand(const struct spf_check *c, const char *spec, const char *domain, char **out)
{
	struct buf	b = BUF_INIT;
	const char *s = spec;

	while (*s)
	{
		if (*s != '%')
		{
			buf_append_char(&b, *s++);
			continue;
		}
		if (s[1] == '%' || s[1] == '_' || s[1] == '-')
		{
			buf_append_str(&b, s[1] == '%' ? "%" : s[1] == '_' ? " "
															   : "%20");
			s += 2;
			continue;
		}
		if (s[1] != '{')
		{
			/* Not valid: spf_macro_valid refused it already; keep it literal. */
			buf_append_char(&b, *s++);
			continue;
		}
		{
			char		letter = s[2];
			long		keep = 0;
			bool		reverse = false;
			const char *delim;
			char	   *value;

			s += 3;
			while (isdigit((unsigned char) *s))
			{
				keep = keep * 10 + (*s - '0');
				if (keep > 128)
					keep = 128;
				s++;
			}
			if (*s == 'r' || *s == 'R')
			{
				reverse = true;
				s++;
			}
			delim = s;
			while (*s && *s != '}')
				s++;
			if ((value = spf_macro_value(c, letter, domain)) == NULL)
			{
				buf_free(&b);
				return SPF_EXPAND_NEED_P;
			}
			spf_transform(&b, value, delim, (size_t) (s - delim), keep, reverse,
						  isupper((unsigned char) letter));
			free(value);
			if (*s == '}')
				s++;
		}
	}
	*out = b.data ? b.data : xstrdup("");
	return SPF_EXPAND_OK;
}

/* RFC 7208 4.8: an expansion longer than 253 octets loses labels from the left. */
void
spf_truncate_name(char *name)
{
	size_t len = strlen(name);
	char  *p = name;

	if (len && name[len - 1] == '.')
		name[--len] = '\0';
	while (len > SPF_NAME_MAX)
	{
		char *dot = strchr(p, '.');

		if (dot == NULL)
			break;
		len -= (size_t) (dot + 1 - p);
		p = dot + 1;
	}
	memmove(name, p, len + 1);
}


char *
spf_expand_for_test(const char *macro_string, bool explanation)
{
	struct spf_check c;
	char			 reason[256];
	char			*out = NULL;

	if (!spf_macro_valid(macro_string, macro_string + strlen(macro_string), explanation, reason,
						 sizeof(reason)))
		return NULL;
	memset(&c, 0, sizeof(c));
	spf_ip_parse("192.0.2.3", &c.ip);
	c.sender = "strong-bad@email.example.com";
	c.local_part = "strong-bad";
	c.sender_domain = "email.example.com";
	c.helo = "mx.example.org";
	c.receiver = "mx.example.net";
	c.p_value = "unknown";
	spf_expand(&c, macro_string, "email.example.com", &out);
	return out;
}
