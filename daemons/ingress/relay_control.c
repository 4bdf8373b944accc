/*
 * relay_control.c: see relay_control.h.  The blocks are few (a site's own
 * networks), so a linear scan per session is all it takes.
 */
#include "relay_control.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"

static bool
network_parse(const char *text, struct network *n, char *err, size_t errlen)
{
	char		address[INET6_ADDRSTRLEN + 8];
	const char *slash = strchr(text, '/');
	size_t		len = slash ? (size_t) (slash - text) : strlen(text);
	unsigned	bits;
	char	   *end;
	long		prefix;

	if (len == 0 || len >= sizeof(address))
		goto bad;
	memcpy(address, text, len);
	address[len] = '\0';
	memset(n, 0, sizeof(*n));
	if (inet_pton(AF_INET, address, n->address) == 1)
		n->family = AF_INET, bits = 32;
	else if (inet_pton(AF_INET6, address, n->address) == 1)
		n->family = AF_INET6, bits = 128;
	else
		goto bad;
	n->prefix = bits;
	if (slash)
	{
		prefix = strtol(slash + 1, &end, 10);
		if (end == slash + 1 || *end != '\0' || prefix < 0 || prefix > (long) bits)
		{
			snprintf(err, errlen, "\"%s\": the prefix length must be 0 to %u", text, bits);
			return false;
		}
		n->prefix = (unsigned) prefix;
	}
	/* Host bits set ("10.1.2.3/8") are most likely a typo for a narrower block. */
	for (unsigned i = n->prefix; i < bits; i++)
		if (n->address[i / 8] & (0x80 >> (i % 8)))
		{
			snprintf(err, errlen, "\"%s\" has bits set beyond its /%u prefix", text, n->prefix);
			return false;
		}
	return true;

bad:
	snprintf(err, errlen, "\"%s\" is not an IPv4 or IPv6 address or CIDR block", text);
	return false;
}

bool
trusted_networks_parse(const char *list, struct trusted_networks *out, char *err, size_t errlen)
{
	const char *p = list;

	memset(out, 0, sizeof(*out));
	if (strcasecmp(list, "none") == 0)
		return true;
	while (*p)
	{
		char   item[128];
		size_t n;

		p += strspn(p, ", \t");
		if ((n = strcspn(p, ", \t")) == 0)
			break;
		if (n >= sizeof(item))
		{
			snprintf(err, errlen, "\"%.40s...\" is not an IPv4 or IPv6 address or CIDR block", p);
			goto err;
		}
		memcpy(item, p, n);
		item[n] = '\0';
		out->networks = xrealloc(out->networks, (out->count + 1) * sizeof(*out->networks));
		if (!network_parse(item, &out->networks[out->count], err, errlen))
			goto err;
		out->count++;
		p += n;
	}
	return true;

err:
	trusted_networks_free(out);
	return false;
}

void
trusted_networks_free(struct trusted_networks *t)
{
	free(t->networks);
	t->networks = NULL;
	t->count = 0;
}

static bool
network_contains(const struct network *n, int family, const unsigned char *address)
{
	unsigned whole = n->prefix / 8;
	unsigned rest = n->prefix % 8;

	if (n->family != family)
		return false;
	if (memcmp(n->address, address, whole) != 0)
		return false;
	return rest == 0 || ((n->address[whole] ^ address[whole]) & (0xff00 >> rest)) == 0;
}

bool
trusted_networks_contain(const struct trusted_networks *t, const struct sockaddr *addr)
{
	const unsigned char *address;
	int					 family = addr->sa_family;

	if (family == AF_INET)
		address = (const unsigned char *) &((const struct sockaddr_in *) addr)->sin_addr;
	else if (family == AF_INET6)
	{
		const struct in6_addr *in6 = &((const struct sockaddr_in6 *) addr)->sin6_addr;

		address = in6->s6_addr;
		if (IN6_IS_ADDR_V4MAPPED(in6))
			family = AF_INET, address += 12;
	}
	else
		return false;
	for (size_t i = 0; i < t->count; i++)
		if (network_contains(&t->networks[i], family, address))
			return true;
	return false;
}

enum smtp_rcpt_verdict
relay_control_rcpt(const struct relay_request *request, const char *address)
{
	if (!local_address_is_local(request->local_domains, address))
		return request->authenticated || request->trusted_client
				   ? SMTP_RCPT_ACCEPT
				   : SMTP_RCPT_RELAY_DENIED;
	if (request->resolver == NULL)
		return SMTP_RCPT_ACCEPT;
	switch (local_recipient_lookup(request->resolver, address))
	{
		case LOCAL_RECIPIENT_EXISTS:
			return SMTP_RCPT_ACCEPT;
		case LOCAL_RECIPIENT_UNKNOWN:
			return SMTP_RCPT_UNKNOWN_USER;
		case LOCAL_RECIPIENT_UNVERIFIED:
			return SMTP_RCPT_UNVERIFIED;
	}
	return SMTP_RCPT_UNVERIFIED;
}
