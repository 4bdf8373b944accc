/*
 * outcome.c: each recipient's outcome of a relay-to-internet delivery,
 * handed to delivery_each (common/delivery/delivery.h), which splits the
 * row by outcome: a transaction's per-recipient RCPT replies where a host
 * took one, or one outcome for every recipient (a routing or connection
 * failure).
 */
#include <stdlib.h>

#include "base/xalloc.h"
#include "internet.h"

/* Every recipient of the row fared alike (a routing or connection outcome). */
int
internet_conclude_all(struct pepsi_ctx *ctx, enum delivery_class class, const struct delivery_report *r)
{
	size_t					 n = pepsi_rcpt_count(ctx);
	struct delivery_outcome *outcomes = xcalloc(n, sizeof(*outcomes));
	int						 rc;

	for (size_t i = 0; i < n; i++)
	{
		outcomes[i].class = class;
		outcomes[i].report = *r;
	}
	rc = delivery_each(ctx, outcomes, "relayed", false);
	free(outcomes);
	return rc;
}

int
internet_refuse(struct pepsi_ctx *ctx, enum delivery_class class, const char *status, const char *reason)
{
	char				  *diagnostic = xasprintf("X-Pepsi; %s", reason);
	struct delivery_report r = {.status = status, .diagnostic = diagnostic};
	int					   rc = internet_conclude_all(ctx, class, &r);

	free(diagnostic);
	return rc;
}

static enum delivery_class
internet_class_of(int code)
{
	return code / 100 == 2 ? DELIVERY_SENT : code / 100 == 5 ? DELIVERY_BOUNCED
															 : DELIVERY_DEFERRED;
}

/* Each recipient's outcome of a transaction that reached a host. */
int
internet_conclude_transaction(struct pepsi_ctx *ctx, const struct smtp_result *result)
{
	size_t					 n = pepsi_rcpt_count(ctx);
	struct delivery_outcome *outcomes = xcalloc(n, sizeof(*outcomes));
	struct buf				*diagnostics = xcalloc(n + 1, sizeof(struct buf));
	char(*statuses)[16] = xcalloc(n + 1, sizeof(*statuses));
	enum delivery_class overall = result->outcome == SMTP_DELIVERED	  ? DELIVERY_SENT
								  : result->outcome == SMTP_PERMANENT ? DELIVERY_BOUNCED
																	  : DELIVERY_DEFERRED;
	int					rc;

	for (size_t i = 0; i < n; i++)
	{
		const struct smtp_reply *rcpt = i < result->nrcpt ? &result->rcpt_replies[i] : NULL;

		if (rcpt && rcpt->code > 0 && rcpt->code / 100 != 2)
		{
			/* Its own RCPT reply decided. */
			outcomes[i].class = internet_class_of(rcpt->code);
			delivery_report_from_smtp(result, rcpt, &outcomes[i].report, statuses[i], sizeof(statuses[i]),
									  &diagnostics[i]);
		}
		else
		{
			outcomes[i].class = overall;
			delivery_report_from_smtp(result, NULL, &outcomes[i].report, statuses[i], sizeof(statuses[i]),
									  &diagnostics[i]);
		}
	}
	rc = delivery_each(ctx, outcomes, result->dsn_passed ? "delivered" : "relayed", result->dsn_passed);
	for (size_t i = 0; i < n; i++)
		buf_free(&diagnostics[i]);
	free(diagnostics);
	free(statuses);
	free(outcomes);
	return rc;
}
