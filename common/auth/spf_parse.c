/*
 * spf_parse.c: the syntax of SPF records (RFC 7208 4.6, 5 and 6: terms,
 * mechanisms with their prefix lengths, modifiers) and of macro-strings
 * (7.1).  Apart from the evaluation in spf.c because it needs no check
 * and no DNS: a record is parsed whole before any of it is evaluated, and
 * the fuzz target drives this file alone through spf_record_valid.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "auth/spf_internal.h"
#include "base/xalloc.h"

/*
 * RFC 7208 7.1 toplabel: alphanumerics with at least one letter, or
 * alphanumerics and hyphens neither starting nor ending with a hyphen.
 */
static bool
spf_toplabel_valid(const char *label, size_t len)
{
	bool alpha = false,
		 hyphen = false;

	if (len == 0 || label[0] == '-' || label[len - 1] == '-')
		return false;
	for (size_t i = 0; i < len; i++)
	{
		if (label[i] == '-')
			hyphen = true;
		else if (!spf_is_alnum(label[i]))
			return false;
		else if (isalpha((unsigned char) label[i]))
			alpha = true;
	}
	return alpha || hyphen;
}

static bool
spf_is_delimiter(char ch)
{
	return ch != '\0' && strchr(".-+,/_=", ch) != NULL;
}

/*
 * Check the macro syntax of s (up to end).  explanation allows the c, r
 * and t letters; false with the reason otherwise.
 */
bool
spf_macro_valid(const char *s, const char *end, bool explanation, char *reason, size_t reasonlen)
{
	const char *letters = explanation ? "slodiphcrtv" : "slodiphv";

	while (s < end)
	{
		if ((unsigned char) *s < 0x21 || (unsigned char) *s > 0x7e)
		{
			if (!(explanation && *s == ' '))
			{
				snprintf(reason, reasonlen, "character 0x%02x in a macro string",
						 (unsigned char) *s);
				return false;
			}
		}
		if (*s != '%')
		{
			s++;
			continue;
		}
		if (s + 1 < end && (s[1] == '%' || s[1] == '_' || s[1] == '-'))
		{
			s += 2;
			continue;
		}
		if (s + 1 >= end || s[1] != '{')
		{
			snprintf(reason, reasonlen, "a %% not followed by {, %%, _ or -");
			return false;
		}
		s += 2;
		if (s >= end || strchr(letters, tolower((unsigned char) *s)) == NULL)
		{
			snprintf(reason, reasonlen, "unknown macro letter '%c'", s < end ? *s : '?');
			return false;
		}
		s++;
		if (s < end && isdigit((unsigned char) *s))
		{
			long n = 0;

			while (s < end && isdigit((unsigned char) *s))
			{
				n = n * 10 + (*s - '0');
				if (n > 128)
					n = 128;
				s++;
			}
			if (n == 0)
			{
				snprintf(reason, reasonlen, "a macro transformer of zero");
				return false;
			}
		}
		if (s < end && (*s == 'r' || *s == 'R'))
			s++;
		while (s < end && spf_is_delimiter(*s))
			s++;
		if (s >= end || *s != '}')
		{
			snprintf(reason, reasonlen, "an unterminated or malformed macro");
			return false;
		}
		s++;
	}
	return true;
}

/* RFC 7208 7.1 domain-spec: macro-string, then "." toplabel ["."] or a macro. */
static bool
spf_domain_spec_valid(const char *spec, char *reason, size_t reasonlen)
{
	size_t		len = strlen(spec);
	const char *end = spec + len;
	const char *dot;

	if (len == 0)
	{
		snprintf(reason, reasonlen, "an empty domain");
		return false;
	}
	if (!spf_macro_valid(spec, end, false, reason, reasonlen))
		return false;
	/* Ending in a macro-expand is enough. */
	if (spec[len - 1] == '}'
		|| (len >= 2 && spec[len - 2] == '%' && strchr("%_-", spec[len - 1])
			&& (len < 3 || spec[len - 3] != '%')))
		return true;
	if (spec[len - 1] == '.')
		end--;
	dot = memrchr(spec, '.', (size_t) (end - spec));
	if (dot == NULL || !spf_toplabel_valid(dot + 1, (size_t) (end - dot - 1)))
	{
		snprintf(reason, reasonlen, "\"%s\" does not end in a top-level label", spec);
		return false;
	}
	return true;
}

void
spf_record_free(struct spf_record *r)
{
	for (size_t i = 0; i < r->count; i++)
	{
		free(r->terms[i].domain_spec);
		free(r->terms[i].text);
	}
	free(r->terms);
	free(r->redirect);
	free(r->exp);
	memset(r, 0, sizeof(*r));
}

/* Is this TXT record an SPF record: "v=spf1" then a space or nothing? */
bool
spf_is_record(const char *text, size_t len)
{
	return len >= 6 && strncasecmp(text, "v=spf1", 6) == 0 && (len == 6 || text[6] == ' ');
}

