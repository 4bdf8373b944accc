/* mx.c: see mx.h. */
#include "mx.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <idn2.h>

#include "base/xalloc.h"

char *
mx_domain_to_ascii(const char *domain)
{
	char  *ascii = NULL;
	size_t len;
	bool   plain = true;

	if (domain == NULL || *domain == '\0')
		return NULL;
	for (const unsigned char *p = (const unsigned char *) domain; *p; p++)
		if (*p >= 0x80)
			plain = false;
	if (plain)
		ascii = xstrdup(domain);
	else
	{
		char *converted = NULL;

		/* UTS #46 non-transitional, as browsers and the other MTAs map names. */
		if (idn2_to_ascii_8z(domain, &converted, IDN2_NONTRANSITIONAL | IDN2_NFC_INPUT) != IDN2_OK)
			return NULL;
		ascii = xstrdup(converted);
		idn2_free(converted);
	}
	len = strlen(ascii);
	if (len > 0 && ascii[len - 1] == '.')
		ascii[--len] = '\0';
	for (char *p = ascii; *p; p++)
	{
		*p = (char) tolower((unsigned char) *p);
		if (!(isalnum((unsigned char) *p) || *p == '-' || *p == '.' || *p == '_'))
		{
			free(ascii);
			return NULL;
		}
	}
	if (len == 0 || len > 253 || ascii[0] == '.' || strstr(ascii, "..") != NULL)
	{
		free(ascii);
		return NULL;
	}
	return ascii;
}

bool
mx_address_is_self(const struct mx_self *self, const char *address)
{
	unsigned char a[16];
	unsigned char b[16];
	int			  family = strchr(address, ':') ? AF_INET6 : AF_INET;
	size_t		  n = family == AF_INET6 ? 16 : 4;

	if (self->addresses == NULL || inet_pton(family, address, a) != 1)
		return false;
	for (char **s = self->addresses; *s; s++)
	{
		int other = strchr(*s, ':') ? AF_INET6 : AF_INET;

		if (other == family && inet_pton(family, *s, b) == 1 && memcmp(a, b, n) == 0)
			return true;
	}
	return false;
}

static bool
mx_name_is_self(const struct mx_self *self, const char *name)
{
	return self->hostname && strcasecmp(self->hostname, name) == 0;
}

static int
mx_host_compare(const void *a, const void *b)
{
	const struct mx_host *x = a;
	const struct mx_host *y = b;

	return x->preference < y->preference ? -1 : x->preference > y->preference;
}

/* Equal preferences in random order (RFC 5321 5.1), so the load spreads. */
static void
mx_shuffle_equal(struct mx_host *hosts, size_t n)
{
	for (size_t start = 0; start < n;)
	{
		size_t end = start + 1;

		while (end < n && hosts[end].preference == hosts[start].preference)
			end++;
		for (size_t i = end - 1; i > start; i--)
		{
			size_t		   j = start + (size_t) random() % (i - start + 1);
			struct mx_host swap = hosts[i];

			hosts[i] = hosts[j];
			hosts[j] = swap;
		}
		start = end;
	}
}

static void
mx_fail(struct mx_route *route, enum mx_status status, const char *fmt, const char *domain)
{
	route->status = status;
	snprintf(route->reason, sizeof(route->reason), fmt, domain);
}

/* No MX records: the domain itself, if it has an address (RFC 5321 5.1). */
static void
mx_implicit(struct dns_resolver *resolver, const char *domain, struct mx_route *route)
{
	struct dns_answer a4;
	struct dns_answer a6;
	bool			  any;

	dns_resolve_sync(resolver, domain, DNS_TYPE_A, &a4);
	dns_resolve_sync(resolver, domain, DNS_TYPE_AAAA, &a6);
	any = (a4.status == DNS_OK && a4.count > 0) || (a6.status == DNS_OK && a6.count > 0);
	if (any)
	{
		route->status = MX_OK;
		route->implicit = true;
		route->secure = route->secure && a4.secure && (a6.status != DNS_OK || a6.secure);
		route->hosts = xcalloc(1, sizeof(*route->hosts));
		route->hosts[0].name = xstrdup(domain);
		route->nhosts = 1;
	}
	else if (a4.status == DNS_TEMPFAIL || a4.status == DNS_TIMEOUT || a6.status == DNS_TEMPFAIL
			 || a6.status == DNS_TIMEOUT)
		mx_fail(route, MX_TEMPFAIL, "cannot look up the address of %s: the DNS did not answer", domain);
	else
		mx_fail(route, MX_NO_HOST, "%s has no MX and no address", domain);
	dns_answer_free(&a4);
	dns_answer_free(&a6);
}

