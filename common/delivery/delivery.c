/*
 * delivery.c: see delivery.h.  The retry policy, the delay DSN clone and
 * the bounce hand-off live here once, so the delivery stages differ only in
 * how they deliver.
 */
#include "delivery/delivery.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/maillog.h"
#include "runtime/db.h"
#include "smtp/smtp_client.h"

/* ---------------------------------------------------------------------------
 * DSN parameters of the row (state.dsn, RFC 3461)
 * ------------------------------------------------------------------------- */

static json_t *
delivery_get_any_case(json_t *object, const char *key)
{
	const char *k;
	json_t	   *v;

	if (!json_is_object(object))
		return NULL;
	json_object_foreach (object, k, v)
		if (strcasecmp(k, key) == 0)
			return v;
	return NULL;
}

static json_t *
delivery_dsn_rcpt_entry(json_t *rcpts, size_t count, size_t index)
{
	/* The array runs parallel to rcpt_to; anything else is not to be trusted. */
	if (!json_is_array(rcpts) || json_array_size(rcpts) != count)
		return NULL;
	return json_array_get(rcpts, index);
}

const char *
delivery_notify_in(json_t *rcpts, size_t count, size_t index)
{
	json_t *notify = delivery_get_any_case(delivery_dsn_rcpt_entry(rcpts, count, index), "notify");

	if (json_is_array(notify))
		return NULL; /* written as an array?  not by ingress; treat as absent */
	return json_string_value(notify);
}

const char *
delivery_orcpt_in(json_t *rcpts, size_t count, size_t index)
{
	return json_string_value(delivery_get_any_case(delivery_dsn_rcpt_entry(rcpts, count, index), "orcpt"));
}

json_t *
delivery_dsn_rcpts(const struct pepsi_ctx *ctx)
{
	return delivery_get_any_case(delivery_get_any_case(pepsi_state(ctx), "dsn"), "rcpt");
}

const char *
delivery_notify(const struct pepsi_ctx *ctx, size_t index)
{
	return delivery_notify_in(delivery_dsn_rcpts(ctx), pepsi_rcpt_count(ctx), index);
}

const char *
delivery_orcpt(const struct pepsi_ctx *ctx, size_t index)
{
	return delivery_orcpt_in(delivery_dsn_rcpts(ctx), pepsi_rcpt_count(ctx), index);
}

const char *
delivery_dsn_param(const struct pepsi_ctx *ctx, const char *key)
{
	return json_string_value(delivery_get_any_case(delivery_get_any_case(pepsi_state(ctx), "dsn"), key));
}

/*
 * RFC 3461 section 4.1: NEVER asks for nothing; a list asks for what it
 * names; no NOTIFY at all means FAILURE (and, at the MTA's choice, DELAY,
 * which Pepsi does not send unasked).
 */
bool
delivery_notify_wants(const char *notify, const char *kind)
{
	if (notify == NULL || *notify == '\0')
		return strcasecmp(kind, "FAILURE") == 0;
	for (const char *p = notify; *p;)
	{
		size_t n;

		p += strspn(p, ", ");
		n = strcspn(p, ", ");
		if (n == strlen(kind) && strncasecmp(p, kind, n) == 0)
			return true;
		p += n;
	}
	return false;
}

/* ---------------------------------------------------------------------------
 * The message's age, for MAX_LIFETIME
 * ------------------------------------------------------------------------- */

double
delivery_message_age(struct pepsi_ctx *ctx)
{
	double age = pepsi_message_age(ctx);

	/* A DSN is younger than its row: its clock starts when the bounce stage made it. */
	{
		json_t *created = json_object_get(pepsi_state(ctx), "created_at");

		if (json_is_integer(created) && age >= 0
			&& (double) (time(NULL) - json_integer_value(created)) < age)
			age = (double) (time(NULL) - json_integer_value(created));
	}
	return age;
}

/* ---------------------------------------------------------------------------
 * Outcomes
 * ------------------------------------------------------------------------- */

static void
delivery_set_string(json_t *object, const char *key, const char *value)
{
	if (value && *value)
		json_object_set_new(object, key, json_string(value));
}