/* A prefix length at *p (no leading zero, at most max); *p moves past it. */
static bool
spf_parse_length(const char **p, int max, int *out)
{
	const char *digits = *p;
	long		n = 0;

	while (isdigit((unsigned char) **p) && *p - digits < 4)
		n = n * 10 + (*(*p)++ - '0');
	if (*p == digits || (*digits == '0' && *p - digits > 1) || n > max)
		return false;
	*out = (int) n;
	return true;
}

/*
 * Where the prefix lengths of an a or mx argument start: the trailing
 * "/digits" and "//digits" parts (a domain-spec may hold '/' itself, as
 * in "a:foo:bar/baz.example.com"); NULL if there are none.
 */
static char *
spf_cidr_suffix(char *arg)
{
	char *end = arg + strlen(arg);
	char *start = NULL;

	for (int part = 0; part < 2; part++)
	{
		char *p = end;

		while (p > arg && isdigit((unsigned char) p[-1]))
			p--;
		if (p == end || p == arg || p[-1] != '/')
			break;
		p--;
		if (p > arg && p[-1] == '/')
		{
			if (part == 1)
				break; /* "//N//M" */
			p--;
		}
		else if (part == 1 && start && start[1] != '/')
			break; /* "/N/M": the ip4 part must be the first */
		start = p;
		end = p;
	}
	return start;
}

/*
 * The prefix lengths at s (its first '/'): "/N//M", "/N" or "//M" for a
 * and mx (dual), "/N" for ip4 and ip6 (single, of that family).
 */
static bool
spf_parse_cidr(const char *s, bool dual, bool ip6, int *cidr4, int *cidr6, char *reason,
			   size_t reasonlen)
{
	*cidr4 = 32;
	*cidr6 = 128;
	if (!dual)
	{
		s++;
		if (!spf_parse_length(&s, ip6 ? 128 : 32, ip6 ? cidr6 : cidr4) || *s)
			goto bad;
		return true;
	}
	if (s[0] == '/' && s[1] != '/')
	{
		s++;
		if (!spf_parse_length(&s, 32, cidr4))
			goto bad;
	}
	if (s[0] == '/' && s[1] == '/')
	{
		s += 2;
		if (!spf_parse_length(&s, 128, cidr6))
			goto bad;
	}
	if (*s == '\0')
		return true;
bad:
	snprintf(reason, reasonlen, "a malformed prefix length");
	return false;
}

static bool
spf_parse_term(const char *text, struct spf_term *t, char *reason, size_t reasonlen)
{
	static const struct
	{
		const char		  *name;
		enum spf_mechanism mechanism;
	} mechanisms[] = {
		{"all", SPF_MECH_ALL}, {"include", SPF_MECH_INCLUDE}, {"a", SPF_MECH_A}, {"mx", SPF_MECH_MX}, {"ptr", SPF_MECH_PTR}, {"ip4", SPF_MECH_IP4}, {"ip6", SPF_MECH_IP6}, {"exists", SPF_MECH_EXISTS}};
	const char *p = text;
	size_t		namelen;
	char	   *arg = NULL;
	bool		found = false;

	memset(t, 0, sizeof(*t));
	t->text = xstrdup(text);
	t->qualifier = SPF_PASS;
	switch (*p)
	{
		case '+':
			p++;
			break;
		case '-':
			t->qualifier = SPF_FAIL;
			p++;
			break;
		case '~':
			t->qualifier = SPF_SOFTFAIL;
			p++;
			break;
		case '?':
			t->qualifier = SPF_NEUTRAL;
			p++;
			break;
	}
	namelen = strcspn(p, ":/");
	for (size_t i = 0; i < sizeof(mechanisms) / sizeof(mechanisms[0]); i++)
		if (strlen(mechanisms[i].name) == namelen && strncasecmp(p, mechanisms[i].name, namelen) == 0)
		{
			t->mechanism = mechanisms[i].mechanism;
			found = true;
		}
	if (!found)
	{
		snprintf(reason, reasonlen, "unknown mechanism \"%.64s\"", text);
		return false;
	}
	p += namelen;
	if (*p == ':')
	{
		arg = xstrdup(p + 1);
		if (*arg == '\0')
		{
			snprintf(reason, reasonlen, "\"%.64s\": an empty argument", text);
			goto bad;
		}
	}
	else if (*p == '/')
		arg = xstrdup(p); /* a prefix length only */
	switch (t->mechanism)
	{
		case SPF_MECH_ALL:
			if (arg)
			{
				snprintf(reason, reasonlen, "\"all\" takes no argument");
				goto bad;
			}
			break;
		case SPF_MECH_INCLUDE:
		case SPF_MECH_EXISTS:
			if (arg == NULL || *p != ':')
			{
				snprintf(reason, reasonlen, "\"%.64s\" needs a domain", text);
				goto bad;
			}
			if (!spf_domain_spec_valid(arg, reason, reasonlen))
				goto bad;
			t->domain_spec = arg;
			return true;
		case SPF_MECH_PTR:
			if (arg && *p != ':')
			{
				snprintf(reason, reasonlen, "\"ptr\" takes no prefix length");
				goto bad;
			}
			if (arg && !spf_domain_spec_valid(arg, reason, reasonlen))
				goto bad;
			t->domain_spec = arg;
			return true;
		case SPF_MECH_A:
		case SPF_MECH_MX:
			t->cidr4 = 32;
			t->cidr6 = 128;
			if (arg)
			{
				char *cidr = spf_cidr_suffix(arg);

				if (cidr)
				{
					if (!spf_parse_cidr(cidr, true, false, &t->cidr4, &t->cidr6, reason, reasonlen))
						goto bad;
					*cidr = '\0';
				}
				if (*p == ':')
				{
					if (!spf_domain_spec_valid(arg, reason, reasonlen))
						goto bad;
					t->domain_spec = arg;
					arg = NULL;
				}
				else if (*arg)
				{
					snprintf(reason, reasonlen, "\"%.64s\": a malformed prefix length", text);
					goto bad;
				}
			}
			free(arg);
			return true;
		case SPF_MECH_IP4:
		case SPF_MECH_IP6:
			{
				bool  four = t->mechanism == SPF_MECH_IP4;
				char *cidr;

				if (arg == NULL || *p != ':')
				{
					snprintf(reason, reasonlen, "\"%.64s\" needs a network", text);
					goto bad;
				}
				cidr = strchr(arg, '/');
				t->cidr4 = 32;
				t->cidr6 = 128;
				if (cidr)
				{
					if (!spf_parse_cidr(cidr, false, !four, &t->cidr4, &t->cidr6, reason, reasonlen))
						goto bad;
					*cidr = '\0';
				}
				if (inet_pton(four ? AF_INET : AF_INET6, arg, t->network) != 1)
				{
					snprintf(reason, reasonlen, "\"%.64s\": not an IPv%c network", text,
							 four ? '4' : '6');
					goto bad;
				}
				free(arg);
				return true;
			}
	}
	free(arg);
	return true;
bad:
	free(arg);
	return false;
}

