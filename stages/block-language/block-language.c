/*
 * pepsi-stage-block-language: mail in a language its recipient does not
 * take (docs/pepsi-stage-block-language.8.md).
 *
 * The language is the primary of state.language, which
 * pepsi-stage-detect-language wrote before; "und" (too short,
 * undecidable) and a message it never saw are never blocked.  Each
 * recipient's BLOCK_LANGUAGES and BLOCK_ACTION are what the address's
 * owner set (pepsi.settings) or else the section's options for the
 * address.  A message whose recipients do not all get the same decision
 * is split: the recipients decided otherwise than the first go on a
 * sibling row at this stage, which decides them in its own pass.  Then:
 *
 *   refuse  rerouted to BOUNCE_STAGE with state.bounce (DIAGNOSTIC), so
 *           the sender gets a DSN; from the null sender, dropped (logged)
 *   hold    held at this stage for an operator (state.language_block);
 *           released (pepsi-queue release), it goes on unblocked
 *   tag     X-Pepsi-Language-Blocked names the language, and on it goes
 *
 * and mail nobody blocked goes on to NEXT_STAGE untouched.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/header.h"
#include "options.h"
#include "runtime/stage.h"

int pepsi_stage_block_language_main(int argc, char **argv);

/* The decisions, in BLOCK_ACTION's order after PASS. */
enum block_decision
{
	BLOCK_PASS = -1,
	BLOCK_REFUSE = 0,
	BLOCK_HOLD = 1,
	BLOCK_TAG = 2
};

static const char *const block_action_names[] = {"refuse", "hold", "tag"};

/* The most rows a worker takes at once: their recipients' settings read with one statement. */
#define BLOCK_LANGUAGE_BATCH_MAX 64

/* What the owner set for option, else the section's value for address (common/config/settings.h). */
static const char *
block_setting(struct pepsi_ctx *ctx, json_t *settings, const char *option, const char *address)
{
	return settings_text_for(pepsi_config(ctx), pepsi_section(ctx), settings, option, address);
}

/* The decision for recipient index on a message in language; -2 when the settings cannot be read. */
static int
block_decide(struct pepsi_ctx *ctx, const char *language, size_t index)
{
	const char *recipient = pepsi_rcpt(ctx, index);
	json_t	   *settings = pepsi_address_settings(ctx, recipient);
	const char *blocked;
	const char *action;
	int			decision = BLOCK_PASS;

	if (settings == NULL)
		return -2;
	blocked = block_setting(ctx, settings, "BLOCK_LANGUAGES", recipient);
	if (blocked != NULL && option_list_contains(blocked, language))
	{
		action = block_setting(ctx, settings, "BLOCK_ACTION", recipient);
		decision = BLOCK_REFUSE;
		for (int i = 0; i < 3; i++)
			if (action != NULL && strcasecmp(action, block_action_names[i]) == 0)
				decision = i;
		if (action != NULL && decision == BLOCK_REFUSE && strcasecmp(action, "refuse") != 0)
			log_warnx("%s: row %lld: <%s>: BLOCK_ACTION = \"%s\" is not refuse, hold or tag: refused",
					  pepsi_queue_id(ctx), pepsi_id(ctx), recipient, action);
	}
	json_decref(settings);
	return decision;
}

/* Recipients decided otherwise than the first go to a sibling at this stage; 0, or -1. */
static int
block_split(struct pepsi_ctx *ctx, const int *decisions)
{
	size_t count = pepsi_rcpt_count(ctx);
	int	  *others = xcalloc(count, sizeof(int));
	size_t nothers = 0;
	int	   rc = 0;

	for (size_t i = 1; i < count; i++)
		if (decisions[i] != decisions[0])
			others[nothers++] = (int) i + 1;
	if (nothers > 0)
		rc = pepsi_split_off_recipients(ctx, others, nothers, pepsi_stage_name(ctx));
	free(others);
	return rc < 0 ? -1 : 0;
}

