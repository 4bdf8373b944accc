/*
 * pepsi-stage-if: branch on the envelope or the state.
 *
 * Options of its [stage-*] section:
 *   CONDITION   SUBJECT OP [VALUE], where SUBJECT is mail_from, rcpt (true
 *               if any recipient matches), rcpt_count or state.<key>[.<key>...];
 *               OP is = != ~ !~ (POSIX extended regex, case-insensitive)
 *               < > (numbers) or exists / missing; VALUE may be quoted.
 *   THEN_STAGE  where a message that matches goes
 *   ELSE_STAGE  where the others go (default: NEXT_STAGE)
 * Examples: CONDITION = mail_from = ""          (bounces)
 *           CONDITION = rcpt ~ @lists\.example\.org$
 *           CONDITION = state.origin.tls exists
 */
#include <ctype.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "runtime/stage.h"

#include "condition.h"

int pepsi_stage_if_main(int argc, char **argv);

/* The state value at a dotted path, as text (NULL when absent). */
static char *
if_state_value(json_t *state, const char *path)
{
	char   *copy = xstrdup(path);
	char   *save = NULL;
	json_t *node = state;
	char   *result = NULL;

	for (char *key = strtok_r(copy, ".", &save); key && node; key = strtok_r(NULL, ".", &save))
		node = json_object_get(node, key);
	if (node == NULL)
		result = NULL;
	else if (json_is_string(node))
		result = xstrdup(json_string_value(node));
	else
		result = json_dumps(node, JSON_COMPACT | JSON_ENCODE_ANY);
	free(copy);
	return result;
}

static bool
if_evaluate(struct pepsi_ctx *ctx, const struct if_condition *c)
{
	if (strcmp(c->subject, "mail_from") == 0)
		return if_compare(c, pepsi_mail_from(ctx));
	if (strcmp(c->subject, "rcpt_count") == 0)
	{
		char count[32];

		snprintf(count, sizeof(count), "%zu", pepsi_rcpt_count(ctx));
		return if_compare(c, count);
	}
	if (strcmp(c->subject, "rcpt") == 0)
	{
		for (size_t i = 0; i < pepsi_rcpt_count(ctx); i++)
			if (if_compare(c, pepsi_rcpt(ctx, i)))
				return true;
		return false;
	}
	{
		char *value = if_state_value(pepsi_state(ctx), c->subject + 6);
		bool  result = if_compare(c, value);

		free(value);
		return result;
	}
}

/*
 * The parsed conditions, by their text.  One worker serves every section
 * of its program, and in a fused pass runs several if stages in turn, so
 * one cached condition would be parsed (and its regex compiled) again at
 * every hop.
 */
#define IF_CACHE_SIZE 16
static struct if_condition if_cache[IF_CACHE_SIZE];
static size_t			   if_cache_next;

static const struct if_condition *
if_condition_for(const char *text, char *err, size_t errlen)
{
	struct if_condition *slot;

	for (size_t i = 0; i < IF_CACHE_SIZE; i++)
		if (if_cache[i].text && strcmp(if_cache[i].text, text) == 0)
			return &if_cache[i];
	slot = &if_cache[if_cache_next];
	if_cache_next = (if_cache_next + 1) % IF_CACHE_SIZE;
	if_condition_free(slot);
	return if_condition_parse(text, slot, err, errlen) ? slot : NULL;
}

static int
if_run(struct pepsi_ctx *ctx)
{
	const char				  *text = pepsi_option(ctx, "CONDITION");
	const char				  *else_stage = pepsi_option(ctx, "ELSE_STAGE");
	const struct if_condition *condition;
	char					   err[512];

	if (text == NULL)
		return pepsi_error(ctx, "[stage-%s] has no CONDITION", pepsi_stage_name(ctx));
	if ((condition = if_condition_for(text, err, sizeof(err))) == NULL)
		return pepsi_error(ctx, "[stage-%s] %s", pepsi_stage_name(ctx), err);
	if (if_evaluate(ctx, condition))
		return pepsi_advance_to(ctx, pepsi_option(ctx, "THEN_STAGE"));
	return else_stage ? pepsi_advance_to(ctx, else_stage) : pepsi_advance(ctx);
}

static bool
if_check_config(const struct pepsi_config *cfg, const char *section, char *err, size_t errlen)
{
	const char		   *text = config_get(cfg, section, "CONDITION");
	struct if_condition c;
	char				reason[512];

	if (text == NULL || config_get(cfg, section, "THEN_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs CONDITION and THEN_STAGE", cfg->path, section);
		return false;
	}
	if (config_get(cfg, section, "ELSE_STAGE") == NULL && config_get(cfg, section, "NEXT_STAGE") == NULL)
	{
		snprintf(err, errlen, "%s: [%s] needs ELSE_STAGE or NEXT_STAGE", cfg->path, section);
		return false;
	}
	if (!if_condition_parse(text, &c, reason, sizeof(reason)))
	{
		char origin[512];

		snprintf(err, errlen, "%s: [%s] %s",
				 config_origin(cfg, section, "CONDITION", origin, sizeof(origin)), section, reason);
		return false;
	}
	if_condition_free(&c);
	return true;
}

const struct pepsi_stage pepsi_stage_if_stage = {
	.program = "pepsi-stage-if",
	.load = PEPSI_LOAD_METADATA,
	.run = if_run,
	.check_config = if_check_config,
};

int
pepsi_stage_if_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_if_stage, argc, argv);
}