/* Parse a record known to start with "v=spf1"; false with the reason. */
bool
spf_parse(const char *text, size_t len, struct spf_record *r, char *reason, size_t reasonlen)
{
	char *copy;
	char *p;
	bool  ok = true;

	memset(r, 0, sizeof(*r));
	for (size_t i = 0; i < len; i++)
		if ((unsigned char) text[i] < 0x20 || (unsigned char) text[i] > 0x7e)
		{
			snprintf(reason, reasonlen, "character 0x%02x in the record", (unsigned char) text[i]);
			return false;
		}
	copy = xstrndup(text + 6, len - 6);
	p = copy;
	while (ok)
	{
		char  *term;
		size_t namelen;

		while (*p == ' ')
			p++;
		if (*p == '\0')
			break;
		term = p;
		while (*p && *p != ' ')
			p++;
		if (*p)
			*p++ = '\0';
		/* A modifier: name "=" macro-string, the name starting with a letter. */
		namelen = 0;
		if (isalpha((unsigned char) term[0]))
			namelen = strspn(term, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.");
		if (namelen > 0 && term[namelen] == '=')
		{
			char  *value = term + namelen + 1;
			char **slot = NULL;

			if (namelen == 8 && strncasecmp(term, "redirect", 8) == 0)
				slot = &r->redirect;
			else if (namelen == 3 && strncasecmp(term, "exp", 3) == 0)
				slot = &r->exp;
			if (slot && *slot)
			{
				snprintf(reason, reasonlen, "%.*s= given twice", (int) namelen, term);
				ok = false;
			}
			else if (slot)
			{
				if ((ok = spf_domain_spec_valid(value, reason, reasonlen)))
					*slot = xstrdup(value);
			}
			else
				ok = spf_macro_valid(value, value + strlen(value), true, reason, reasonlen);
			continue;
		}
		r->terms = xrealloc(r->terms, (r->count + 1) * sizeof(*r->terms));
		if (spf_parse_term(term, &r->terms[r->count], reason, reasonlen))
			r->count++;
		else
		{
			free(r->terms[r->count].text);
			ok = false;
		}
	}
	free(copy);
	if (!ok)
		spf_record_free(r);
	return ok;
}

bool
spf_record_valid(const char *text, char *reason, size_t reasonlen)
{
	struct spf_record r;
	size_t			  len = strlen(text);

	if (!spf_is_record(text, len))
	{
		snprintf(reason, reasonlen, "not an SPF record");
		return false;
	}
	if (!spf_parse(text, len, &r, reason, reasonlen))
		return false;
	spf_record_free(&r);
	return true;
}
