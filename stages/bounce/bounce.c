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

#include "delivery.h"
#include "dsn.h"
#include "log.h"
#include "stage.h"
#include "xalloc.h"

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

static int
bounce_run(struct pepsi_ctx *ctx)
{
	json_t				 *state = pepsi_state(ctx);
	json_t				 *bounce = json_object_get(state, "bounce");
	json_t				 *delivery = json_object_get(state, "delivery");
	const char			 *notify_keyword;
	const char			 *default_action;
	enum dsn_kind		  kind = bounce_kind(bounce_string(bounce, "kind"), &notify_keyword, &default_action);
	json_t				 *source = kind == DSN_SUCCESS && json_is_object(delivery) ? delivery : bounce;
	const char			 *sender = pepsi_mail_from(ctx);
	const char			 *failed = bounce_string(bounce, "failed_recipient");
	const char			 *ret = delivery_dsn_param(ctx, "ret");
	const char			 *hostname = config_hostname(pepsi_config(ctx));
	const struct buf	 *headers;
	const struct buf	 *body;
	struct dsn_recipient *rcpts;
	char				**diagnostics;
	char				 *status_text;
	size_t				  n = 0;
	struct dsn_report	  report = {0};
	struct buf			  new_headers = BUF_INIT;
	struct buf			  new_body = BUF_INIT;
	struct buf			  unique = BUF_INIT;
	json_t				 *new_state;
	const char			 *to[1];

	if (sender[0] == '\0')
	{
		log_info("row %lld: no %s DSN for a message from the null sender (to <%s>); finished",
				 pepsi_id(ctx), bounce_string(bounce, "kind") ? bounce_string(bounce, "kind") : "permanent",
				 failed ? failed : pepsi_rcpt(ctx, 0));
		return pepsi_finish(ctx);
	}
	if ((headers = pepsi_headers(ctx)) == NULL || (body = pepsi_body(ctx)) == NULL)
		return -1;

	rcpts = xcalloc(pepsi_rcpt_count(ctx) + 1, sizeof(*rcpts));
	diagnostics = xcalloc(pepsi_rcpt_count(ctx) + 1, sizeof(char *));
	status_text = xcalloc(pepsi_rcpt_count(ctx) + 1, 16);
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
	{
		const char			 *rcpt = pepsi_rcpt(ctx, i);
		const char			 *notify = delivery_notify(ctx, i);
		const char			 *orcpt = delivery_orcpt(ctx, i);
		const char			 *status = bounce_string(source, "status");
		struct dsn_recipient *r = &rcpts[n];
		char				 *status_slot = status_text + 16 * n;

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
			log_info("row %lld: <%s> asked for no %s DSN (NOTIFY=%s)", pepsi_id(ctx), rcpt,
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
		diagnostics[n] = bounce_diagnostic_code(bounce_string(source, "diagnostic"));
		if (status == NULL && bounce_find_status(bounce_string(source, "diagnostic"), status_slot, 16))
			status = status_slot;
		if (status == NULL)
			status = kind == DSN_SUCCESS ? "2.0.0" : kind == DSN_DELAY ? "4.0.0"
																	   : "5.0.0";
		r->status = status;
		r->remote_mta = bounce_string(source, "remote_mta");
		r->diagnostic_code = diagnostics[n];
		r->last_attempt = (time_t) json_integer_value(json_object_get(source, "at"));
		r->will_retry_until = (time_t) json_integer_value(json_object_get(bounce, "will_retry_until"));
		n++;
	}
	if (n == 0)
	{
		log_info("row %lld: %s DSN to <%s> suppressed by NOTIFY; finished", pepsi_id(ctx),
				 notify_keyword, sender);
		for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
			free(diagnostics[i]);
		free(diagnostics);
		free(status_text);
		free(rcpts);
		return pepsi_finish(ctx);
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
	report.recipients = rcpts;
	report.nrecipients = n;
	dsn_build(&report, &new_headers, &new_body);

	log_info("row %lld: %s DSN to <%s> about %zu recipient%s (first <%s>: %s)", pepsi_id(ctx),
			 kind == DSN_FAILURE ? "failure" : kind == DSN_DELAY ? "delay"
																 : "success",
			 sender, n,
			 n == 1 ? "" : "s", rcpts[0].final_recipient, rcpts[0].status);
	{
		json_t *event = json_pack("{s:s, s:s, s:I, s:s, s:s}",
								  "kind", kind == DSN_FAILURE ? "failure" : kind == DSN_DELAY ? "delay"
																							  : "success",
								  "to", sender, "recipients", (json_int_t) n,
								  "final_recipient", rcpts[0].final_recipient, "status", rcpts[0].status);

		pepsi_mail_log(ctx, "dsn", event);
		json_decref(event);
	}
	to[0] = sender;
	/* The DSN's own clock: MAX_LIFETIME of its delivery counts from now, not from the original. */
	new_state = json_pack("{s:I}", "created_at", (json_int_t) report.now);
	pepsi_set_headers(ctx, new_headers.data, new_headers.len);
	pepsi_set_body(ctx, new_body.data, new_body.len);
	pepsi_set_rcpt_to(ctx, to, 1); /* sender is ctx's mail_from: copy it before replacing */
	pepsi_set_mail_from(ctx, "");
	pepsi_set_state(ctx, new_state);
	json_decref(new_state);

	for (size_t i = 0; i < n; i++)
		free(diagnostics[i]);
	free(diagnostics);
	free(status_text);
	free(rcpts);
	buf_free(&new_headers);
	buf_free(&new_body);
	buf_free(&unique);
	return pepsi_advance(ctx);
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
