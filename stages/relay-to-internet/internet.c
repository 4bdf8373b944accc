/*
 * pepsi-stage-relay-to-internet: deliver remote mail to the MX hosts of
 * its recipients' domains (RFC 5321 section 5).
 *
 * A row's recipients are first split by domain (and into transactions of
 * at most MAX_RECIPIENTS): each row then goes to one destination, in one
 * transaction whose per-recipient replies are mapped back with split
 * (common/delivery/delivery.h, delivery_each).  Where it goes is mx.h's; which
 * address of which MX host is tried is read from pepsi.dns_address, and
 * whether the destination may be tried now (its concurrency slots, rate
 * limit and backoff) from pepsi.destination (destination.h), so that a
 * destination that is slow or down holds only its own messages, never
 * every worker.  The TLS a connection must have is asked of the policy
 * seam (tls_policy_seam.h) before connecting.  Sessions are kept open
 * across messages, a few per worker, keyed by MX host and address.
 * This file runs a row; internet.h says which file does the rest.
 *
 * It runs fused after route (body-free) in route's pass, its body loaded
 * late (common/runtime/stage.h late_load): a message relayed costs one claim, one
 * load and one commit, not two of each.  A domain this process saw to be
 * slow (a delivery there took DESTINATION_SLOW) is not fused for a while:
 * its rows go to this stage's own workers, so that a pass of route's,
 * whose other rows wait for it, is never held by a slow destination.
 *
 * A worker takes the rows already waiting for it as one batch (up to
 * INTERNET_BATCH_MAX, as relay-to-smarthost does): they are loaded with
 * one statement, delivered one after another, and their outcomes
 * committed together (the deliveries in one workqueue_commit_many)
 * before the worker answers for any of them.  Each row keeps its own
 * transaction and outcome (a 4xx or 5xx to one RCPT concerns its row
 * only); a batch's rows to one destination go through the same session
 * under the same slot, asked of destination_begin once for the run
 * unless the destination counts each message (schedule.c).  As with
 * any relay, a 250 may come before the commit: a crash in between leaves
 * the rows running, to be retried.  The batch is small, since a slow
 * destination's delivery holds the rows behind it until the batch ends.
 *
 * Options: schema/options.def, "pepsi-stage-relay-to-internet".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "internet.h"

int pepsi_stage_relay_to_internet_main(int argc, char **argv);

/* The most rows a worker takes at once (of those waiting): one load, one commit of their outcomes. */
#define INTERNET_BATCH_MAX 8

struct dns_resolver *internet_resolver;

/* ---------------------------------------------------------------------------
 * Recipients: one destination per row
 * ------------------------------------------------------------------------- */

static const char *
internet_domain_of(const char *address)
{
	const char *at = strrchr(address, '@');

	return at ? at + 1 : "";
}

/*
 * Split the row so that it keeps the recipients of its first recipient's
 * domain (at most max of them); the others go to sibling rows here, one
 * per domain and transaction.  0 when nothing had to move.
 */
static int
internet_split_by_destination(struct pepsi_ctx *ctx, long long max)
{
	size_t	n = pepsi_rcpt_count(ctx);
	int	   *group_of = xcalloc(n, sizeof(int)); /* 0: unassigned */
	int	   *keep = xcalloc(n, sizeof(int));
	size_t	nkeep = 0;
	json_t *groups = json_array();
	int		rc = 0;

	for (size_t i = 0; i < n; i++)
	{
		json_t *indices;
		size_t	in_group = 0;

		if (group_of[i])
			continue;
		indices = json_array();
		for (size_t j = i; j < n; j++)
			if (!group_of[j]
				&& strcasecmp(internet_domain_of(pepsi_rcpt(ctx, i)), internet_domain_of(pepsi_rcpt(ctx, j))) == 0)
			{
				if ((long long) in_group == max)
					break;
				group_of[j] = 1;
				in_group++;
				if (i == 0)
					keep[nkeep++] = (int) j + 1;
				else
					json_array_append_new(indices, json_integer((json_int_t) j + 1));
			}
		/* (recipients of the domain beyond max start a group of their own further on) */
		if (i == 0)
			json_decref(indices);
		else
			json_array_append_new(groups, json_pack("{s:o}", "rcpt_indices", indices));
	}
	if (json_array_size(groups) > 0)
		rc = pepsi_fan_out(ctx, keep, nkeep, groups);
	json_decref(groups);
	free(keep);
	free(group_of);
	return rc < 0 ? -1 : 0;
}

