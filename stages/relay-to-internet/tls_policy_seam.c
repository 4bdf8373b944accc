/* tls_policy_seam.c: see tls_policy_seam.h. */
#include "tls_policy_seam.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "message/header.h"
#include "smtp/mta_sts.h"

/*
 * The last domain's MTA-STS policy: the recipients of one message and the
 * next messages to the same domain ask again within seconds, and the
 * database cache (pepsi.mta_sts_policy) is what every worker shares.
 */
#define INTERNET_STS_REUSE_SECONDS 30

static char					 sts_domain[256];
static time_t				 sts_looked_up;
static enum mta_sts_status	 sts_status;
static struct mta_sts_policy sts_policy;
static char					 sts_result[48]; /* the RFC 8460 result type when it FAILED */

/* The database cache's answer for one domain, given by the caller (NULL domain: none). */
static char *sts_given_domain;
static char *sts_given_id;
static char *sts_given_policy;

void
internet_tls_policy_sts_cached(const char *domain, const char *policy_id, const char *policy)
{
	free(sts_given_domain);
	free(sts_given_id);
	free(sts_given_policy);
	sts_given_domain = domain ? xstrdup(domain) : NULL;
	sts_given_id = policy_id ? xstrdup(policy_id) : NULL;
	sts_given_policy = policy ? xstrdup(policy) : NULL;
}

static const struct mta_sts_policy *
internet_sts_policy(struct pepsi_ctx *ctx, struct dns_resolver *resolver, const char *domain)
{
	struct mta_sts_options o = {
		.resolver = resolver,
		.db = pepsi_db(ctx),
		.ca_file = pepsi_option(ctx, "TLS_CA_FILE"),
		.https_port = (unsigned) pepsi_option_int(ctx, "MTA_STS_PORT"),
		.timeout_ms = (long) (pepsi_option_seconds(ctx, "MTA_STS_TIMEOUT") * 1000),
		.allow_private = pepsi_option_bool(ctx, "MTA_STS_ALLOW_PRIVATE_ADDRESSES"),
		.cache_given = sts_given_domain && strcasecmp(sts_given_domain, domain) == 0,
		.cached_id = sts_given_id,
		.cached_policy = sts_given_policy,
	};
	char err[512];

	if (strcasecmp(sts_domain, domain) != 0 || time(NULL) - sts_looked_up > INTERNET_STS_REUSE_SECONDS)
	{
		mta_sts_policy_free(&sts_policy);
		sts_result[0] = '\0';
		sts_status = mta_sts_lookup(&o, domain, &sts_policy, sts_result, sizeof(sts_result), err, sizeof(err));
		if (sts_status == MTA_STS_FAILED)
			log_warnx("MTA-STS: %s (%s): delivered as without a policy", err, sts_result);
		snprintf(sts_domain, sizeof(sts_domain), "%s", domain);
		sts_looked_up = time(NULL);
	}
	return sts_status == MTA_STS_FOUND ? &sts_policy : NULL;
}

/* "TLS-Required: No" (RFC 8689 5): the sender asks for delivery whatever the recipient's policy. */
static bool
internet_tls_not_required(struct pepsi_ctx *ctx)
{
	const struct buf *headers = pepsi_headers(ctx);
	char			 *value = headers ? header_get(headers->data, headers->len, "TLS-Required") : NULL;
	bool			  no = value && strcasecmp(value, "No") == 0;

	free(value);
	return no;
}

