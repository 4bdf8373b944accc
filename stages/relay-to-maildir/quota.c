/*
 * quota.c: mailbox quotas in pepsi-stage-relay-to-maildir (quota.h).
 *
 * The maildir writer has no database connection: the stage asks
 * pepsi.quota_limits for the recipient (its row, else its domain's) and
 * hands the limits on the request's "quota" line; the writer applies them
 * to the Maildir (Maildir++ maildirsize) and reports the use it counted,
 * which the stage records (pepsi.quota_record), so that pepsi-ingress
 * knows a full mailbox at RCPT.  The day's limit (max_daily) is the
 * stage's own: the database counts the day's deliveries.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/dsn.h"
#include "message/origin.h"
#include "quota.h"

bool
maildir_quota_request(struct pepsi_ctx *ctx, const char *rcpt, struct buf *request, char *why,
					  size_t whylen)
{
	const char *values[1] = {rcpt};
	char		err[512] = "";
	json_t	   *answer = pepsi_read_json(
			ctx,
			"SELECT jsonb_build_object('limits', pepsi.quota_maildir_limits($1), 'daily', "
				"pepsi.quota_daily_left($1))",
			1, values, err, sizeof(err));
	const char *limits;
	bool		ok = true;

	why[0] = '\0';
	if (answer == NULL)
	{
		log_warnx("%s: row %lld: the quota of <%s> cannot be read: %s", pepsi_queue_id(ctx), pepsi_id(ctx), rcpt,
				  err);
		return false;
	}
	limits = json_string_value(json_object_get(answer, "limits"));
	if (json_is_false(json_object_get(answer, "daily")))
	{
		snprintf(why, whylen, "mailbox of <%s> is over quota: it has had its messages for today "
							  "(pepsi.quota max_daily)",
				 rcpt);
		ok = false;
	}
	else if (limits)
		buf_printf(request, "quota %s\n", limits);
	json_decref(answer);
	return ok;
}

/* The owner's warning: "Your mailbox is N% full", from the postmaster, to the mailbox. */
static void
maildir_quota_warn(struct pepsi_ctx *ctx, const char *rcpt, int percent, long long bytes,
				   long long max_bytes, long long messages, long long max_messages)
{
	const char *hostname = config_hostname(pepsi_config(ctx));
	const char *stage = pepsi_option_text(ctx, "QUOTA_WARNING_STAGE");
	struct buf	headers = BUF_INIT;
	struct buf	body = BUF_INIT;
	char		date[64];
	char	   *token;
	json_t	   *state;
	long long	id;

	dsn_format_date(time(NULL), date, sizeof(date));
	buf_printf(&headers,
			   "From: Mail Delivery System <MAILER-DAEMON@%s>\r\nTo: <%s>\r\n"
			   "Subject: Your mailbox is %d%% full\r\nDate: %s\r\n"
			   "Message-ID: <quota.%lld.%d@%s>\r\nAuto-Submitted: auto-generated\r\n"
			   "MIME-Version: 1.0\r\nContent-Type: text/plain; charset=utf-8\r\n",
			   hostname, rcpt, percent, date, pepsi_id(ctx), percent, hostname);
	buf_printf(&body, "Your mailbox <%s> has reached %d%% of its quota:\r\n\r\n", rcpt, percent);
	if (max_bytes > 0)
		buf_printf(&body, "  %lld of %lld bytes\r\n", bytes, max_bytes);
	if (max_messages > 0)
		buf_printf(&body, "  %lld of %lld messages\r\n", messages, max_messages);
	buf_printf(&body, "\r\nWhen it is full, new mail to it is refused.  Delete or move some "
					  "messages to make room.\r\n");
	token = xasprintf("quota-%lld-%d", pepsi_id(ctx), percent);
	state = json_pack("{s:o}", "origin", origin_generated("pepsi-stage-relay-to-maildir"));
	id = pepsi_enqueue_new(ctx, stage, "", &rcpt, 1, headers.data, headers.len, body.data,
						   body.len, state, token);
	json_decref(state);
	free(token);
	buf_free(&headers);
	buf_free(&body);
	if (id >= 0)
		log_info("%s: row %lld: <%s> is %d%% full: warned (row %lld)", pepsi_queue_id(ctx), pepsi_id(ctx),
				 rcpt, percent, id);
}

void
maildir_quota_after(struct pepsi_ctx *ctx, const char *rcpt, const char *status, char *text)
{
	char	   *mark = strstr(text, " quota=");
	long long	bytes, max_bytes, messages, max_messages;
	char		v[5][32];
	const char *values[7];
	const char *thresholds;
	json_t	   *settings;
	struct buf	array = BUF_INIT;
	PGresult   *res;
	int			percent = 0;
	char		err[256];

	if (mark == NULL)
		return;
	if (sscanf(mark, " quota=%lld/%lld,%lld/%lld", &bytes, &max_bytes, &messages, &max_messages) != 4)
		return;
	*mark = '\0';
	if (status[0] != '2' && strcmp(status, "5.2.2") != 0)
		return;
	/* QUOTA_WARNING: the owner's (an OWNER option), else the configuration's: "80,95" -> {80,95}. */
	settings = settings_for_address(pepsi_db(ctx), rcpt, err, sizeof(err)); /* NULL: the configuration's */
	thresholds = settings_text_for(pepsi_config(ctx), pepsi_section(ctx), settings, "QUOTA_WARNING", rcpt);
	buf_append_str(&array, "{");
	for (const char *p = thresholds ? thresholds : ""; *p; p++)
		if ((*p >= '0' && *p <= '9') || *p == ',')
			buf_append(&array, p, 1);
		else if (*p == ' ' && array.len > 1 && array.data[array.len - 1] != ',')
			buf_append_str(&array, ",");
	while (array.len > 1 && array.data[array.len - 1] == ',')
		array.len--;
	buf_append_str(&array, "}");
	json_decref(settings);
	snprintf(v[0], sizeof(v[0]), "%lld", bytes);
	snprintf(v[1], sizeof(v[1]), "%lld", messages);
	snprintf(v[2], sizeof(v[2]), "%lld", max_bytes);
	snprintf(v[3], sizeof(v[3]), "%lld", max_messages);
	values[0] = rcpt;
	values[1] = v[0];
	values[2] = v[1];
	values[3] = v[2];
	values[4] = v[3];
	values[5] = status[0] == '2' ? "t" : "f";
	values[6] = array.data;
	res = PQexecParams(pepsi_db(ctx),
					   "SELECT pepsi.quota_record($1, $2::bigint, $3::bigint, $4::bigint, $5::bigint, "
					   "$6::boolean, $7::integer[])",
					   7, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1)
		percent = atoi(PQgetvalue(res, 0, 0));
	else
		log_warnx("%s: row %lld: <%s>: the quota's use is not recorded: %s", pepsi_queue_id(ctx),
				  pepsi_id(ctx), rcpt, PQerrorMessage(pepsi_db(ctx)));
	PQclear(res);
	buf_free(&array);
	if (percent > 0 && status[0] == '2')
		maildir_quota_warn(ctx, rcpt, percent, bytes, max_bytes, messages, max_messages);
}