static bool
internet_resolver_ready(struct pepsi_ctx *ctx, char *err, size_t errlen)
{
	struct dns_config dns;

	if (internet_resolver)
		return true;
	if (!dns_config_load(pepsi_config(ctx), &dns, err, errlen))
		return false;
	internet_resolver = dns_resolver_new(NULL, &dns, err, errlen);
	dns_config_free(&dns);
	return internet_resolver != NULL;
}

static int
internet_run(struct pepsi_ctx *ctx)
{
	struct mx_route route;
	char			err[300];
	char		   *domain;
	int				rc;

	if (internet_split_by_destination(ctx, pepsi_option_int(ctx, "MAX_RECIPIENTS")) < 0)
		return -1;
	if (!internet_self_loaded())
		internet_self_load(ctx);
	domain = mx_domain_to_ascii(internet_domain_of(pepsi_rcpt(ctx, 0)));
	if (domain == NULL)
	{
		char *reason = xasprintf("\"%s\" is not a valid domain name", internet_domain_of(pepsi_rcpt(ctx, 0)));

		rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.1.2", reason);
		free(reason);
		return rc;
	}
	if (!internet_resolver_ready(ctx, err, sizeof(err)))
	{
		log_warnx("[stage-%s]: %s", pepsi_stage_name(ctx), err);
		free(domain);
		return internet_refuse(ctx, DELIVERY_DEFERRED, "4.3.5", err);
	}
	mx_route_lookup(internet_resolver, domain, &internet_self, (size_t) pepsi_option_int(ctx, "MAX_MX_HOSTS"),
					&route);
	switch (route.status)
	{
		case MX_OK:
			rc = internet_deliver(ctx, domain, &route);
			break;
		case MX_NULL:
			rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.1.10", route.reason);
			break;
		case MX_LOOP:
			rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.4.6", route.reason);
			break;
		case MX_NO_HOST:
		case MX_INVALID:
			rc = internet_refuse(ctx, DELIVERY_BOUNCED, "5.1.2", route.reason);
			break;
		default:
			rc = internet_refuse(ctx, DELIVERY_DEFERRED, "4.4.3", route.reason);
			break;
	}
	mx_route_free(&route);
	free(domain);
	return rc;
}

/*
 * A row that must be split first (several destinations) cannot run fused,
 * nor one to a domain this process saw to be slow.
 */
static bool
internet_can_fuse(struct pepsi_ctx *ctx)
{
	size_t n = pepsi_rcpt_count(ctx);
	char  *domain;
	bool   slow;

	if ((long long) n > pepsi_option_int(ctx, "MAX_RECIPIENTS"))
		return false;
	for (size_t i = 1; i < n; i++)
		if (strcasecmp(internet_domain_of(pepsi_rcpt(ctx, 0)), internet_domain_of(pepsi_rcpt(ctx, i))) != 0)
			return false;
	domain = mx_domain_to_ascii(internet_domain_of(pepsi_rcpt(ctx, 0)));
	slow = domain && internet_slow_recently(domain);
	free(domain);
	return !slow;
}

const struct pepsi_stage pepsi_stage_relay_to_internet_stage = {
	.program = "pepsi-stage-relay-to-internet",
	.load = PEPSI_LOAD_FULL,
	.run = internet_run,
	.can_fuse = internet_can_fuse,
	/* The rows waiting go through the sessions one after another, loaded and committed together. */
	.batch_max = INTERNET_BATCH_MAX,
	/* After route (body-free), in the same pass: its body loaded then, not a second claim. */
	.late_load = true,
};

int
pepsi_stage_relay_to_internet_main(int argc, char **argv)
{
	int rc = pepsi_worker_main(&pepsi_stage_relay_to_internet_stage, argc, argv);

	internet_close_all(); /* QUIT the sessions the worker kept (and atexit finds none) */
	if (internet_resolver)
		dns_resolver_free(internet_resolver);
	return rc;
}