/* The report as JSON: the keys of state.bounce that describe the attempt. */
/* The TLS of the attempt, for state (ready for TLSRPT, RFC 8460). */
static json_t *
delivery_tls_json(const struct delivery_report *r)
{
	json_t *o = json_object();

	delivery_set_string(o, "outcome", r->tls_policy);
	delivery_set_string(o, "result", r->tls_result);
	delivery_set_string(o, "session", r->tls);
	delivery_set_string(o, "relay", r->relay);
	json_object_set_new(o, "at", json_integer((json_int_t) time(NULL)));
	return o;
}

static json_t *
delivery_report_json(const struct delivery_report *r)
{
	json_t *o = json_object();

	delivery_set_string(o, "status", r->status);
	delivery_set_string(o, "enhanced_status", r->status);
	delivery_set_string(o, "diagnostic", r->diagnostic);
	delivery_set_string(o, "remote_mta", r->remote_mta);
	if (r->smtp_code > 0)
		json_object_set_new(o, "smtp_code", json_integer(r->smtp_code));
	delivery_set_string(o, "phase", r->phase);
	delivery_set_string(o, "reply_text", r->reply_text);
	if (r->tls_policy)
		json_object_set_new(o, "tls", delivery_tls_json(r));
	return o;
}

json_t *
delivery_bounce_json(struct pepsi_ctx *ctx, const char *kind, const struct delivery_report *r)
{
	json_t *o = delivery_report_json(r);

	json_object_set_new(o, "kind", json_string(kind));
	delivery_set_string(o, "failed_recipient", pepsi_rcpt(ctx, 0));
	delivery_set_string(o, "notify", delivery_notify(ctx, 0));
	delivery_set_string(o, "orcpt", delivery_orcpt(ctx, 0));
	delivery_set_string(o, "envid", delivery_dsn_param(ctx, "envid"));
	json_object_set_new(o, "at", json_integer((json_int_t) time(NULL)));
	return o;
}

static char *
delivery_last_error(const struct delivery_report *r)
{
	if (r->remote_mta && r->phase)
		return xasprintf("%s (%s, in reply to %s)", r->diagnostic ? r->diagnostic : r->status,
						 r->remote_mta, r->phase);
	return xstrdup(r->diagnostic ? r->diagnostic : r->status);
}

int
delivery_succeeded(struct pepsi_ctx *ctx, const char *action, const struct delivery_report *how,
				   bool next_hop_notifies)
{
	json_t *info = delivery_report_json(how);
	json_t *merge;
	int		rc;

	/*
	 * complete_success sets state.bounce = {kind: success}, replacing any
	 * bounce object; so how it went rides in state.delivery, which the
	 * bounce stage reads for a success DSN.
	 */
	json_object_set_new(info, "action", json_string(action));
	json_object_set_new(info, "at", json_integer((json_int_t) time(NULL)));
	merge = json_pack("{s:o}", "delivery", info);
	pepsi_merge_state(ctx, merge);
	json_decref(merge);
	maillog_delivery(ctx, "sent", how, NULL);
	if (next_hop_notifies)
		rc = pepsi_advance_or_finish(ctx);
	else
		rc = pepsi_complete_success(ctx);
	return rc;
}

/* A permanent failure, logged as status (bounced, or expired past MAX_LIFETIME). */
static int
delivery_failed(struct pepsi_ctx *ctx, const struct delivery_report *why, const char *status)
{
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	char	   *last_error = delivery_last_error(why);
	json_t	   *merge;
	int			rc;

	maillog_delivery(ctx, status, why, pepsi_mail_from(ctx)[0] == '\0' ? "from the null sender: dropped, a bounce is never bounced" : NULL);
	if (pepsi_mail_from(ctx)[0] == '\0')
	{
		free(last_error);
		return pepsi_finish(ctx);
	}
	if (bounce_stage == NULL)
	{
		merge = json_pack("{s:s,s:o}", "last_error", last_error, "bounce",
						  delivery_bounce_json(ctx, "permanent", why));
		rc = pepsi_fail(ctx, merge);
	}
	else
	{
		merge = json_pack("{s:s,s:o}", "last_error", last_error, "bounce",
						  delivery_bounce_json(ctx, "permanent", why));
		rc = pepsi_reroute(ctx, bounce_stage, merge);
	}
	json_decref(merge);
	free(last_error);
	return rc;
}

