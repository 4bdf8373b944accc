/*
 * addresses.c: which addresses a relay-to-internet worker connects to.
 * An MX host's addresses come from pepsi.dns_address while within their
 * TTL and not all failing, else from the DNS afresh (and are stored there
 * for the other workers), best first by ADDRESS_PREFERENCE and health;
 * this host's own addresses (its listeners on SMTP_PORT) tell an MX host
 * that is us.
 */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/xalloc.h"
#include "config/config.h"
#include "internet.h"

struct mx_self internet_self;
static bool	   internet_self_done;

bool
internet_self_loaded(void)
{
	return internet_self_done;
}

/* ---------------------------------------------------------------------------
 * What is this host: its name and the addresses it takes mail on
 * ------------------------------------------------------------------------- */

static void
internet_self_add(char ***list, size_t *n, const char *address)
{
	*list = xrealloc(*list, (*n + 2) * sizeof(char *));
	(*list)[(*n)++] = xstrdup(address);
	(*list)[*n] = NULL;
}

/*
 * The addresses of the listeners on SMTP_PORT: an MX host at one of them
 * is this host.  A listener on every address contributes the interfaces'.
 */
void
internet_self_load(struct pepsi_ctx *ctx)
{
	const struct pepsi_config *cfg = pepsi_config(ctx);
	long long				   port = pepsi_option_int(ctx, "SMTP_PORT");
	char					 **list = NULL;
	size_t					   n = 0;
	bool					   wildcard = false;
	const char				  *listeners[64];
	size_t					   nlisteners = config_sections(cfg, "listener-", listeners, 64);

	internet_self.hostname = config_hostname(cfg);
	for (size_t s = 0; s < nlisteners; s++)
	{
		const char *section = listeners[s];
		const char *address;
		const char *listen_port;

		address = config_get(cfg, section, "ADDRESS");
		listen_port = config_get(cfg, section, "PORT");
		if ((listen_port ? atoll(listen_port) : 25) != port)
			continue;
		if (address == NULL || strcmp(address, "*") == 0 || strcmp(address, "0.0.0.0") == 0
			|| strcmp(address, "::") == 0)
			wildcard = true;
		else
			internet_self_add(&list, &n, address);
	}
	if (wildcard)
	{
		struct ifaddrs *ifs;

		if (getifaddrs(&ifs) == 0)
		{
			for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
			{
				char text[INET6_ADDRSTRLEN];

				if (i->ifa_addr == NULL)
					continue;
				if (i->ifa_addr->sa_family == AF_INET
					&& inet_ntop(AF_INET, &((struct sockaddr_in *) i->ifa_addr)->sin_addr, text, sizeof(text)))
					internet_self_add(&list, &n, text);
				else if (i->ifa_addr->sa_family == AF_INET6
						 && inet_ntop(AF_INET6, &((struct sockaddr_in6 *) i->ifa_addr)->sin6_addr, text,
									  sizeof(text)))
					internet_self_add(&list, &n, text);
			}
			freeifaddrs(ifs);
		}
	}
	internet_self.addresses = list;
	internet_self_done = true;
}

/* ---------------------------------------------------------------------------
 * Addresses of an MX host: pepsi.dns_address, refreshed from the DNS
 * ------------------------------------------------------------------------- */

bool
internet_family_allowed(enum internet_family family, const char *address)
{
	bool v6 = strchr(address, ':') != NULL;

	return !(family == FAMILY_IPV4_ONLY && v6) && !(family == FAMILY_IPV6_ONLY && !v6);
}

/* Resolve host's A and AAAA records and store them; false when the DNS gave none. */
static bool
internet_resolve_host(struct pepsi_ctx *ctx, const char *host, enum internet_family family, char *err,
					  size_t errlen)
{
	static const enum dns_type types[2] = {DNS_TYPE_A, DNS_TYPE_AAAA};
	char					 **addresses = NULL;
	size_t					   n = 0;
	unsigned				   ttl = 3600;
	bool					   ok;

	for (int t = 0; t < 2; t++)
	{
		struct dns_answer a;

		if ((types[t] == DNS_TYPE_A && family == FAMILY_IPV6_ONLY)
			|| (types[t] == DNS_TYPE_AAAA && family == FAMILY_IPV4_ONLY))
			continue;
		dns_resolve_sync(internet_resolver, host, types[t], &a);
		if (a.status == DNS_OK)
			for (size_t i = 0; i < a.count; i++)
			{
				char text[INET6_ADDRSTRLEN];

				if (a.records[i].type == DNS_TYPE_A && a.records[i].rdata_len == 4)
					inet_ntop(AF_INET, a.records[i].rdata, text, sizeof(text));
				else if (a.records[i].type == DNS_TYPE_AAAA && a.records[i].rdata_len == 16)
					inet_ntop(AF_INET6, a.records[i].rdata, text, sizeof(text));
				else
					continue;
				if (n >= 32)
					break; /* an absurd answer: the first are enough */
				addresses = xrealloc(addresses, (n + 1) * sizeof(char *));
				addresses[n++] = xstrdup(text);
				if (a.ttl < ttl)
					ttl = a.ttl;
			}
		else if (a.status != DNS_NXDOMAIN)
			snprintf(err, errlen, "cannot look up the address of %s: the DNS did not answer", host);
		dns_answer_free(&a);
	}
	if (n == 0)
	{
		if (err[0] == '\0')
			snprintf(err, errlen, "the MX host %s has no address", host);
		free(addresses);
		return false;
	}
	/* A zero TTL still spares the next message of this pass the lookup. */
	ok = destination_store_addresses(pepsi_db(ctx), host, addresses, n, ttl < 5 ? 5 : ttl, err, errlen);
	for (size_t i = 0; i < n; i++)
		free(addresses[i]);
	free(addresses);
	return ok;
}

static enum internet_family internet_sort_family;

static int
internet_address_compare(const void *a, const void *b)
{
	const struct cached_address *x = a;
	const struct cached_address *y = b;
	bool						 x6 = strchr(x->address, ':') != NULL;
	bool						 y6 = strchr(y->address, ':') != NULL;

	if ((x->retry_in > 0) != (y->retry_in > 0))
		return x->retry_in > 0 ? 1 : -1;
	if (x6 != y6)
		return (x6 == (internet_sort_family == FAMILY_IPV6_FIRST)) ? -1 : 1;
	return x->failures - y->failures;
}

/*
 * The addresses of host worth trying now, best first: from
 * pepsi.dns_address while they are within their TTL and not all failing,
 * else from the DNS afresh.
 */
bool
internet_host_addresses(struct pepsi_ctx *ctx, const char *host, enum internet_family family,
						struct cached_host *out, char *err, size_t errlen)
{
	size_t usable = 0;

	if (!destination_cached_addresses(pepsi_db(ctx), host, out, err, errlen))
		return false;
	for (size_t i = 0; i < out->count; i++)
		if (out->addresses[i].retry_in <= 0 && internet_family_allowed(family, out->addresses[i].address))
			usable++;
	if (usable == 0)
	{
		destination_cached_free(out);
		if (!internet_resolve_host(ctx, host, family, err, errlen))
			return false;
		if (!destination_cached_addresses(pepsi_db(ctx), host, out, err, errlen))
			return false;
	}
	internet_sort_family = family;
	qsort(out->addresses, out->count, sizeof(*out->addresses), internet_address_compare);
	return true;
}
