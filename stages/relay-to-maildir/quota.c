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

json_t *
maildir_quota_lookup(struct pepsi_ctx *ctx, const char *const *rcpts, size_t n)
{
	json_t	   *list = json_array();
	char	   *dump;
	const char *values[1];
	char		err[512] = "";
	json_t	   *answers;

	for (size_t i = 0; i < n; i++)
		json_array_append_new(list, json_string(rcpts[i]));
	dump = json_dumps(list, JSON_COMPACT);
	json_decref(list);
	values[0] = dump;
	answers = pepsi_read_json(ctx,
							  "SELECT jsonb_agg(jsonb_build_object('limits', pepsi.quota_maildir_limits(r), "
							  "'daily', pepsi.quota_daily_left(r)) ORDER BY o)"
							  " FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS a (r, o)",
							  1, values, err, sizeof(err));
	free(dump);
	if (answers != NULL && json_array_size(answers) != n)
	{
		snprintf(err, sizeof(err), "not an answer a recipient");
		json_decref(answers);
		answers = NULL;
	}
	if (answers == NULL)
		log_warnx("%s: row %lld: the quota of <%s>%s cannot be read: %s", pepsi_queue_id(ctx), pepsi_id(ctx),
				  n ? rcpts[0] : "", n > 1 ? " and the batch's others" : "", err);
	return answers;
}

bool
maildir_quota_apply(const json_t *answer, const char *rcpt, struct buf *request, char *why, size_t whylen)
{
	const char *limits = json_string_value(json_object_get(answer, "limits"));

	why[0] = '\0';
	if (json_is_false(json_object_get(answer, "daily")))
	{
		snprintf(why, whylen, "mailbox of <%s> is over quota: it has had its messages for today "
							  "(pepsi.quota max_daily)",
				 rcpt);
		return false;
	}
	if (limits)
		buf_printf(request, "quota %s\n", limits);
	return true;
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

bool
maildir_quota_parse(const char *status, char *text, struct maildir_quota_use *use)
{
	char *mark = strstr(text, " quota=");

	memset(use, 0, sizeof(*use));
	if (mark == NULL)
		return false;
	if (sscanf(mark, " quota=%lld/%lld,%lld/%lld", &use->bytes, &use->max_bytes, &use->messages,
			   &use->max_messages)
		!= 4)
		return false;
	*mark = '\0';
	use->delivered = status[0] == '2';
	return use->delivered || strcmp(status, "5.2.2") == 0;
}

/* QUOTA_WARNING: the owner's (an OWNER option, in settings), else the configuration's, as an array. */
static json_t *
maildir_quota_thresholds(struct pepsi_ctx *ctx, const json_t *settings, const char *rcpt)
{
	const char *thresholds = settings_text_for(pepsi_config(ctx), pepsi_section(ctx), settings, "QUOTA_WARNING", rcpt);
	json_t	   *array = json_array();

	for (const char *p = thresholds ? thresholds : ""; *p;)
	{
		char *end;
		long  t = strtol(p, &end, 10);

		if (end == p)
		{
			p++;
			continue;
		}
		if (t > 0 && t <= 1000)
			json_array_append_new(array, json_integer(t));
		p = end;
	}
	return array;
}

static json_t *
maildir_quota_delivery(struct pepsi_ctx *ctx, const char *rcpt, const struct maildir_quota_use *use,
					   const json_t *settings)
{
	return json_pack("{s:s,s:I,s:I,s:I,s:I,s:b,s:o}", "address", rcpt, "bytes", (json_int_t) use->bytes,
					 "messages", (json_int_t) use->messages, "max_bytes", (json_int_t) use->max_bytes,
					 "max_messages", (json_int_t) use->max_messages, "delivered", use->delivered,
					 "thresholds", maildir_quota_thresholds(ctx, settings, rcpt));
}

void
maildir_quota_record(struct maildir_quota_item *items, size_t n)
{
	const char **rcpts;
	json_t		*deliveries = json_array();
	json_t		*settings;
	json_t		*answers;
	char		*dump;
	const char	*values[1];
	char		 err[512] = "";

	if (n == 0)
		return;
	rcpts = xcalloc(n, sizeof(*rcpts));
	for (size_t i = 0; i < n; i++)
		rcpts[i] = items[i].rcpt;
	/* The owners' QUOTA_WARNING with one statement; NULL: the configuration's. */
	settings = settings_for_addresses(pepsi_db(items[0].ctx), rcpts, n, err, sizeof(err));
	free(rcpts);
	for (size_t i = 0; i < n; i++)
		json_array_append_new(deliveries, maildir_quota_delivery(items[i].ctx, items[i].rcpt, &items[i].use,
																 json_object_get(settings, items[i].rcpt)));
	json_decref(settings);
	dump = json_dumps(deliveries, JSON_COMPACT);
	json_decref(deliveries);
	values[0] = dump;
	answers = pepsi_read_json(items[0].ctx, "SELECT pepsi.quota_record_many($1::jsonb)", 1, values, err, sizeof(err));
	free(dump);
	if (answers == NULL || json_array_size(answers) != n)
		log_warnx("%s: row %lld: the quota's use of <%s>%s is not recorded: %s", pepsi_queue_id(items[0].ctx),
				  pepsi_id(items[0].ctx), items[0].rcpt, n > 1 ? " and the batch's others" : "",
				  answers == NULL ? err : "not an answer a delivery");
	else
		for (size_t i = 0; i < n; i++)
		{
			items[i].percent = (int) json_integer_value(json_array_get(answers, i));
			items[i].recorded = true;
		}
	json_decref(answers);
}

void
maildir_quota_warn_after(struct pepsi_ctx *ctx, const struct maildir_quota_item *item)
{
	if (item->recorded && item->percent > 0 && item->use.delivered)
		maildir_quota_warn(ctx, item->rcpt, item->percent, item->use.bytes, item->use.max_bytes,
						   item->use.messages, item->use.max_messages);
}

void
maildir_quota_after(struct pepsi_ctx *ctx, const char *rcpt, const char *status, char *text)
{
	struct maildir_quota_item item = {.ctx = ctx, .rcpt = rcpt};

	if (!maildir_quota_parse(status, text, &item.use))
		return;
	maildir_quota_record(&item, 1);
	maildir_quota_warn_after(ctx, &item);
}