int
delivery_bounced(struct pepsi_ctx *ctx, const struct delivery_report *why)
{
	return delivery_failed(ctx, why, "bounced");
}

/* Past MAX_LIFETIME: the last temporary failure becomes permanent. */
static int
delivery_expired(struct pepsi_ctx *ctx, const struct delivery_report *why, long attempts,
				 double age)
{
	struct delivery_report expired = *why;
	char				  *diagnostic;
	char				   status[16];
	int					   rc;

	/* RFC 3463 4.4.7: delivery time expired; a 4.x.x reply keeps its detail. */
	if (why->status && why->status[0] == '4')
		snprintf(status, sizeof(status), "%s", why->status);
	else
		snprintf(status, sizeof(status), "4.4.7");
	diagnostic = xasprintf("%s (gave up after %ld attempts in %.0f hours)",
						   why->diagnostic ? why->diagnostic : "X-Pepsi; delivery time expired",
						   attempts, age / 3600);
	expired.status = status;
	expired.diagnostic = diagnostic;
	rc = delivery_failed(ctx, &expired, "expired");
	free(diagnostic);
	return rc;
}

/*
 * The wait before attempt number attempts + 1: base, 2 base, 4 base ... up
 * to RETRY_MAX, with 10% jitter so a backlog spreads out; the last try
 * comes when the lifetime ends, not a whole backoff later.
 */
static double
delivery_retry_delay(struct pepsi_ctx *ctx, long attempts, double age)
{
	double lifetime = pepsi_option_seconds(ctx, "MAX_LIFETIME");
	double base = pepsi_option_seconds(ctx, "RETRY_BASE");
	double cap = pepsi_option_seconds(ctx, "RETRY_MAX");
	double delay = base * pow(2, attempts - 1 > 30 ? 30 : attempts - 1);

	if (delay > cap)
		delay = cap;
	delay *= 0.9 + 0.2 * ((double) random() / RAND_MAX);
	if (age >= 0 && age + delay > lifetime)
		delay = lifetime - age + 0.5;
	if (delay < 0.1)
		delay = 0.1;
	return delay;
}

/*
 * Is a delay DSN (RFC 3464 action "delayed") owed for this row's deferred
 * recipients: the message is DELAY_DSN_AFTER old, has a sender and a
 * BOUNCE_STAGE, and none was sent for it yet?
 */
static bool
delivery_delay_dsn_due(struct pepsi_ctx *ctx, double age)
{
	return pepsi_option(ctx, "BOUNCE_STAGE") != NULL && pepsi_mail_from(ctx)[0] != '\0'
		   && !json_is_true(json_object_get(pepsi_state(ctx), "delay_sent")) && age >= 0
		   && age >= pepsi_option_seconds(ctx, "DELAY_DSN_AFTER");
}

/*
 * The 1-based indices of the recipients whose NOTIFY asks for DELAY, among
 * candidates (a JSON array of 1-based indices; NULL: every recipient).
 */
static json_t *
delivery_wanting_delay(struct pepsi_ctx *ctx, json_t *candidates)
{
	json_t *wanting = json_array();
	size_t	n = candidates ? json_array_size(candidates) : pepsi_rcpt_count(ctx);

	for (size_t k = 0; k < n; k++)
	{
		size_t index = candidates ? (size_t) json_integer_value(json_array_get(candidates, k)) : k + 1;

		if (index >= 1 && delivery_notify_wants(delivery_notify(ctx, index - 1), "DELAY"))
			json_array_append_new(wanting, json_integer((json_int_t) index));
	}
	return wanting;
}

/*
 * state.bounce of a delay DSN about several recipients: the report without
 * a failed_recipient, so that the bounce stage lists every recipient of
 * its row, each with its own NOTIFY and ORCPT (state.dsn.rcpt).
 */
