/*
 * pepsi-stage-relay-to-lmtp: hand local mail to an LMTP server (RFC 2033),
 * such as Dovecot's, over a Unix socket or TCP.
 *
 * Unlike the SMTP relays, a row's recipients go in one transaction (up to
 * MAX_RECIPIENTS; the rest are split off to a sibling first): LMTP answers
 * once per recipient after the message, and those replies are mapped back
 * with delivery_each (common/delivery/delivery.h): the delivered stay on the row,
 * which finishes; the others are split off to pause with backoff (4xx) or
 * to bounce (5xx).  The session is kept across messages
 * (common/smtp/smtp_client.h in its LMTP mode), with PIPELINING when offered.
 * In the multi-call binary it also runs fused after a body-free stage
 * (route) with its body loaded late in that pass (common/runtime/stage.h
 * late_load): a local message is then claimed, loaded and committed once,
 * not at route and again here.
 *
 * Options of its [stage-*] section (besides delivery.h's):
 *   SERVER             /path/of/socket, host, host:port or [address]:port
 *                      (port 24); unset: mail is held paused, with a log line
 *   HELO_NAME          the LHLO name (default [pepsi] HOSTNAME)
 *   MAX_RECIPIENTS (50), CONNECT_TIMEOUT (30s), TIMEOUT (5m, each reply),
 *   REUSE_MESSAGES (1000), REUSE_IDLE (60s)
 *   QUOTA_CHECK (yes): recipients pepsi.quota knows full are not sent;
 *   OVER_QUOTA_STATUS (5.2.2 or 4.2.2) for them (lmtp_quota_check); the
 *   recipients delivered count against their max_daily (lmtp_quota_count)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "delivery/delivery.h"
#include "runtime/stage.h"
#include "smtp/smtp_client.h"

int pepsi_stage_relay_to_lmtp_main(int argc, char **argv);

/* The most rows a worker takes at once (of those waiting): one load, one commit of their outcomes. */
#define LMTP_BATCH_MAX 16

/* The session of this worker, kept across messages. */
static struct smtp_client *lmtp_client;
static bool				   lmtp_close_at_exit; /* lmtp_close_client registered with atexit */

/* QUIT the session this worker kept. */
static void
lmtp_close_client(void)
{
	smtp_client_free(lmtp_client);
	lmtp_client = NULL;
}

/* The client for the current settings: the open one if they have not changed. */
static struct smtp_client *
lmtp_client_for(struct pepsi_ctx *ctx, const char *server)
{
	struct smtp_client_options o = {0};
	char					  *host = NULL;
	char					  *port = NULL;

	if (!smtp_parse_destination(server, "24", &host, &port))
		return NULL;
	o.host = host;
	o.port = port;
	o.tls = SMTP_TLS_NONE; /* a local server: a Unix socket or the loopback */
	o.helo_name = pepsi_option(ctx, "HELO_NAME");
	if (o.helo_name == NULL)
		o.helo_name = config_hostname(pepsi_config(ctx));
	o.connect_timeout_ms = (int) (pepsi_option_seconds(ctx, "CONNECT_TIMEOUT") * 1000);
	o.command_timeout_ms = (int) (pepsi_option_seconds(ctx, "TIMEOUT") * 1000);
	o.max_messages_per_connection = (int) pepsi_option_int(ctx, "REUSE_MESSAGES");
	o.max_idle_ms = (int) (pepsi_option_seconds(ctx, "REUSE_IDLE") * 1000);
	o.lmtp = true;
	lmtp_client = smtp_client_reuse(lmtp_client, &o);
	/* Fused into another stage's worker, which does not end in our main: QUIT at exit there too. */
	if (!lmtp_close_at_exit)
		lmtp_close_at_exit = atexit(lmtp_close_client) == 0;
	free(host);
	free(port);
	return lmtp_client;
}

/* Mail held while the stage cannot reach any server: paused, with why. */
static int
lmtp_hold(struct pepsi_ctx *ctx, const char *why)
{
	struct delivery_report held = {.status = "4.3.5"};
	char				  *diagnostic = xasprintf("X-Pepsi; %s", why);
	int					   rc;

	log_warnx("[stage-%s]: %s: row %lld is held paused", pepsi_stage_name(ctx), why, pepsi_id(ctx));
	held.diagnostic = diagnostic;
	rc = delivery_deferred(ctx, &held);
	free(diagnostic);
	return rc;
}

/*
 * Recipient i's outcome: its reply after the message when it has one,
 * else the refusal of its RCPT, else what ended the transaction (MAIL or
 * DATA refused, a local refusal, a lost connection: never a success).
 */