void
mx_route_lookup(struct dns_resolver *resolver, const char *domain, const struct mx_self *self,
				size_t max_hosts, struct mx_route *route)
{
	struct dns_answer answer;
	size_t			  nmx = 0;
	bool			  null_mx = false;

	memset(route, 0, sizeof(*route));
	dns_resolve_sync(resolver, domain, DNS_TYPE_MX, &answer);
	switch (answer.status)
	{
		case DNS_NXDOMAIN:
			mx_fail(route, MX_NO_HOST, "the domain %s does not exist", domain);
			dns_answer_free(&answer);
			return;
		case DNS_TEMPFAIL:
		case DNS_TIMEOUT:
			mx_fail(route, MX_TEMPFAIL,
					answer.status == DNS_TIMEOUT ? "the MX lookup of %s timed out"
												 : "the MX lookup of %s failed (SERVFAIL or no answer)",
					domain);
			dns_answer_free(&answer);
			return;
		case DNS_OK:
			break;
	}
	route->secure = answer.secure;
	route->hosts = xcalloc(answer.count + 1, sizeof(*route->hosts));
	for (size_t i = 0; i < answer.count; i++)
	{
		const struct dns_record *r = &answer.records[i];

		/* A CNAME on the way is the resolver's business; a name no host has is skipped. */
		if (r->type != DNS_TYPE_MX || r->text == NULL)
			continue;
		if (strcmp(r->text, ".") == 0 || r->text[0] == '\0')
		{
			null_mx = true;
			continue;
		}
		route->hosts[nmx].name = xstrdup(r->text);
		route->hosts[nmx].preference = r->preference;
		nmx++;
	}
	dns_answer_free(&answer);
	route->nhosts = nmx;
	/* RFC 7505 3: a null MX is the only MX of its domain; mixed, the real ones win. */
	if (null_mx && nmx == 0)
	{
		mx_fail(route, MX_NULL, "%s does not accept mail (null MX, RFC 7505)", domain);
		return;
	}
	if (nmx == 0)
	{
		free(route->hosts);
		route->hosts = NULL;
		mx_implicit(resolver, domain, route);
		return;
	}
	qsort(route->hosts, nmx, sizeof(*route->hosts), mx_host_compare);
	mx_shuffle_equal(route->hosts, nmx);
	/* We are an MX of the domain: only the hosts preferred to us (RFC 5321 5.1). */
	for (size_t i = 0; i < nmx; i++)
		if (mx_name_is_self(self, route->hosts[i].name))
		{
			unsigned ours = route->hosts[i].preference;
			size_t	 kept = 0;

			while (kept < nmx && route->hosts[kept].preference < ours)
				kept++;
			for (size_t j = kept; j < nmx; j++)
				free(route->hosts[j].name);
			route->nhosts = nmx = kept;
			if (kept == 0)
			{
				mx_fail(route, MX_LOOP, "mail for %s loops back to myself (the best MX is this host)", domain);
				return;
			}
			break;
		}
	if (nmx > max_hosts)
	{
		for (size_t j = max_hosts; j < nmx; j++)
			free(route->hosts[j].name);
		route->nhosts = max_hosts;
	}
	route->status = MX_OK;
}

void
mx_route_free(struct mx_route *route)
{
	for (size_t i = 0; i < route->nhosts; i++)
		free(route->hosts[i].name);
	free(route->hosts);
	memset(route, 0, sizeof(*route));
}