/* The policy as a report shows it (RFC 8460 4.3: policy-type, policy-string, mx-host). */
static void
internet_tls_policy_report(struct internet_tls_policy *policy, const struct mta_sts_policy *sts)
{
	const struct tls_policy *p = &policy->policy;
	struct buf				 strings = BUF_INIT;
	struct buf				 mx = BUF_INIT;

	if (p->kind == TLS_POLICY_DANE || p->kind == TLS_POLICY_DANE_ENCRYPT
		|| strncmp(p->refused_result, "tlsa-", 5) == 0 || strncmp(p->refused_result, "dnssec-", 7) == 0)
	{
		policy->report_type = "tlsa";
		for (size_t i = 0; i < p->ntlsa; i++)
		{
			buf_printf(&strings, "%s%u %u %u ", i ? "\n" : "", p->tlsa[i].usage, p->tlsa[i].selector,
					   p->tlsa[i].mtype);
			for (size_t j = 0; j < p->tlsa[i].len; j++)
				buf_printf(&strings, "%02x", p->tlsa[i].data[j]);
		}
		buf_append_str(&mx, p->mx_host);
	}
	else if (sts && (p->kind == TLS_POLICY_STS_ENFORCE || p->kind == TLS_POLICY_STS_TESTING || p->refused[0]))
	{
		policy->report_type = "sts";
		buf_printf(&strings, "version: STSv1\nmode: %s", mta_sts_mode_name(sts->mode));
		for (size_t i = 0; i < sts->nmx; i++)
		{
			buf_printf(&strings, "\nmx: %s", sts->mx[i]);
			buf_printf(&mx, "%s%s", i ? "\n" : "", sts->mx[i]);
		}
		buf_printf(&strings, "\nmax_age: %ld", sts->max_age);
	}
	else if (policy->report_failure[0])
		policy->report_type = "sts"; /* announced, but not to be had */
	else
		policy->report_type = "no-policy-found";
	buf_append(&strings, "", 1);
	buf_append(&mx, "", 1);
	policy->report_strings = strings.data;
	policy->report_mx = mx.data;
}

void
internet_tls_policy_lookup(struct pepsi_ctx *ctx, struct dns_resolver *resolver, const char *domain,
						   const char *mx_host, bool mx_secure, struct internet_tls_policy *policy)
{
	struct tls_policy_request req = {
		.resolver = resolver,
		.domain = domain,
		.mx_host = mx_host,
		.mx_secure = mx_secure && pepsi_option_bool(ctx, "DANE"),
		.port = (unsigned) pepsi_option_int(ctx, "SMTP_PORT"),
		.sts_ca_file = pepsi_option(ctx, "TLS_CA_FILE"),
		.tls_not_required = internet_tls_not_required(ctx),
	};

	memset(policy, 0, sizeof(*policy));
	if (!req.tls_not_required && pepsi_option_bool(ctx, "MTA_STS"))
	{
		req.sts = internet_sts_policy(ctx, resolver, domain);
		if (sts_status == MTA_STS_FAILED)
			snprintf(policy->report_failure, sizeof(policy->report_failure), "%s",
					 sts_result[0] ? sts_result : "sts-policy-fetch-error");
	}
	tls_policy_for_mx(&req, &policy->policy);
	internet_tls_policy_report(policy, req.sts);
	policy->source = tls_policy_name(&policy->policy);
	policy->mode = tls_policy_requires_tls(&policy->policy) ? SMTP_TLS_VERIFY : SMTP_TLS_MAY;
	snprintf(policy->name, sizeof(policy->name), "%s", mx_host);
	if (policy->policy.refused[0])
	{
		policy->refuse = true;
		snprintf(policy->reason, sizeof(policy->reason), "%.250s (%.40s)", policy->policy.refused,
				 policy->policy.refused_result);
	}
}

void
internet_tls_policy_free(struct internet_tls_policy *policy)
{
	tls_policy_free(&policy->policy);
	free(policy->report_strings);
	free(policy->report_mx);
	policy->report_strings = policy->report_mx = NULL;
}

void
internet_tls_policy_apply(const struct internet_tls_policy *policy, struct smtp_client_options *options)
{
	options->tls = policy->mode;
	options->tls_name = policy->name[0] ? policy->name : NULL;
}

void
internet_tls_policy_attach(const struct internet_tls_policy *policy, struct smtp_client *client)
{
	smtp_client_set_tls_policy(client, &policy->policy);
}
