/*
 * relay_control.h: who may send mail where, decided at RCPT time
 * (RFC 5321 3.6.2, 7.1).  Mail to a local domain ([pepsi] LOCAL_DOMAINS)
 * is for us, and is taken when the recipient exists (common/local/local.c);
 * mail to any other domain is relayed, which only an authenticated session
 * or a client in TRUSTED_NETWORKS ([ingress], or its listener's own) may
 * ask for.  Pure, like smtp.c: the fuzz target runs it too.
 */
#ifndef PEPSI_INGRESS_RELAY_CONTROL_H
#define PEPSI_INGRESS_RELAY_CONTROL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "local/local.h"
#include "smtp.h"

/* The default of [ingress] TRUSTED_NETWORKS: this host only. */
#define RELAY_DEFAULT_TRUSTED_NETWORKS "127.0.0.0/8 ::1/128"

struct network
{
	int			  family; /* AF_INET or AF_INET6 */
	unsigned char address[16];
	unsigned	  prefix; /* bits */
};

struct trusted_networks
{
	struct network *networks;
	size_t			count;
};

/*
 * Parse a list of CIDR blocks ("192.0.2.0/24 2001:db8::/32 ::1", comma
 * or space separated; a bare address is a block of one; "none" or an
 * empty list trusts no one).  False with the reason in err.
 */
bool trusted_networks_parse(const char *list, struct trusted_networks *out,
							char *err, size_t errlen);
void trusted_networks_free(struct trusted_networks *t);
/* Is the client in one of the blocks?  An IPv4-mapped IPv6 address is its IPv4 address. */
bool trusted_networks_contain(const struct trusted_networks *t, const struct sockaddr *addr);

/* What ingress knows when a recipient is given. */
struct relay_request
{
	const char			  *local_domains;
	struct local_resolver *resolver; /* NULL: every local address exists */
	bool				   trusted_client;
	bool				   authenticated;
};

enum smtp_rcpt_verdict relay_control_rcpt(const struct relay_request *request, const char *address);

#endif