static int
block_refuse(struct pepsi_ctx *ctx, const char *language)
{
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	json_t	   *merge;
	int			rc;

	if (pepsi_mail_from(ctx)[0] == '\0')
	{
		log_info("%s: row %lld: refused, in %s, from the null sender: dropped", pepsi_queue_id(ctx), pepsi_id(ctx),
				 language);
		return pepsi_finish(ctx);
	}
	if (bounce_stage == NULL)
		return pepsi_error(ctx, "refusing mail in %s needs a BOUNCE_STAGE in [%s]", language, pepsi_section(ctx));
	log_info("%s: row %lld: refused: in %s, which <%s> does not take", pepsi_queue_id(ctx), pepsi_id(ctx), language,
			 pepsi_rcpt(ctx, 0));
	merge = json_pack("{s:{s:s,s:s}}", "bounce", "kind", "permanent", "diagnostic",
					  pepsi_option_text(ctx, "DIAGNOSTIC"));
	rc = pepsi_reroute(ctx, bounce_stage, merge);
	json_decref(merge);
	return rc;
}

static int
block_tag(struct pepsi_ctx *ctx, const char *language)
{
	const struct buf *headers = pepsi_headers(ctx);
	struct buf		  tagged = BUF_INIT;

	if (headers == NULL)
		return -1;
	buf_printf(&tagged, "X-Pepsi-Language-Blocked: %s\r\n", language);
	header_remove(headers->data, headers->len, "X-Pepsi-Language-Blocked", &tagged);
	pepsi_set_headers(ctx, tagged.data, tagged.len);
	buf_free(&tagged);
	log_info("%s: row %lld: tagged: in %s, which <%s> does not take", pepsi_queue_id(ctx), pepsi_id(ctx), language,
			 pepsi_rcpt(ctx, 0));
	return pepsi_advance(ctx);
}

static int block_language_decide(struct pepsi_ctx *ctx, const char *language);

static int
block_language_run(struct pepsi_ctx *ctx)
{
	json_t *primary = json_object_get(json_object_get(pepsi_state(ctx), "language"), "primary");
	/* A copy: a split gives the row a new state. */
	char *language = json_is_string(primary) ? xstrdup(json_string_value(primary)) : NULL;
	int	  rc = block_language_decide(ctx, language);

	free(language);
	return rc;
}

static int
block_language_decide(struct pepsi_ctx *ctx, const char *language)
{
	size_t count = pepsi_rcpt_count(ctx);
	int	  *decisions;
	int	   rc;

	/* Held here before, and released by the operator: it goes on. */
	if (json_is_object(json_object_get(pepsi_state(ctx), "language_block")))
	{
		log_info("%s: row %lld: released, in %s: goes on", pepsi_queue_id(ctx), pepsi_id(ctx),
				 language ? language : "und");
		return pepsi_advance(ctx);
	}
	/* Not seen by pepsi-stage-detect-language, or not decided: never blocked. */
	if (language == NULL || strcmp(language, "und") == 0 || count == 0)
		return pepsi_advance(ctx);
	decisions = xcalloc(count, sizeof(int));
	for (size_t i = 0; i < count; i++)
		if ((decisions[i] = block_decide(ctx, language, i)) == -2)
		{
			free(decisions);
			return -1;
		}
	if (block_split(ctx, decisions) != 0)
	{
		free(decisions);
		return -1;
	}
	switch (decisions[0])
	{
		case BLOCK_REFUSE:
			rc = block_refuse(ctx, language);
			break;
		case BLOCK_HOLD:
			{
				json_t *merge = json_pack("{s:{s:s,s:s}}", "language_block", "language", language, "recipient",
										  pepsi_rcpt(ctx, 0));

				log_info("%s: row %lld: held: in %s, which <%s> does not take", pepsi_queue_id(ctx), pepsi_id(ctx),
						 language, pepsi_rcpt(ctx, 0));
				rc = pepsi_hold(ctx, merge);
				json_decref(merge);
				break;
			}
		case BLOCK_TAG:
			rc = block_tag(ctx, language);
			break;
		default:
			rc = pepsi_advance(ctx);
	}
	free(decisions);
	return rc;
}

const struct pepsi_stage pepsi_stage_block_language_stage = {
	.program = "pepsi-stage-block-language",
	.load = PEPSI_LOAD_HEADERS,
	.run = block_language_run,
	.batch_max = BLOCK_LANGUAGE_BATCH_MAX,
	.prepare = pepsi_prefetch_address_settings,
};

int
pepsi_stage_block_language_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_block_language_stage, argc, argv);
}
