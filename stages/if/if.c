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

#include "log.h"
#include "xalloc.h"
#include "stage.h"

int			pepsi_stage_if_main(int argc, char **argv);

enum if_op
{
	IF_EQ, IF_NE, IF_MATCH, IF_NOMATCH, IF_LT, IF_GT, IF_EXISTS, IF_MISSING
};

struct if_condition
{
	char	   *text;			/* as configured, to reuse a parse */
	char	   *subject;
	enum if_op	op;
	char	   *value;
	regex_t		regex;
	bool		has_regex;
};

static void
if_condition_free(struct if_condition *c)
{
	free(c->text);
	free(c->subject);
	free(c->value);
	if (c->has_regex)
		regfree(&c->regex);
	memset(c, 0, sizeof(*c));
}

/* Parse text into c; false with a reason in err. */
static bool
if_condition_parse(const char *text, struct if_condition *c, char *err, size_t errlen)
{
	static const struct
	{
		const char *token;
		enum if_op	op;
	}			ops[] = {
		{"!=", IF_NE}, {"!~", IF_NOMATCH}, {"=", IF_EQ}, {"~", IF_MATCH}, {"<", IF_LT},
		{">", IF_GT}, {"exists", IF_EXISTS}, {"missing", IF_MISSING}
	};
	const char *p = text;
	size_t		n;
	bool		found = false;

	memset(c, 0, sizeof(*c));
	while (isspace((unsigned char) *p))
		p++;
	n = strcspn(p, " \t!=~<>");
	if (n == 0)
	{
		snprintf(err, errlen, "CONDITION \"%s\" has no subject", text);
		return false;
	}
	c->subject = xstrndup(p, n);
	if (strcmp(c->subject, "mail_from") != 0 && strcmp(c->subject, "rcpt") != 0
		&& strcmp(c->subject, "rcpt_count") != 0 && strncmp(c->subject, "state.", 6) != 0)
	{
		snprintf(err, errlen, "CONDITION subject \"%s\" is not mail_from, rcpt, rcpt_count or state.<key>",
				 c->subject);
		if_condition_free(c);
		return false;
	}
	p += n;
	while (isspace((unsigned char) *p))
		p++;
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]) && !found; i++)
		if (strncmp(p, ops[i].token, strlen(ops[i].token)) == 0)
		{
			c->op = ops[i].op;
			p += strlen(ops[i].token);
			found = true;
		}
	if (!found)
	{
		snprintf(err, errlen, "CONDITION \"%s\" has no operator (= != ~ !~ < > exists missing)", text);
		if_condition_free(c);
		return false;
	}
	while (isspace((unsigned char) *p))
		p++;
	n = strlen(p);
	while (n > 0 && isspace((unsigned char) p[n - 1]))
		n--;
	if (n >= 2 && p[0] == '"' && p[n - 1] == '"')
	{
		p++;
		n -= 2;
	}
	c->value = xstrndup(p, n);
	if ((c->op == IF_EXISTS || c->op == IF_MISSING) && n > 0)
	{
		snprintf(err, errlen, "CONDITION \"%s\": exists and missing take no value", text);
		if_condition_free(c);
		return false;
	}
	if (c->op == IF_MATCH || c->op == IF_NOMATCH)
	{
		int			rc = regcomp(&c->regex, c->value, REG_EXTENDED | REG_ICASE | REG_NOSUB);

		if (rc != 0)
		{
			char		message[256];

			regerror(rc, &c->regex, message, sizeof(message));
			snprintf(err, errlen, "CONDITION regex \"%s\": %s", c->value, message);
			if_condition_free(c);
			return false;
		}
		c->has_regex = true;
	}
	c->text = xstrdup(text);
	return true;
}

/* The state value at a dotted path, as text (NULL when absent). */
static char *
if_state_value(json_t *state, const char *path)
{
	char	   *copy = xstrdup(path);
	char	   *save = NULL;
	json_t	   *node = state;
	char	   *result = NULL;

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
if_compare(const struct if_condition *c, const char *value)
{
	switch (c->op)
	{
		case IF_EXISTS:
			return value != NULL;
		case IF_MISSING:
			return value == NULL;
		case IF_EQ:
			return value && strcmp(value, c->value) == 0;
		case IF_NE:
			return !value || strcmp(value, c->value) != 0;
		case IF_MATCH:
			return value && regexec(&c->regex, value, 0, NULL, 0) == 0;
		case IF_NOMATCH:
			return !value || regexec(&c->regex, value, 0, NULL, 0) != 0;
		case IF_LT:
			return value && strtod(value, NULL) < strtod(c->value, NULL);
		case IF_GT:
			return value && strtod(value, NULL) > strtod(c->value, NULL);
	}
	return false;
}

static bool
if_evaluate(struct pepsi_ctx *ctx, const struct if_condition *c)
{
	if (strcmp(c->subject, "mail_from") == 0)
		return if_compare(c, pepsi_mail_from(ctx));
	if (strcmp(c->subject, "rcpt_count") == 0)
	{
		char		count[32];

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
		char	   *value = if_state_value(pepsi_state(ctx), c->subject + 6);
		bool		result = if_compare(c, value);

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
static size_t if_cache_next;

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
	const char *text = pepsi_option(ctx, "CONDITION");
	const char *else_stage = pepsi_option(ctx, "ELSE_STAGE");
	const struct if_condition *condition;
	char		err[512];

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
	const char *text = config_get(cfg, section, "CONDITION");
	struct if_condition c;
	char		reason[512];

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
		char		origin[512];

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
