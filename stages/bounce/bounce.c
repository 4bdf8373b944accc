/*
 * pepsi-stage-bounce: turn a row into the delivery status notification its
 * sender asked for (RFC 3464, honouring RFC 3461 RET, ENVID, NOTIFY and
 * ORCPT), then send that on like any other message.
 *
 * A row arrives here with state.bounce (kind permanent, delay or success,
 * and what the delivery stage learnt: status, diagnostic, remote_mta,
 * smtp_code, phase, reply_text, failed_recipient, notify, orcpt, envid);
 * a success DSN finds the details in state.delivery.  The row becomes the
 * DSN: a new message from the null sender to the original sender, with a
 * fresh header block and body (the original body stays shared by the
 * message's other rows) and a cleared state; then it advances to
 * NEXT_STAGE.  A message from the null sender is never answered, and a
 * recipient whose NOTIFY does not ask for this kind gets nothing: either
 * way the row is finished with a log line.
 *
 * One DSN answers every recipient of a message that failed together: the
 * delivery stages fail one recipient per row, and pepsi.bounce_gather
 * lets the first row wait GATHER_WINDOW for its siblings and then takes
 * them in.  DSN_RATE_LIMIT caps the DSNs one address gets per hour, so
 * forged senders cannot turn Pepsi into a backscatter source.
 *
 * Options of its [stage-*] section:
 *   NEXT_STAGE          where the DSN goes (required: typically the router)
 *   RETURN_SIZE_LIMIT   a message larger than this (default 10M) is
 *                       returned as its headers only
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/delivery.h"
#include "delivery/maillog.h"
#include "message/dsn.h"
#include "message/origin.h"
#include "message/queue_id.h"
#include "runtime/stage.h"

int pepsi_stage_bounce_main(int argc, char **argv);

static const char *
bounce_string(json_t *object, const char *key)
{
	const char *value = json_string_value(json_object_get(object, key));

	return value && *value ? value : NULL;
}

/* The first "d.d.d" of a text, for a report that only carries a diagnostic. */
static bool
bounce_find_status(const char *text, char *out, size_t outlen)
{
	for (const char *p = text; p && *p; p++)
	{
		int n = 0;
		int a,
			b,
			c;

		if ((*p == '2' || *p == '4' || *p == '5') && (p == text || p[-1] == ' ' || p[-1] == ';')
			&& sscanf(p, "%1d.%3d.%3d%n", &a, &b, &c, &n) == 3 && (p[n] == ' ' || p[n] == '\0'))
		{
			snprintf(out, outlen, "%d.%d.%d", a, b, c);
			return true;
		}
	}
	return false;
}

/* "smtp; 550 ..." stays; a bare text becomes "X-Pepsi; text". */
static char *
bounce_diagnostic_code(const char *diagnostic)
{
	const char *semi;

	if (diagnostic == NULL)
		return NULL;
	semi = strchr(diagnostic, ';');
	if (semi && semi > diagnostic && strcspn(diagnostic, " ") > (size_t) (semi - diagnostic))
		return xstrdup(diagnostic);
	return xasprintf("X-Pepsi; %s", diagnostic);
}

static enum dsn_kind
bounce_kind(const char *kind, const char **notify_keyword, const char **action)
{
	if (kind && strcasecmp(kind, "delay") == 0)
	{
		*notify_keyword = "DELAY";
		*action = "delayed";
		return DSN_DELAY;
	}
	if (kind && strcasecmp(kind, "success") == 0)
	{
		*notify_keyword = "SUCCESS";
		*action = "delivered";
		return DSN_SUCCESS;
	}
	*notify_keyword = "FAILURE";
	*action = "failed";
	return DSN_FAILURE;
}

/*
 * The rows this DSN answers for: this one and the siblings bounce_gather
 * took into it, each {rcpt_to, bounce, delivery, dsn_rcpt}.  NULL when the
 * row should wait for its siblings first (it is then paused) or on error.
 */