static json_t *
delivery_delay_bounce_json(struct pepsi_ctx *ctx, const struct delivery_report *why, double retry_for)
{
	json_t *bounce = delivery_bounce_json(ctx, "delay", why);

	json_object_del(bounce, "failed_recipient");
	json_object_del(bounce, "notify");
	json_object_del(bounce, "orcpt");
	json_object_set_new(bounce, "will_retry_until",
						json_integer((json_int_t) (time(NULL) + (time_t) (retry_for > 0 ? retry_for : 0))));
	return bounce;
}

int
delivery_deferred(struct pepsi_ctx *ctx, const struct delivery_report *why)
{
	json_t	   *state = pepsi_state(ctx);
	long		attempts = (long) json_integer_value(json_object_get(state, "attempts")) + 1;
	double		lifetime = pepsi_option_seconds(ctx, "MAX_LIFETIME");
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	double		age = delivery_message_age(ctx);
	double		delay;
	char	   *last_error = delivery_last_error(why);
	json_t	   *merge;
	int			rc;

	if (age >= 0 && age >= lifetime)
	{
		free(last_error);
		return delivery_expired(ctx, why, attempts, age);
	}
	delay = delivery_retry_delay(ctx, attempts, age);

	merge = json_pack("{s:I,s:s}", "attempts", (json_int_t) attempts, "last_error", last_error);
	if (why->tls_policy)
		json_object_set_new(merge, "tls", delivery_tls_json(why));
	{
		char note[64];

		snprintf(note, sizeof(note), "attempt %ld, next in %.0fs", attempts, delay);
		maillog_delivery(ctx, "deferred", why, note);
	}
	if (delivery_delay_dsn_due(ctx, age))
	{
		json_t *indices = delivery_wanting_delay(ctx, NULL);

		if (json_array_size(indices) > 0)
		{
			char   *token = xasprintf("dsn-delay-%lld", pepsi_id(ctx));
			json_t *clones = json_pack("[{s:s,s:s,s:O,s:{s:o}}]", "token", token, "stage", bounce_stage,
									   "rcpt_indices", indices, "state", "bounce",
									   delivery_delay_bounce_json(ctx, why, lifetime - age));

			json_object_set_new(merge, "delay_sent", json_true());
			log_info("%s: row %lld: <%s>%s delayed for %.0f minutes; a delay DSN goes to <%s>", pepsi_queue_id(ctx), pepsi_id(ctx),
					 pepsi_rcpt(ctx, 0), pepsi_rcpt_count(ctx) > 1 ? " and others" : "", age / 60,
					 pepsi_mail_from(ctx));
			rc = pepsi_pause_with(ctx, merge, delay, NULL, 0, clones);
			json_decref(clones);
			free(token);
		}
		else
			rc = pepsi_pause(ctx, merge, delay);
		json_decref(indices);
	}
	else
		rc = pepsi_pause(ctx, merge, delay);
	json_decref(merge);
	free(last_error);
	return rc;
}

int
delivery_postponed(struct pepsi_ctx *ctx, const struct delivery_report *why, double seconds)
{
	double	lifetime = pepsi_option_seconds(ctx, "MAX_LIFETIME");
	double	age = delivery_message_age(ctx);
	long	waits = (long) json_integer_value(json_object_get(pepsi_state(ctx), "postponed")) + 1;
	json_t *merge;
	int		rc;

	if (age >= 0 && age >= lifetime)
		return delivery_expired(ctx, why, (long) json_integer_value(json_object_get(pepsi_state(ctx), "attempts")), age);
	if (age >= 0 && age + seconds > lifetime)
		seconds = lifetime - age + 0.5;
	if (seconds < 0.1)
		seconds = 0.1;
	merge = json_pack("{s:I}", "postponed", (json_int_t) waits);
	log_debug("%s: row %lld postponed %.1fs: %s", pepsi_queue_id(ctx), pepsi_id(ctx), seconds, why->diagnostic ? why->diagnostic : "");
	rc = pepsi_pause(ctx, merge, seconds);
	json_decref(merge);
	return rc;
}

/* ---------------------------------------------------------------------------
 * A transaction with several recipients
 * ------------------------------------------------------------------------- */