static void
lmtp_recipient_outcome(const struct smtp_result *r, size_t i, struct delivery_outcome *o,
					   char *status, size_t status_len, struct buf *diagnostic)
{
	const struct smtp_reply *reply = NULL;

	if (r->data_replies && r->data_replies[i].code > 0)
		reply = &r->data_replies[i];
	else if (r->rcpt_replies[i].code > 0 && r->rcpt_replies[i].code / 100 != 2)
		reply = &r->rcpt_replies[i];
	delivery_report_from_smtp(r, reply, &o->report, status, status_len, diagnostic);
	if (reply == NULL)
		o->class = r->outcome == SMTP_PERMANENT ? DELIVERY_BOUNCED : DELIVERY_DEFERRED;
	else if (reply->code / 100 == 2)
		o->class = DELIVERY_SENT;
	else
		o->class = reply->code / 100 == 5 ? DELIVERY_BOUNCED : DELIVERY_DEFERRED;
}

/* Recipients past MAX_RECIPIENTS go to a sibling row at this stage: their own transaction. */
static int
lmtp_limit_recipients(struct pepsi_ctx *ctx)
{
	size_t n = pepsi_rcpt_count(ctx);
	size_t max = (size_t) pepsi_option_int(ctx, "MAX_RECIPIENTS");
	int	  *rest;
	int	   rc;

	if (n <= max)
		return 0;
	rest = xcalloc(n - max, sizeof(int));
	for (size_t i = max; i < n; i++)
		rest[i - max] = (int) i + 1;
	rc = pepsi_split_off_recipients(ctx, rest, n - max, pepsi_stage_name(ctx));
	free(rest);
	return rc < 0 ? -1 : 0;
}

/* The choices of OVER_QUOTA_STATUS (schema/options.def), in order. */
enum lmtp_over_quota
{
	LMTP_OVER_QUOTA_BOUNCE,
	LMTP_OVER_QUOTA_RETRY
};

/*
 * QUOTA_CHECK: the recipients whose mailbox pepsi.quota knows full (or
 * done for the day) are not handed to the server.  Some of them: split
 * off to a sibling row at this stage, where they are all full and are
 * concluded at once.  All: the row bounces (5.2.2) or waits (4.2.2), as
 * OVER_QUOTA_STATUS says.  Returns 0 to go on with the row, 1 when it is
 * concluded (*rc), -1 on an error.
 */
static int
lmtp_quota_check(struct pepsi_ctx *ctx, int *rc)
{
	size_t		n = pepsi_rcpt_count(ctx);
	struct buf	array = BUF_INIT;
	const char *values[1];
	json_t	   *full;
	int		   *over;
	size_t		nover = 0;
	char		err[512];
	int			ret = 0;

	if (!pepsi_option_bool(ctx, "QUOTA_CHECK"))
		return 0;
	/* The recipients as a JSON array: no quoting of their own to get wrong. */
	{
		json_t *list = json_array();
		char   *dump;

		for (size_t i = 0; i < n; i++)
			json_array_append_new(list, json_string(pepsi_rcpt(ctx, i)));
		dump = json_dumps(list, JSON_COMPACT);
		buf_append_str(&array, dump ? dump : "[]");
		free(dump);
		json_decref(list);
	}
	values[0] = array.data;
	full = pepsi_read_json(ctx,
						   "SELECT jsonb_agg(pepsi.quota_is_full(r) OR NOT pepsi.quota_daily_left(r) ORDER BY o)"
						   " FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS a (r, o)",
						   1, values, err, sizeof(err));
	buf_free(&array);
	if (full == NULL)
		return pepsi_error(ctx, "cannot read the recipients' quotas: %s", err);
	over = xcalloc(n, sizeof(*over));
	for (size_t i = 0; i < n; i++)
		if (json_is_true(json_array_get(full, i)))
			over[nover++] = (int) i + 1;
	json_decref(full);
	if (nover == n)
	{
		bool				   retry = pepsi_option_enum(ctx, "OVER_QUOTA_STATUS") == LMTP_OVER_QUOTA_RETRY;
		struct delivery_report report = {.status = retry ? "4.2.2" : "5.2.2", .relay = "lmtp"};
		char				  *diagnostic = xasprintf("X-Pepsi; mailbox of <%s> is over quota (pepsi.quota)",
													  pepsi_rcpt(ctx, 0));

		report.diagnostic = diagnostic;
		*rc = retry ? delivery_deferred(ctx, &report) : delivery_bounced(ctx, &report);
		free(diagnostic);
		ret = 1;
	}
	else if (nover > 0 && pepsi_split_off_recipients(ctx, over, nover, pepsi_stage_name(ctx)) < 0)
		ret = -1;
	free(over);
	return ret;
}

/*
 * QUOTA_CHECK: the day's count of each recipient the server took
 * (pepsi.quota_delivered, for the addresses with a max_daily), as the
 * maildir stage counts its own deliveries.  A failure is logged; the
 * delivery made stays made.
 */
