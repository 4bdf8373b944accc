/* maillog.c: see maillog.h. */
#include "delivery/maillog.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <syslog.h>

#include <jansson.h>

#include "base/buf.h"
#include "base/log.h"

/* The original recipient when an earlier stage rewrote it (ORCPT), else NULL. */
static const char *
maillog_orig_to(struct pepsi_ctx *ctx, size_t index)
{
	const char *orcpt = delivery_orcpt(ctx, index);
	const char *rcpt = pepsi_rcpt(ctx, index);

	if (orcpt == NULL)
		return NULL;
	if (strncasecmp(orcpt, "rfc822;", 7) == 0)
		orcpt += 7;
	return strcasecmp(orcpt, rcpt) == 0 ? NULL : orcpt;
}

/*
 * What the content filters said on the way here (state.milter.verdict,
 * pepsi-stage-milter), or NULL: the line says it as Postfix's logs tie a
 * milter's action to the queue id.
 */
static const char *
maillog_milter_verdict(struct pepsi_ctx *ctx)
{
	json_t *milter = json_object_get(pepsi_state(ctx), "milter");

	return json_is_object(milter) ? json_string_value(json_object_get(milter, "verdict")) : NULL;
}

/* What the next hop said, else the local reason. */
static const char *
maillog_reply(const struct delivery_report *r)
{
	if (r->smtp_code > 0 && r->diagnostic && strncmp(r->diagnostic, "smtp; ", 6) == 0)
		return r->diagnostic + 6;
	if (r->diagnostic && strncmp(r->diagnostic, "X-Pepsi; ", 9) == 0)
		return r->diagnostic + 9;
	return r->diagnostic ? r->diagnostic : "";
}

void
maillog_queued(const char *queue_id, const char *mail_from, size_t size, size_t nrcpt, long long row_id)
{
	struct buf line = BUF_INIT;

	buf_printf(&line, "%s: from=<%s>, size=%zu, nrcpt=%zu (queue active, row %lld)", queue_id, mail_from,
			   size, nrcpt, row_id);
	log_as("qmgr", LOG_INFO, NULL, line.data);
	buf_free(&line);
}

void
maillog_pickup(const char *queue_id, unsigned long uid, const char *mail_from)
{
	struct buf line = BUF_INIT;

	buf_printf(&line, "%s: uid=%lu from=<%s>", queue_id, uid, mail_from);
	log_as("pickup", LOG_INFO, NULL, line.data);
	buf_free(&line);
}

void
maillog_delivery(struct pepsi_ctx *ctx, const char *status, const struct delivery_report *r,
				 const char *note)
{
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
		maillog_delivery_recipient(ctx, i, status, r, note);
}

void
maillog_delivery_recipient(struct pepsi_ctx *ctx, size_t index, const char *status,
						   const struct delivery_report *r, const char *note)
{
	double		queued = pepsi_message_age(ctx);
	double		in_stage = pepsi_pass_seconds(ctx) - r->connect_seconds - r->transfer_seconds;
	const char *orig_to = maillog_orig_to(ctx, index);
	const char *reply = maillog_reply(r);
	const char *milter = maillog_milter_verdict(ctx);
	const char *dsn = r->status ? r->status : (strcmp(status, "sent") == 0 ? "2.0.0" : "4.0.0");
	/* The delivering stage's service (smtp, lmtp, local), also when it ran fused into another's worker. */
	const char *service = log_service_of(pepsi_program(ctx));
	json_t	   *fields;
	struct buf	line = BUF_INIT;
	char	   *members;

	if (queued < 0)
		queued = 0;
	if (in_stage < 0)
		in_stage = 0;
	buf_printf(&line, "%s: to=<%s>", pepsi_queue_id(ctx), pepsi_rcpt(ctx, index));
	if (orig_to)
		buf_printf(&line, ", orig_to=<%s>", orig_to);
	buf_printf(&line, ", relay=%s, delay=%.2f, delays=%.2f/%.2f/%.2f/%.2f, dsn=%s, status=%s (%s%s%s)",
			   r->relay ? r->relay : "none",
			   queued + in_stage + r->connect_seconds + r->transfer_seconds,
			   queued, in_stage, r->connect_seconds, r->transfer_seconds, dsn, status, reply,
			   note ? "; " : "", note ? note : "");
	if (r->tls && *r->tls)
		buf_printf(&line, ", tls=%s", r->tls);
	if (r->tls_policy)
		buf_printf(&line, ", tls_policy=%s%s%s", r->tls_policy, r->tls_result ? "; " : "",
				   r->tls_result ? r->tls_result : "");
	if (milter)
		buf_printf(&line, ", milter=%s", milter);
	buf_printf(&line, ", row=%lld", pepsi_id(ctx));

	fields = json_pack("{s:s, s:I, s:s, s:s?, s:s, s:f, s:{s:f, s:f, s:f, s:f}, s:s, s:s, s:s, s:s?, s:s?, s:s?}",
					   "queue_id", pepsi_queue_id(ctx), "row", (json_int_t) pepsi_id(ctx), "to", pepsi_rcpt(ctx, index),
					   "orig_to", orig_to, "relay", r->relay ? r->relay : "none",
					   "delay", queued + in_stage + r->connect_seconds + r->transfer_seconds,
					   "delays", "queue", queued, "stage", in_stage, "connection", r->connect_seconds,
					   "transmission", r->transfer_seconds,
					   "dsn", dsn, "status", status, "reply", reply, "note", note,
					   "tls", r->tls && *r->tls ? r->tls : NULL, "milter", milter);
	if (r->tls_policy)
		json_object_set_new(fields, "tls_policy", json_pack("{s:s, s:s?}", "outcome", r->tls_policy, "result", r->tls_result));
	/* The members, without the object's braces, for the JSON log line. */
	members = json_dumps(fields, JSON_COMPACT | JSON_ENSURE_ASCII);
	if (members && strlen(members) >= 2)
	{
		members[strlen(members) - 1] = '\0';
		log_as(service, LOG_INFO, members + 1, line.data);
	}
	else
		log_as(service, LOG_INFO, NULL, line.data);
	pepsi_mail_log(ctx, "delivery", fields);
	pepsi_report_delivery(ctx, status, queued + in_stage + r->connect_seconds + r->transfer_seconds);
	free(members);
	json_decref(fields);
	buf_free(&line);
}