/* The split-off group of one bounced recipient (index 0-based), or NULL when it is dropped. */
static json_t *
delivery_bounce_group(struct pepsi_ctx *ctx, size_t index, const struct delivery_report *why)
{
	const char *bounce_stage = pepsi_option_for(ctx, "BOUNCE_STAGE", pepsi_rcpt(ctx, index));
	json_t	   *bounce = delivery_report_json(why);
	char	   *last_error = delivery_last_error(why);
	json_t	   *group;

	json_object_set_new(bounce, "kind", json_string("permanent"));
	delivery_set_string(bounce, "failed_recipient", pepsi_rcpt(ctx, index));
	delivery_set_string(bounce, "notify", delivery_notify(ctx, index));
	delivery_set_string(bounce, "orcpt", delivery_orcpt(ctx, index));
	delivery_set_string(bounce, "envid", delivery_dsn_param(ctx, "envid"));
	json_object_set_new(bounce, "at", json_integer((json_int_t) time(NULL)));
	group = json_pack("{s:[i],s:{s:s,s:o}}", "rcpt_indices", (int) index + 1, "state", "last_error",
					  last_error, "bounce", bounce);
	if (bounce_stage)
		json_object_set_new(group, "stage", json_string(bounce_stage));
	else
		json_object_set_new(group, "status", json_string("failed"));
	free(last_error);
	return group;
}

/*
 * The deferred recipients at indices leave the row for a retry of their
 * own (retry_group): when a delay DSN is owed for them, it goes with them,
 * as a group of its own at BOUNCE_STAGE carrying those who asked for it
 * (with their DSN parameters), and the retry group remembers it was sent.
 */
static void
delivery_split_delay_dsn(struct pepsi_ctx *ctx, json_t *indices, const struct delivery_report *why,
						 json_t *retry_group, json_t *groups)
{
	double	age = delivery_message_age(ctx);
	json_t *wanting;
	json_t *rcpt_to;
	json_t *dsn_rcpt;
	json_t *dsn;
	json_t *all_rcpt = delivery_dsn_rcpts(ctx);
	size_t	k;
	json_t *index;

	if (!delivery_delay_dsn_due(ctx, age))
		return;
	wanting = delivery_wanting_delay(ctx, indices);
	if (json_array_size(wanting) == 0)
	{
		json_decref(wanting);
		return;
	}
	rcpt_to = json_array();
	dsn_rcpt = json_array();
	json_array_foreach (wanting, k, index)
	{
		size_t i = (size_t) json_integer_value(index) - 1;

		json_array_append_new(rcpt_to, json_string(pepsi_rcpt(ctx, i)));
		json_array_append(dsn_rcpt, delivery_dsn_rcpt_entry(all_rcpt, pepsi_rcpt_count(ctx), i));
	}
	/* A group of new addresses loses state.dsn.rcpt: it is given back for those it carries. */
	dsn = json_deep_copy(delivery_get_any_case(pepsi_state(ctx), "dsn"));
	if (!json_is_object(dsn))
	{
		json_decref(dsn);
		dsn = json_object();
	}
	json_object_set_new(dsn, "rcpt", dsn_rcpt);
	json_array_append_new(groups,
						  json_pack("{s:o,s:s,s:{s:o,s:o}}", "rcpt_to", rcpt_to, "stage",
									pepsi_option(ctx, "BOUNCE_STAGE"), "state", "bounce",
									delivery_delay_bounce_json(ctx, why,
															   pepsi_option_seconds(ctx, "MAX_LIFETIME") - age),
									"dsn", dsn));
	json_object_set_new(json_object_get(retry_group, "state"), "delay_sent", json_true());
	log_info("%s: row %lld: %zu recipient%s delayed for %.0f minutes; a delay DSN goes to <%s>", pepsi_queue_id(ctx), pepsi_id(ctx),
			 json_array_size(wanting), json_array_size(wanting) == 1 ? "" : "s", age / 60,
			 pepsi_mail_from(ctx));
	json_decref(wanting);
}

