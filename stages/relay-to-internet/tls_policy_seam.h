/*
 * tls_policy_seam.h: where pepsi-stage-relay-to-internet asks what TLS a
 * delivery must have, and applies it.
 *
 * Two calls frame every connection: internet_tls_policy_lookup, before
 * connecting, for the recipient domain and the MX host (DANE, RFC 7672,
 * from the host's TLSA records; MTA-STS, RFC 8461, from the domain's
 * policy), and internet_tls_policy_apply, which puts the answer into the
 * SMTP client's options.  The policy modules of common/ plug in here;
 * without them the policy is opportunistic STARTTLS: used when offered,
 * the certificate not checked (RFC 7435), as other MTAs deliver today.
 */
#ifndef PEPSI_INTERNET_TLS_POLICY_SEAM_H
#define PEPSI_INTERNET_TLS_POLICY_SEAM_H

#include <stdbool.h>

#include "dns.h"
#include "smtp_client.h"
#include "stage.h"

struct internet_tls_policy
{
	enum smtp_tls_mode mode;		/* SMTP_TLS_MAY: opportunistic */
	char			   name[256];	/* the name the certificate must carry (VERIFY) */
	const char		  *source;		/* "opportunistic", "dane", "mta-sts": for the log */
	bool			   refuse;		/* the policy forbids delivering to this host */
	char			   reason[300]; /* why, when it refuses (for the DSN and the log) */
};

/* The policy for delivering mail for domain (A-label) to mx_host. */
void internet_tls_policy_lookup(struct pepsi_ctx *ctx, struct dns_resolver *resolver,
								const char *domain, const char *mx_host,
								struct internet_tls_policy *policy);
/* Make the client options say what the policy asks. */
void internet_tls_policy_apply(const struct internet_tls_policy *policy,
							   struct smtp_client_options		*options);

#endif
