/*
 * mx.h: where mail for a domain goes (RFC 5321 section 5.1), for
 * pepsi-stage-relay-to-internet.
 *
 * The domain's MX records in preference order, equal preferences in random
 * order; no MX at all means the domain's own A/AAAA (the implicit MX); a
 * lone "." is a null MX (RFC 7505: the domain takes no mail).  Hosts that
 * are this host (HOSTNAME, or an address a listener of ours is on) end the
 * list: only the MXs preferred to us are tried, and if the best MX is us
 * the mail loops (RFC 5321 5.1, "5.4.6").  A domain is looked up in its
 * A-label form (IDNA, libidn2).
 */
#ifndef PEPSI_INTERNET_MX_H
#define PEPSI_INTERNET_MX_H

#include <stdbool.h>
#include <stddef.h>

#include "dns/dns.h"

enum mx_status
{
	MX_OK,		 /* hosts to try */
	MX_NULL,	 /* a null MX: bounce 5.1.10 */
	MX_NO_HOST,	 /* no such domain, or no MX and no address: bounce 5.1.2 */
	MX_LOOP,	 /* the best MX is this host: bounce 5.4.6 */
	MX_TEMPFAIL, /* the DNS did not answer: try later, 4.4.3 */
	MX_INVALID	 /* not a domain name, even after IDNA: bounce 5.1.2 */
};

struct mx_host
{
	char	*name;		 /* A-label form, no final dot */
	unsigned preference; /* 0 for the implicit MX */
};

struct mx_route
{
	enum mx_status	status;
	char			reason[300]; /* for the DSN and the log when not MX_OK */
	bool			implicit;	 /* the domain's own address (no MX records) */
	bool			secure;		 /* the answer was DNSSEC-validated (DANE needs it, RFC 7672 2.2.1) */
	struct mx_host *hosts;
	size_t			nhosts;
};

/* What identifies this host as an MX: its names and the addresses we listen on. */
struct mx_self
{
	const char *hostname;
	char	  **addresses; /* NULL-terminated, may be NULL */
};

/*
 * The A-label form of domain ("bücher.example" -> "xn--bcher-kva.example"),
 * lower case and without a final dot; NULL if it is no domain name.
 */
char *mx_domain_to_ascii(const char *domain);

/* Look the domain (A-label form) up; at most max_hosts hosts are kept. */
void mx_route_lookup(struct dns_resolver *resolver, const char *domain, const struct mx_self *self,
					 size_t max_hosts, struct mx_route *route);
void mx_route_free(struct mx_route *route);

/* Is this address (text form) one of ours? */
bool mx_address_is_self(const struct mx_self *self, const char *address);

#endif