int
delivery_each(struct pepsi_ctx *ctx, const struct delivery_outcome *outcomes, const char *action,
			  bool next_hop_notifies)
{
	size_t						   n = pepsi_rcpt_count(ctx);
	size_t						   count[3] = {0, 0, 0};
	enum delivery_class			   kept;
	const struct delivery_outcome *first_kept = NULL;
	const struct delivery_outcome *first_deferred = NULL;
	int							  *keep = xcalloc(n + 1, sizeof(int));
	size_t						   nkeep = 0;
	json_t						  *groups = json_array();
	json_t						  *deferred_indices = json_array();
	bool						   null_sender = pepsi_mail_from(ctx)[0] == '\0';
	json_t						  *retry_group;
	int							   rc;

	for (size_t i = 0; i < n; i++)
		count[outcomes[i].class]++;
	kept = count[DELIVERY_SENT] ? DELIVERY_SENT : count[DELIVERY_DEFERRED] ? DELIVERY_DEFERRED
																		   : DELIVERY_BOUNCED;
	for (size_t i = 0; i < n; i++)
	{
		const struct delivery_outcome *o = &outcomes[i];

		if (o->class == kept && (kept != DELIVERY_BOUNCED || nkeep == 0))
		{
			keep[nkeep++] = (int) i + 1;
			if (first_kept == NULL)
				first_kept = o;
			continue;
		}
		if (o->class == DELIVERY_DEFERRED)
		{
			json_array_append_new(deferred_indices, json_integer((json_int_t) i + 1));
			if (first_deferred == NULL)
				first_deferred = o;
			continue;
		}
		/* Bounced beside others: its own row at BOUNCE_STAGE (none for the null sender). */
		maillog_delivery_recipient(ctx, i, "bounced", &o->report,
								   null_sender ? "from the null sender: dropped, a bounce is never bounced" : NULL);
		if (!null_sender)
			json_array_append_new(groups, delivery_bounce_group(ctx, i, &o->report));
	}
	if (json_array_size(deferred_indices) > 0)
	{
		long	attempts = (long) json_integer_value(json_object_get(pepsi_state(ctx), "attempts")) + 1;
		double	delay = delivery_retry_delay(ctx, attempts, delivery_message_age(ctx));
		char   *last_error = delivery_last_error(&first_deferred->report);
		char	note[64];
		size_t	k;
		json_t *index;

		snprintf(note, sizeof(note), "attempt %ld, next in %.0fs", attempts, delay);
		json_array_foreach (deferred_indices, k, index)
			maillog_delivery_recipient(ctx, (size_t) json_integer_value(index) - 1, "deferred",
									   &outcomes[json_integer_value(index) - 1].report, note);
		retry_group = json_pack("{s:O,s:s,s:f,s:{s:I,s:s}}", "rcpt_indices", deferred_indices, "status",
								"retry", "retry_seconds", delay, "state", "attempts", (json_int_t) attempts,
								"last_error", last_error);
		delivery_split_delay_dsn(ctx, deferred_indices, &first_deferred->report, retry_group, groups);
		json_array_append_new(groups, retry_group);
		free(last_error);
	}
	json_decref(deferred_indices);
	if (json_array_size(groups) == 0 && nkeep < n)
	{
		/* Only dropped recipients (bounced, of a bounce): the row simply loses them. */
		char **remaining = xcalloc(nkeep + 1, sizeof(char *));

		for (size_t i = 0; i < nkeep; i++)
			remaining[i] = xstrdup(pepsi_rcpt(ctx, (size_t) keep[i] - 1));
		pepsi_set_rcpt_to(ctx, (const char *const *) remaining, nkeep);
		for (size_t i = 0; i < nkeep; i++)
			free(remaining[i]);
		free(remaining);
	}
	else if (json_array_size(groups) > 0)
	{
		if (pepsi_fan_out(ctx, keep, nkeep, groups) < 0)
		{
			free(keep);
			json_decref(groups);
			return -1;
		}
	}
	free(keep);
	json_decref(groups);
	switch (kept)
	{
		case DELIVERY_SENT:
			rc = delivery_succeeded(ctx, action, &first_kept->report, next_hop_notifies);
			break;
		case DELIVERY_DEFERRED:
			rc = delivery_deferred(ctx, &first_kept->report);
			break;
		default:
			rc = delivery_bounced(ctx, &first_kept->report);
			break;
	}
	return rc;
}

