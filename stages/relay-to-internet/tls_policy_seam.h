/*
 * tls_policy_seam.h: where pepsi-stage-relay-to-internet asks what TLS a
 * delivery must have, and applies it.
 *
 * Two calls frame every connection: internet_tls_policy_lookup, before
 * connecting, for the recipient domain and the MX host (DANE, RFC 7672,
 * from the host's TLSA records when the MX answer was DNSSEC-validated;
 * MTA-STS, RFC 8461, from the domain's policy), and
 * internet_tls_policy_apply, which hands the answer to the SMTP client
 * (common/smtp/tls_policy.h decides STARTTLS and the peer's authentication and
 * reports the outcome).  Without DANE or MTA-STS the policy is
 * opportunistic STARTTLS: used when offered, the certificate not required
 * (RFC 7435).  Options: DANE, MTA_STS, TLS_CA_FILE, MTA_STS_PORT,
 * MTA_STS_TIMEOUT of the stage's section.
 */
#ifndef PEPSI_INTERNET_TLS_POLICY_SEAM_H
#define PEPSI_INTERNET_TLS_POLICY_SEAM_H

#include <stdbool.h>

#include "dns/dns.h"
#include "runtime/stage.h"
#include "smtp/smtp_client.h"
#include "smtp/tls_policy.h"

struct internet_tls_policy
{
	enum smtp_tls_mode mode;		/* SMTP_TLS_MAY: opportunistic */
	char			   name[256];	/* the name the certificate must carry (VERIFY) */
	const char		  *source;		/* "opportunistic", "dane", "mta-sts": for the log */
	bool			   refuse;		/* the policy forbids delivering to this host */
	char			   reason[300]; /* why, when it refuses (for the DSN and the log) */
	struct tls_policy  policy;		/* what the SMTP client enforces */
	/*
	 * The policy as a TLS report (RFC 8460 4.3) shows it: its type ("sts",
	 * "tlsa", "no-policy-found"), its text and MX patterns (lines joined by
	 * newlines), and, when the domain's MTA-STS policy could not be had,
	 * that failure's result type ("": none).
	 */
	const char *report_type;
	char	   *report_strings;
	char	   *report_mx;
	char		report_failure[48];
};

/* The policy for delivering mail for domain (A-label) to mx_host; free it with internet_tls_policy_free. */
void internet_tls_policy_lookup(struct pepsi_ctx *ctx, struct dns_resolver *resolver,
								const char *domain, const char *mx_host, bool mx_secure,
								struct internet_tls_policy *policy);
void internet_tls_policy_free(struct internet_tls_policy *policy);
/*
 * What the database's MTA-STS cache holds for domain, read with the
 * destination's slot (policy_id NULL: nothing): the next lookups for
 * domain use it rather than read it again.
 */
void internet_tls_policy_sts_cached(const char *domain, const char *policy_id, const char *policy);
/* Make the client options say what the policy asks (before the client is chosen). */
void internet_tls_policy_apply(const struct internet_tls_policy *policy,
							   struct smtp_client_options		*options);
/* Give the policy to the client chosen for the connection. */
void internet_tls_policy_attach(const struct internet_tls_policy *policy, struct smtp_client *client);

#endif