static json_t *
bounce_gather(struct pepsi_ctx *ctx, int *rc)
{
	char		id[32];
	char		window[32];
	const char *values[3] = {id, pepsi_stage_name(ctx), window};
	json_t	   *answer;
	json_t	   *rows;
	json_t	   *own;
	json_t	   *rcpts = json_array();
	const char *action;

	snprintf(id, sizeof(id), "%lld", pepsi_id(ctx));
	snprintf(window, sizeof(window), "%.3f", pepsi_option_seconds(ctx, "GATHER_WINDOW"));
	answer = pepsi_call_json(ctx, "SELECT pepsi.bounce_gather($1, $2, $3)", 3, values);
	if (answer == NULL)
	{
		json_decref(rcpts);
		*rc = -1;
		return NULL;
	}
	action = json_string_value(json_object_get(answer, "action"));
	if (action && strcmp(action, "wait") == 0)
	{
		double	seconds = json_number_value(json_object_get(answer, "seconds"));
		json_t *merge = json_pack("{s:O}", "bounce_gather", json_object_get(answer, "bounce_gather"));

		log_info("%s: row %lld: waits %.1fs for the other recipients of its message, to send one DSN",
				 pepsi_queue_id(ctx), pepsi_id(ctx), seconds);
		*rc = pepsi_pause(ctx, merge, seconds > 0.1 ? seconds : 0.1);
		json_decref(merge);
		json_decref(answer);
		json_decref(rcpts);
		return NULL;
	}
	rows = json_object_get(answer, "gathered");
	if (action == NULL || strcmp(action, "report") != 0 || !json_is_array(rows))
	{
		json_decref(answer);
		json_decref(rcpts);
		*rc = pepsi_error(ctx, "pepsi.bounce_gather gave an answer the bounce stage does not know");
		return NULL;
	}
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
		json_array_append_new(rcpts, json_string(pepsi_rcpt(ctx, i)));
	own = json_pack("{s:o, s:O?, s:O?, s:O?}", "rcpt_to", rcpts,
					"bounce", json_object_get(pepsi_state(ctx), "bounce"),
					"delivery", json_object_get(pepsi_state(ctx), "delivery"),
					"dsn_rcpt", delivery_dsn_rcpts(ctx));
	json_incref(rows);
	json_array_insert_new(rows, 0, own);
	json_decref(answer);
	return rows;
}

/* One DSN's recipient list, from every row it answers for. */
struct bounce_recipients
{
	struct dsn_recipient *rcpts;
	char				**diagnostics;
	char (*status_text)[16];
	size_t n;
};

/* Add the recipients of one gathered row that asked for this kind of report. */
static void
bounce_add_row(struct pepsi_ctx *ctx, json_t *row, enum dsn_kind kind, const char *notify_keyword,
			   const char *default_action, struct bounce_recipients *out)
{
	json_t	   *rcpt_to = json_object_get(row, "rcpt_to");
	json_t	   *bounce = json_object_get(row, "bounce");
	json_t	   *delivery = json_object_get(row, "delivery");
	json_t	   *dsn_rcpt = json_object_get(row, "dsn_rcpt");
	json_t	   *source = kind == DSN_SUCCESS && json_is_object(delivery) ? delivery : bounce;
	const char *failed = bounce_string(bounce, "failed_recipient");
	size_t		count = json_array_size(rcpt_to);

	for (size_t i = 0; i < count; i++)
	{
		const char			 *rcpt = json_string_value(json_array_get(rcpt_to, i));
		const char			 *notify = delivery_notify_in(dsn_rcpt, count, i);
		const char			 *orcpt = delivery_orcpt_in(dsn_rcpt, count, i);
		const char			 *status = bounce_string(source, "status");
		struct dsn_recipient *r = &out->rcpts[out->n];
		char				 *status_slot = out->status_text[out->n];

		if (rcpt == NULL)
			continue;
		/* A report about one recipient (the delivery stages) concerns only it. */
		if (failed)
		{
			if (strcmp(rcpt, failed) != 0)
				continue;
			if (bounce_string(bounce, "notify"))
				notify = bounce_string(bounce, "notify");
			if (bounce_string(bounce, "orcpt"))
				orcpt = bounce_string(bounce, "orcpt");
		}
		if (!delivery_notify_wants(notify, notify_keyword))
		{
			log_info("%s: row %lld: <%s> asked for no %s DSN (NOTIFY=%s)", pepsi_queue_id(ctx), pepsi_id(ctx), rcpt,
					 notify_keyword, notify ? notify : "(none)");
			continue;
		}
		r->final_recipient = rcpt;
		r->original_recipient = orcpt;
		r->action = kind == DSN_SUCCESS && bounce_string(source, "action")
						? bounce_string(source, "action")
						: default_action;
		if (status == NULL)
			status = bounce_string(source, "enhanced_status");
		out->diagnostics[out->n] = bounce_diagnostic_code(bounce_string(source, "diagnostic"));
		if (status == NULL && bounce_find_status(bounce_string(source, "diagnostic"), status_slot, 16))
			status = status_slot;
		if (status == NULL)
			status = kind == DSN_SUCCESS ? "2.0.0" : kind == DSN_DELAY ? "4.0.0"
																	   : "5.0.0";
		r->status = status;
		r->remote_mta = bounce_string(source, "remote_mta");
		r->diagnostic_code = out->diagnostics[out->n];
		r->last_attempt = (time_t) json_integer_value(json_object_get(source, "at"));
		r->will_retry_until = (time_t) json_integer_value(json_object_get(bounce, "will_retry_until"));
		out->n++;
	}
}