/* ---------------------------------------------------------------------------
 * What an SMTP next hop said, as a report
 * ------------------------------------------------------------------------- */

void
delivery_report_from_smtp(const struct smtp_result *r, const struct smtp_reply *reply,
						  struct delivery_report *report, char *status, size_t status_len,
						  struct buf *diagnostic)
{
	/* A 2xx left from the session's start decides nothing about a failed transaction. */
	bool			decides;
	enum smtp_phase phase;

	if (reply == NULL)
		reply = &r->reply;
	decides = reply->code > 0 && !(reply == &r->reply && r->outcome != SMTP_DELIVERED && reply->code / 100 == 2);
	/* A reply the session could not finish reading (too long, cut off) is not what decided. */
	if (reply == &r->reply && r->outcome != SMTP_DELIVERED && r->error[0] && reply->code / 100 != 4
		&& reply->code / 100 != 5)
		decides = false;
	memset(report, 0, sizeof(*report));
	if (reply->enhanced[0] && (decides || reply->code == 0))
		snprintf(status, status_len, "%s", reply->enhanced);
	else if (decides)
		snprintf(status, status_len, "%d.0.0", reply->code / 100);
	else if (r->phase == SMTP_PHASE_CONNECT)
		snprintf(status, status_len, "4.4.1"); /* no answer from host */
	else if (r->phase == SMTP_PHASE_STARTTLS || r->phase == SMTP_PHASE_AUTH)
		snprintf(status, status_len, "4.7.0"); /* security */
	else
		snprintf(status, status_len, "4.4.2"); /* bad connection */
	report->status = status;
	buf_reset(diagnostic);
	if (decides)
	{
		buf_printf(diagnostic, "smtp; %d %s", reply->code, reply->text.data ? reply->text.data : "");
		report->smtp_code = reply->code;
		report->reply_text = reply->text.data;
	}
	else
		buf_printf(diagnostic, "X-Pepsi; %s", r->error[0] ? r->error : "no reply");
	report->diagnostic = diagnostic->data;
	report->remote_mta = r->remote_mta[0] ? r->remote_mta : NULL;
	if (reply == &r->reply)
		phase = r->phase;
	else if (r->data_replies && reply >= r->data_replies && reply < r->data_replies + r->nrcpt)
		phase = SMTP_PHASE_MESSAGE; /* LMTP: the recipient's reply after the message */
	else
		phase = SMTP_PHASE_RCPT;
	report->phase = smtp_phase_name(phase);
	report->relay = r->relay[0] ? r->relay : NULL;
	report->tls = r->tls[0] ? r->tls : NULL;
	report->tls_policy = r->tls_outcome[0] ? r->tls_outcome : NULL;
	report->tls_result = r->tls_result[0] ? r->tls_result : NULL;
	report->connect_seconds = r->connect_seconds;
	report->transfer_seconds = r->transfer_seconds;
}

/* ---------------------------------------------------------------------------
 * The envelope of a row
 * ------------------------------------------------------------------------- */

void
delivery_envelope(const struct pepsi_ctx *ctx, size_t n, const char **rcpt, const char **notify,
				  const char **orcpt, struct smtp_envelope *env)
{
	json_t	   *origin = json_object_get(pepsi_state(ctx), "origin");
	const char *body = json_string_value(json_object_get(origin, "body"));

	for (size_t i = 0; i < n; i++)
	{
		rcpt[i] = pepsi_rcpt(ctx, i);
		notify[i] = delivery_notify(ctx, i);
		orcpt[i] = delivery_orcpt(ctx, i);
	}
	memset(env, 0, sizeof(*env));
	env->mail_from = pepsi_mail_from(ctx);
	env->rcpt = rcpt;
	env->nrcpt = n;
	env->notify = notify;
	env->orcpt = orcpt;
	env->ret = delivery_dsn_param(ctx, "ret");
	env->envid = delivery_dsn_param(ctx, "envid");
	env->body_8bit = body && strcasecmp(body, "8BITMIME") == 0;
	env->smtputf8 = json_is_true(json_object_get(origin, "smtputf8"));
	env->requiretls = json_is_true(json_object_get(origin, "requiretls"));
}
