/*
 * pepsi-stage-vacation: the "I am away" reply, as RFC 3834 wants it
 * (docs/pepsi-stage-vacation.8.md).
 *
 * For each recipient whose vacation is on, the message's sender gets one
 * reply, at most once per VACATION_INTERVAL (remembered in the database,
 * pepsi.autoreply_sent), never when the message is from the null sender,
 * a list or system address or the recipient itself, is automatic
 * (Auto-Submitted), bulk (Precedence) or a list's (List-*): the rules are
 * common/message/autoreply.c's.  The reply is a new message from the null sender
 * (RFC 3834 3.3), injected at REPLY_STAGE, where it is signed and
 * delivered like any other.  The message itself always goes on to
 * NEXT_STAGE.
 *
 * What a recipient set for their own address (pepsi.settings, through
 * pepsi.vacation_set) wins over the options of the stage's section, which
 * an administrator may set per address too: VACATION, VACATION_MESSAGE,
 * VACATION_SUBJECT (default "Auto: " and the original subject) and
 * VACATION_INTERVAL (default 7 days).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/autoreply.h"
#include "message/origin.h"
#include "options.h"
#include "runtime/stage.h"

int pepsi_stage_vacation_main(int argc, char **argv);

/*
 * The most rows a worker takes at once: their headers loaded with one
 * statement, and the rows going on to a delivery fused after it (in the
 * multi-call binary) delivered as one batch.
 */
#define VACATION_BATCH_MAX 64

/* The owner's setting of option, else the section's option for address (common/config/settings.h). */
static const char *
vacation_text(struct pepsi_ctx *ctx, json_t *settings, const char *option, const char *address)
{
	return settings_text_for(pepsi_config(ctx), pepsi_section(ctx), settings, option, address);
}

static bool
vacation_on(struct pepsi_ctx *ctx, json_t *settings, const char *address)
{
	const char *own = settings_owner_value(settings, "VACATION");
	bool		on;

	if (own != NULL)
	{
		if (option_parse_bool(own, &on))
			return on;
		log_warnx("%s: row %lld: <%s>: the setting VACATION = \"%s\" is not yes or no: ignored",
				  pepsi_queue_id(ctx), pepsi_id(ctx), address, own);
	}
	return config_bool_for(pepsi_config(ctx), pepsi_section(ctx), "VACATION", NULL, address);
}

static double
vacation_interval(struct pepsi_ctx *ctx, json_t *settings, const char *address)
{
	const char *own = settings_owner_value(settings, "VACATION_INTERVAL");
	long long	ms;

	if (own != NULL)
	{
		if (option_parse_duration_ms(own, &ms) && ms >= 1000)
			return ms / 1000.0;
		log_warnx("%s: row %lld: <%s>: the setting VACATION_INTERVAL = \"%s\" is not a duration of a second or more: ignored",
				  pepsi_queue_id(ctx), pepsi_id(ctx), address, own);
	}
	return config_duration_ms_for(pepsi_config(ctx), pepsi_section(ctx), "VACATION_INTERVAL", NULL,
								  address)
		   / 1000.0;
}

/* Reply for recipient index; 0, or -1 when the message must fail. */
static int
vacation_reply(struct pepsi_ctx *ctx, const struct buf *headers, size_t index)
{
	const char *recipient = pepsi_rcpt(ctx, index);
	const char *sender = pepsi_mail_from(ctx);
	const char *reply_stage = pepsi_option_text(ctx, "REPLY_STAGE");
	json_t	   *settings = pepsi_address_settings(ctx, recipient);
	struct buf	reply_headers = BUF_INIT;
	struct buf	reply_body = BUF_INIT;
	char		why[256];
	char		unique[64];
	char	   *token;
	json_t	   *reply_state;
	long long	id;
	int			rc = 0;

	if (settings == NULL)
		return -1;
	if (!vacation_on(ctx, settings, recipient))
		goto done;
	if (autoreply_refused(headers->data, headers->len, sender, recipient, why, sizeof(why)))
	{
		log_info("%s: row %lld: <%s>: no vacation reply: %s", pepsi_queue_id(ctx), pepsi_id(ctx), recipient, why);
		goto done;
	}
	{
		struct autoreply reply = {
			.responder = recipient,
			.recipient = sender,
			.subject = vacation_text(ctx, settings, "VACATION_SUBJECT", recipient),
			.text = vacation_text(ctx, settings, "VACATION_MESSAGE", recipient),
			.hostname = config_hostname(pepsi_config(ctx)),
			.unique = unique,
		};

		if (reply.text == NULL)
		{
			log_warnx("%s: row %lld: <%s>: VACATION is on but there is no VACATION_MESSAGE: no reply",
					  pepsi_queue_id(ctx), pepsi_id(ctx), recipient);
			goto done;
		}
		snprintf(unique, sizeof(unique), "%lld.%zu", pepsi_id(ctx), index + 1);
		autoreply_build(&reply, headers->data, headers->len, &reply_headers, &reply_body);
	}
	token = xasprintf("vacation-%s", unique);
	/* Pepsi's own message, to be signed like the recipient's own mail (common/message/origin.h). */
	reply_state = json_pack("{s:o}", "origin", origin_generated("pepsi-stage-vacation"));
	id = pepsi_enqueue_autoreply(ctx, recipient, vacation_interval(ctx, settings, recipient),
								 reply_stage ? reply_stage : "init", "", sender,
								 reply_headers.data, reply_headers.len, reply_body.data,
								 reply_body.len, reply_state, token);
	json_decref(reply_state);
	free(token);
	if (id < 0)
		rc = -1;
	else if (id > 0)
		log_info("%s: row %lld: <%s>: vacation reply to <%s> (row %lld)", pepsi_queue_id(ctx), pepsi_id(ctx), recipient,
				 sender, id);
	else
		log_info("%s: row %lld: <%s>: <%s> already had a vacation reply within VACATION_INTERVAL",
				 pepsi_queue_id(ctx), pepsi_id(ctx), recipient, sender);
done:
	json_decref(settings);
	buf_free(&reply_headers);
	buf_free(&reply_body);
	return rc;
}

static int
vacation_run(struct pepsi_ctx *ctx)
{
	const struct buf *headers = pepsi_headers(ctx);

	if (headers == NULL)
		return -1;
	for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
		if (vacation_reply(ctx, headers, i) != 0)
			return -1;
	return pepsi_advance(ctx);
}

const struct pepsi_stage pepsi_stage_vacation_stage = {
	.program = "pepsi-stage-vacation",
	.load = PEPSI_LOAD_HEADERS,
	.run = vacation_run,
	.batch_max = VACATION_BATCH_MAX,
	/* The batch's recipients' own settings, with one statement instead of one each. */
	.prepare = pepsi_prefetch_address_settings,
	/*
	 * After a stage that loads less (route, then dot-forward passing the
	 * row on), the headers are loaded in the same pass: a local message
	 * is claimed, loaded and committed once from route to its mailbox.
	 */
	.late_load = true,
};

int
pepsi_stage_vacation_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_vacation_stage, argc, argv);
}