static void
lmtp_quota_count(struct pepsi_ctx *ctx, const char *const *rcpt, const struct delivery_outcome *outcomes,
				 size_t n)
{
	json_t	   *list = json_array();
	json_t	   *counted;
	char	   *dump;
	const char *values[1];
	char		err[512] = "";

	if (!pepsi_option_bool(ctx, "QUOTA_CHECK"))
	{
		json_decref(list);
		return;
	}
	for (size_t i = 0; i < n; i++)
		if (outcomes[i].class == DELIVERY_SENT)
			json_array_append_new(list, json_string(rcpt[i]));
	if (json_array_size(list) == 0)
	{
		json_decref(list);
		return;
	}
	dump = json_dumps(list, JSON_COMPACT);
	json_decref(list);
	values[0] = dump;
	counted = pepsi_read_json(ctx, "SELECT pepsi.quota_delivered($1::jsonb)", 1, values, err, sizeof(err));
	if (counted == NULL)
		log_warnx("%s: row %lld: the day's deliveries to <%s>... are not counted: %s", pepsi_queue_id(ctx),
				  pepsi_id(ctx), rcpt[0], err);
	json_decref(counted);
	free(dump);
}

static int
lmtp_run(struct pepsi_ctx *ctx)
{
	const char				*server = pepsi_option(ctx, "SERVER");
	struct smtp_client		*client;
	struct smtp_envelope	 env;
	struct smtp_result		 result;
	struct buf				 raw = BUF_INIT;
	size_t					 n;
	const char			   **rcpt;
	const char			   **notify;
	const char			   **orcpt;
	struct delivery_outcome *outcomes;
	struct buf				*diagnostics;
	char					*statuses;
	int						 rc = 0;

	if (server == NULL || *server == '\0')
		return lmtp_hold(ctx, "no SERVER is configured for LMTP delivery");
	if ((client = lmtp_client_for(ctx, server)) == NULL)
	{
		char *why = xasprintf("SERVER \"%s\" is not a socket path, host, host:port or [address]:port",
							  server);

		rc = lmtp_hold(ctx, why);
		free(why);
		return rc;
	}
	if (lmtp_limit_recipients(ctx) < 0)
		return -1;
	switch (lmtp_quota_check(ctx, &rc))
	{
		case -1:
			return -1;
		case 1:
			return rc;
	}
	if (!pepsi_raw_message(ctx, &raw))
		return -1;

	n = pepsi_rcpt_count(ctx);
	rcpt = xcalloc(n, sizeof(*rcpt));
	notify = xcalloc(n, sizeof(*notify));
	orcpt = xcalloc(n, sizeof(*orcpt));
	delivery_envelope(ctx, n, rcpt, notify, orcpt, &env);
	smtp_client_send(client, &env, raw.data, raw.len, &result);

	outcomes = xcalloc(n, sizeof(*outcomes));
	diagnostics = xcalloc(n, sizeof(*diagnostics));
	statuses = xcalloc(n, 16);
	for (size_t i = 0; i < n; i++)
		lmtp_recipient_outcome(&result, i, &outcomes[i], statuses + 16 * i, 16, &diagnostics[i]);
	lmtp_quota_count(ctx, rcpt, outcomes, n);
	/* The LMTP server is the final delivery: "delivered" (RFC 3464), success DSNs are ours. */
	rc = delivery_each(ctx, outcomes, "delivered", false);

	for (size_t i = 0; i < n; i++)
		buf_free(&diagnostics[i]);
	free(diagnostics);
	free(statuses);
	free(outcomes);
	free(rcpt);
	free(notify);
	free(orcpt);
	smtp_result_free(&result);
	buf_free(&raw);
	return rc;
}

/* A row with several recipients may be fanned out, which a fused pass cannot do. */
static bool
lmtp_can_fuse(struct pepsi_ctx *ctx)
{
	return pepsi_rcpt_count(ctx) <= 1;
}

/* What the schema cannot say alone: the form of SERVER. */
static bool
lmtp_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	const char *server = config_get(cfg, section, "SERVER");
	char	   *host;
	char	   *port;

	if (server == NULL || *server == '\0')
	{
		log_warnx("%s: [%s] has no SERVER: local mail will be held paused", cfg->path, section);
		return true;
	}
	if (!smtp_parse_destination(server, "24", &host, &port))
	{
		snprintf(err, errlen, "%s: [%s] SERVER \"%s\" is not a socket path, host, host:port or "
							  "[address]:port",
				 cfg->path, section, server);
		return false;
	}
	free(host);
	free(port);
	return true;
}

const struct pepsi_stage pepsi_stage_relay_to_lmtp_stage = {
	.program = "pepsi-stage-relay-to-lmtp",
	.load = PEPSI_LOAD_FULL,
	.run = lmtp_run,
	.can_fuse = lmtp_can_fuse,
	.check_config = lmtp_check_config,
	/* The rows waiting go through the session one after another, loaded and committed together. */
	.batch_max = LMTP_BATCH_MAX,
	/* After route (body-free), in the same pass: its body loaded then, not a second claim. */
	.late_load = true,
};

int
pepsi_stage_relay_to_lmtp_main(int argc, char **argv)
{
	int rc = pepsi_worker_main(&pepsi_stage_relay_to_lmtp_stage, argc, argv);

	lmtp_close_client(); /* QUIT the session the worker kept */
	return rc;
}