/* Past [stage] DSN_RATE_LIMIT for this address this hour?  (pepsi.dsn_rate_take logs the drop.) */
static bool
bounce_over_rate_limit(struct pepsi_ctx *ctx, const char *sender, bool *failed)
{
	char		limit[32];
	const char *values[2] = {sender, limit};
	json_t	   *answer;
	bool		over;

	snprintf(limit, sizeof(limit), "%lld", pepsi_option_int(ctx, "DSN_RATE_LIMIT"));
	answer = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.dsn_rate_take($1, $2))", 2, values);
	*failed = answer == NULL;
	over = answer != NULL && json_is_false(answer);
	json_decref(answer);
	return over;
}

static int
bounce_run(struct pepsi_ctx *ctx)
{
	json_t					*state = pepsi_state(ctx);
	json_t					*bounce = json_object_get(state, "bounce");
	const char				*notify_keyword;
	const char				*default_action;
	enum dsn_kind			 kind = bounce_kind(bounce_string(bounce, "kind"), &notify_keyword, &default_action);
	const char				*sender = pepsi_mail_from(ctx);
	const char				*failed = bounce_string(bounce, "failed_recipient");
	const char				*ret = delivery_dsn_param(ctx, "ret");
	const char				*hostname = config_hostname(pepsi_config(ctx));
	const struct buf		*headers;
	const struct buf		*body;
	json_t					*rows;
	size_t					 total = 0;
	struct bounce_recipients list = {0};
	struct dsn_report		 report = {0};
	struct buf				 new_headers = BUF_INIT;
	char					 dsn_queue_id[QUEUE_ID_LEN + 1];
	struct buf				 new_body = BUF_INIT;
	struct buf				 unique = BUF_INIT;
	json_t					*new_state;
	const char				*to[1];
	char					*sender_copy;
	bool					 rate_failed;
	int						 rc = 0;

	if (sender[0] == '\0')
	{
		log_info("%s: row %lld: no %s DSN for a message from the null sender (to <%s>); finished",
				 pepsi_queue_id(ctx), pepsi_id(ctx), bounce_string(bounce, "kind") ? bounce_string(bounce, "kind") : "permanent",
				 failed ? failed : pepsi_rcpt(ctx, 0));
		return pepsi_finish(ctx);
	}
	if ((rows = bounce_gather(ctx, &rc)) == NULL)
		return rc;
	if ((headers = pepsi_headers(ctx)) == NULL || (body = pepsi_body(ctx)) == NULL)
	{
		json_decref(rows);
		return -1;
	}

	for (size_t i = 0; i < json_array_size(rows); i++)
		total += json_array_size(json_object_get(json_array_get(rows, i), "rcpt_to"));
	list.rcpts = xcalloc(total + 1, sizeof(*list.rcpts));
	list.diagnostics = xcalloc(total + 1, sizeof(char *));
	list.status_text = xcalloc(total + 1, sizeof(*list.status_text));
	for (size_t i = 0; i < json_array_size(rows); i++)
		bounce_add_row(ctx, json_array_get(rows, i), kind, notify_keyword, default_action, &list);
	sender_copy = xstrdup(sender);
	if (list.n == 0)
	{
		log_info("%s: row %lld: %s DSN to <%s> suppressed by NOTIFY; finished", pepsi_queue_id(ctx), pepsi_id(ctx),
				 notify_keyword, sender);
		rc = pepsi_finish(ctx);
		goto out;
	}
	if (bounce_over_rate_limit(ctx, sender, &rate_failed))
	{
		log_warnx("%s: row %lld: %s DSN to <%s> about %zu recipient%s dropped: more than %lld DSNs to"
				  " this address this hour (DSN_RATE_LIMIT)",
				  pepsi_queue_id(ctx), pepsi_id(ctx), notify_keyword, sender, list.n, list.n == 1 ? "" : "s",
				  pepsi_option_int(ctx, "DSN_RATE_LIMIT"));
		rc = pepsi_finish(ctx);
		goto out;
	}
	if (rate_failed)
	{
		rc = -1;
		goto out;
	}

	buf_printf(&unique, "%lld", pepsi_id(ctx));
	report.kind = kind;
	report.reporting_mta = hostname;
	report.original_sender = sender;
	report.envid = bounce_string(bounce, "envid") ? bounce_string(bounce, "envid")
												  : delivery_dsn_param(ctx, "envid");
	report.now = time(NULL);
	report.unique = unique.data;
	/* RFC 3461 4.3: the whole message only in a failure report, and not with RET=HDRS. */
	report.return_full = kind == DSN_FAILURE && !(ret && strcasecmp(ret, "HDRS") == 0)
						 && (long) (headers->len + body->len) <= pepsi_option_size(ctx, "RETURN_SIZE_LIMIT");
	report.headers = headers->data ? headers->data : "";
	report.headers_len = headers->len;
	report.body = body->data ? body->data : "";
	report.body_len = body->len;
	report.recipients = list.rcpts;
	report.nrecipients = list.n;
	dsn_build(&report, &new_headers, &new_body);

	/* The DSN is a new message: a queue id of its own, logged as Postfix's bounce daemon does. */
	pepsi_new_queue_id(ctx, dsn_queue_id);
	log_info("%s: sender %s notification: %s (row %lld: %s DSN to <%s> about %zu recipient%s, first <%s>: %s)",
			 pepsi_queue_id(ctx), kind == DSN_FAILURE ? "non-delivery" : kind == DSN_DELAY ? "delay"
																						   : "delivery status",
			 dsn_queue_id, pepsi_id(ctx),
			 kind == DSN_FAILURE ? "failure" : kind == DSN_DELAY ? "delay"
																 : "success",
			 sender, list.n, list.n == 1 ? "" : "s", list.rcpts[0].final_recipient,
			 list.rcpts[0].status);
	{
		json_t *event = json_pack("{s:s, s:s, s:I, s:s, s:s}",
								  "kind", kind == DSN_FAILURE ? "failure" : kind == DSN_DELAY ? "delay"
																							  : "success",
								  "to", sender, "recipients", (json_int_t) list.n,
								  "final_recipient", list.rcpts[0].final_recipient,
								  "status", list.rcpts[0].status);

		pepsi_mail_log(ctx, "dsn", event);
		json_decref(event);
	}
	to[0] = sender_copy;
	/*
	 * The DSN's own clock: MAX_LIFETIME of its delivery counts from now, not
	 * from the original.  It is Pepsi's own message, whoever sent the
	 * original: its origin is trusted and it is signed (common/message/origin.h).
	 */
	new_state = json_pack("{s:I, s:o, s:s}", "created_at", (json_int_t) report.now, "origin",
						  origin_generated("pepsi-stage-bounce"), "queue_id", dsn_queue_id);
	pepsi_set_headers(ctx, new_headers.data, new_headers.len);
	pepsi_set_body(ctx, new_body.data, new_body.len);
	pepsi_set_rcpt_to(ctx, to, 1);
	pepsi_set_mail_from(ctx, "");
	pepsi_set_state(ctx, new_state);
	json_decref(new_state);
	rc = pepsi_advance(ctx);
	maillog_queued(dsn_queue_id, "", new_headers.len + new_body.len + 2, 1, pepsi_id(ctx));

out:
	for (size_t i = 0; i < list.n; i++)
		free(list.diagnostics[i]);
	free(list.diagnostics);
	free(list.status_text);
	free(list.rcpts);
	free(sender_copy);
	buf_free(&new_headers);
	buf_free(&new_body);
	buf_free(&unique);
	json_decref(rows);
	return rc;
}

static bool
bounce_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	if (config_get(cfg, section, "NEXT_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs NEXT_STAGE (where the DSNs it makes go)",
				 cfg->path, section);
		return false;
	}
	return true;
}

const struct pepsi_stage pepsi_stage_bounce_stage = {
	.program = "pepsi-stage-bounce",
	.load = PEPSI_LOAD_FULL,
	.run = bounce_run,
	.check_config = bounce_check_config,
};

int
pepsi_stage_bounce_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_bounce_stage, argc, argv);
}
