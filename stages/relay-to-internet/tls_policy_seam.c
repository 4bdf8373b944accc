/* tls_policy_seam.c: see tls_policy_seam.h. */
#include "tls_policy_seam.h"

#include <stdio.h>
#include <string.h>

void
internet_tls_policy_lookup(struct pepsi_ctx *ctx, struct dns_resolver *resolver, const char *domain,
						   const char *mx_host, struct internet_tls_policy *policy)
{
	memset(policy, 0, sizeof(*policy));
	policy->mode = SMTP_TLS_MAY;
	policy->source = "opportunistic";
	snprintf(policy->name, sizeof(policy->name), "%s", mx_host);
}

void
internet_tls_policy_apply(const struct internet_tls_policy *policy, struct smtp_client_options *options)
{
	options->tls = policy->mode;
	options->tls_name = policy->name[0] ? policy->name : NULL;
}
