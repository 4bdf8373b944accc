/*
 * pepsi-stage-settings: an address's owner changes their own settings by
 * mail (docs/pepsi-stage-settings.8.md; spec 22.3, pepsi.settings: "account
 * owners write it themselves by e-mail").
 *
 * Mail to LOCAL_PART@ a domain (settings@example.org) is a command
 * message: its text lines are commands (set OPTION VALUE, unset OPTION,
 * show, confirm TOKEN; quoted lines and a signature are skipped).  It is
 * taken only from the address in its From, and only when that is proven:
 * ingress found DMARC pass for the From domain (an aligned DKIM signature
 * or SPF), or the message came in an authenticated submission session
 * whose envelope sender is that address.  Anything else is dropped with a
 * log line and no reply (no backscatter to a forged From).  Commands are
 * checked with the programs' own code (schema/options.def OWNER, the
 * value's type, MAX_VALUE_SIZE); a message with any problem is answered
 * with every reason and nothing is recorded.  Changes are not applied at
 * once: they are recorded (pepsi.settings_request_create) and the owner
 * gets a single-use token, valid for TOKEN_LIFETIME; a reply carrying it
 * (confirm TOKEN in the text, or in the Subject of a reply, whose text
 * is then not read) applies them
 * (pepsi.settings_request_confirm) and is answered with the settings in
 * force, as show is.  The answers are RFC 3834 auto-replies from the
 * settings address, from the null sender, injected at REPLY_STAGE.
 * Other recipients of the message go on to NEXT_STAGE; mail with no
 * settings recipient passes through.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth/results.h"
#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "config/settings.h"
#include "message/autoreply.h"
#include "message/header.h"
#include "message/origin.h"
#include "options.h"
#include "runtime/stage.h"

int pepsi_stage_settings_main(int argc, char **argv);

/* A token as pepsi.settings_request_create makes it: 64 hexadecimal digits. */
#define SETTINGS_TOKEN_LEN 64

struct settings_command
{
	struct buf problems; /* one line per reason, nothing recorded if any */
	json_t	  *changes;	 /* option -> value, or null to unset */
	char	  *token;	 /* confirm TOKEN */
	bool	   show;
	size_t	   commands;
};

/* Is address's local part LOCAL_PART (case-insensitive)? */
static bool
settings_is_command_address(const char *address, const char *local_part)
{
	const char *at = strrchr(address, '@');

	return at != NULL && (size_t) (at - address) == strlen(local_part)
		   && strncasecmp(address, local_part, strlen(local_part)) == 0;
}

/*
 * How the owner proved to be the From address, or NULL: DMARC pass for
 * its domain (state.auth.dmarc), or an authenticated submission session
 * (state.origin.auth) with the owner as envelope sender.
 */
static const char *
settings_proof(struct pepsi_ctx *ctx, const char *owner)
{
	json_t	   *state = pepsi_state(ctx);
	json_t	   *dmarc = json_object_get(json_object_get(state, "auth"), "dmarc");
	const char *result = json_string_value(json_object_get(dmarc, "result"));
	const char *from_domain = json_string_value(json_object_get(dmarc, "header.from"));
	const char *account = json_string_value(json_object_get(json_object_get(state, "origin"), "auth"));
	const char *domain = strrchr(owner, '@') + 1;

	if (result && strcmp(result, "pass") == 0 && from_domain && strcasecmp(from_domain, domain) == 0)
		return "DMARC pass";
	if (account && *account && strcasecmp(pepsi_mail_from(ctx), owner) == 0)
		return "authenticated submission";
	return NULL;
}

static void
settings_problem(struct settings_command *c, size_t line, const char *fmt, const char *a, const char *b)
{
	buf_printf(&c->problems, "line %zu: ", line);
	buf_printf(&c->problems, fmt, a, b);
	buf_append_char(&c->problems, '\n');
}

/* One "set OPTION VALUE" or "unset OPTION" (value NULL). */
static void
settings_change(struct pepsi_ctx *ctx, struct settings_command *c, size_t line, char *option, const char *value)
{
	long long max = pepsi_option_size(ctx, "MAX_VALUE_SIZE");
	char	  problem[512];

	for (char *p = option; *p; p++)
		*p = (char) toupper((unsigned char) *p);
	if (value != NULL && (long long) strlen(value) > max)
	{
		char sizes[64];

		snprintf(sizes, sizeof(sizes), "%zu bytes, more than %lld", strlen(value), max);
		settings_problem(c, line, "the value of %s is %s (MAX_VALUE_SIZE)", option, sizes);
		return;
	}
	if (!option_owner_value_check(option, value, problem, sizeof(problem)))
	{
		settings_problem(c, line, "%s%s", problem, "");
		return;
	}
	json_object_set_new(c->changes, option, value ? json_string(value) : json_null());
}

/* Is word a token (64 hexadecimal digits)? */
static bool
settings_is_token(const char *word)
{
	size_t n = strspn(word, "0123456789abcdefABCDEF");

	return n == SETTINGS_TOKEN_LEN && (word[n] == '\0' || isspace((unsigned char) word[n]) || word[n] == ']');
}

/* A "confirm TOKEN" in the Subject (a reply to the confirmation keeps it). */
static void
settings_subject_token(const struct buf *headers, struct settings_command *c)
{
	char *subject = header_get(headers->data, headers->len, "Subject");
	char *p = subject ? strcasestr(subject, "confirm ") : NULL;

	if (p != NULL && settings_is_token(p + 8))
		c->token = xstrndup(p + 8, SETTINGS_TOKEN_LEN);
	free(subject);
}

/* Parse the text of body into c: a problem per bad line. */
static void
settings_parse(struct pepsi_ctx *ctx, const struct buf *body, struct settings_command *c)
{
	long long  max_commands = pepsi_option_int(ctx, "MAX_COMMANDS");
	char	  *text = xstrndup(body->data, body->len);
	char	  *save = NULL;
	size_t	   line = 0;
	struct buf multi = BUF_INIT;
	char	  *multi_option = NULL;
	size_t	   multi_line = 0;

	for (char *l = strtok_r(text, "\n", &save); l != NULL; l = strtok_r(NULL, "\n", &save))
	{
		size_t len = strlen(l);
		char  *word;
		char  *rest;

		line++;
		if (len > 0 && l[len - 1] == '\r')
			l[--len] = '\0';
		if (multi_option != NULL)
		{
			/* set OPTION << ... ".": the lines between are the value. */
			if (strcmp(l, ".") == 0)
			{
				settings_change(ctx, c, multi_line, multi_option, multi.data ? multi.data : "");
				free(multi_option);
				multi_option = NULL;
				buf_reset(&multi);
			}
			else
			{
				if (multi.len > 0)
					buf_append_char(&multi, '\n');
				buf_append_str(&multi, l[0] == '.' ? l + 1 : l);
			}
			continue;
		}
		if (strcmp(l, "-- ") == 0 || strcmp(l, "--") == 0)
			break; /* a signature */
		while (*l == ' ' || *l == '\t')
			l++;
		if (*l == '\0' || *l == '>' || *l == '#')
			continue;
		if ((long long) ++c->commands > max_commands)
		{
			char most[32];

			snprintf(most, sizeof(most), "%lld", max_commands);
			settings_problem(c, line, "more than %s commands (MAX_COMMANDS)%s", most, "");
			break;
		}
		word = l;
		rest = l + strcspn(l, " \t");
		if (*rest)
		{
			*rest++ = '\0';
			rest += strspn(rest, " \t");
		}
		if (strcasecmp(word, "show") == 0 && *rest == '\0')
			c->show = true;
		else if (strcasecmp(word, "confirm") == 0 && settings_is_token(rest))
		{
			free(c->token);
			c->token = xstrndup(rest, SETTINGS_TOKEN_LEN);
		}
		else if (strcasecmp(word, "confirm") == 0)
			settings_problem(c, line, "\"%s\" is not a token (%s)", rest, "64 hexadecimal digits");
		else if (strcasecmp(word, "unset") == 0 && *rest && rest[strcspn(rest, " \t")] == '\0')
			settings_change(ctx, c, line, rest, NULL);
		else if (strcasecmp(word, "set") == 0 && *rest)
		{
			char *value = rest + strcspn(rest, " \t");

			if (*value)
			{
				*value++ = '\0';
				value += strspn(value, " \t");
			}
			if (strcmp(value, "<<") == 0)
			{
				multi_option = xstrdup(rest);
				multi_line = line;
			}
			else
				settings_change(ctx, c, line, rest, value);
		}
		else
			settings_problem(c, line, "unknown command \"%s\" (the commands are set, unset, show and confirm)%s",
							 word, "");
	}
	if (multi_option != NULL)
		settings_problem(c, multi_line, "the value of %s has no line \".\" after it%s", multi_option, "");
	free(multi_option);
	buf_free(&multi);
	free(text);
}

/* The settings in force for owner, as lines of text; false (and the message fails) on an error. */
static bool
settings_in_force(struct pepsi_ctx *ctx, const char *owner, struct buf *out)
{
	const char *values[1] = {owner};
	json_t	   *rows = pepsi_call_json(ctx,
									   "SELECT coalesce(jsonb_object_agg(option, jsonb_build_array(value, source)),"
										   " '{}') FROM pepsi.settings_resolved($1)",
									   1, values);
	const char *name;

	if (rows == NULL)
		return false;
	buf_printf(out, "The settings of %s in force:\n\n", owner);
	for (size_t i = 0; (name = option_owner_name(i)) != NULL; i++)
	{
		json_t *row = json_object_get(rows, name);

		if (row == NULL)
			buf_printf(out, "  %s: not set (the server's value)\n", name);
		else
			buf_printf(out, "  %s = %s%s\n", name, json_string_value(json_array_get(row, 0)),
					   strcmp(json_string_value(json_array_get(row, 1)), "domain") == 0 ? " (your domain's)" : "");
	}
	json_decref(rows);
	return true;
}

/* Inject the answer to owner; false (and the message fails) on an error. */
static bool
settings_reply(struct pepsi_ctx *ctx, const char *responder, const char *owner, const char *subject,
			   const char *text)
{
	const struct buf *headers = pepsi_headers(ctx);
	const char		 *reply_stage = pepsi_option_text(ctx, "REPLY_STAGE");
	struct buf		  reply_headers = BUF_INIT;
	struct buf		  reply_body = BUF_INIT;
	char			  unique[64];
	char			 *token;
	json_t			 *state;
	long long		  id;
	struct autoreply  reply = {
		 .responder = responder,
		 .recipient = owner,
		 .subject = subject,
		 .text = text,
		 .hostname = config_hostname(pepsi_config(ctx)),
		 .unique = unique,
	 };

	snprintf(unique, sizeof(unique), "%lld.settings", pepsi_id(ctx));
	autoreply_build(&reply, headers->data, headers->len, &reply_headers, &reply_body);
	token = xasprintf("settings-%lld", pepsi_id(ctx));
	state = json_pack("{s:o}", "origin", origin_generated("pepsi-stage-settings"));
	id = pepsi_enqueue_new(ctx, reply_stage ? reply_stage : "init", "", &owner, 1, reply_headers.data,
						   reply_headers.len, reply_body.data, reply_body.len, state, token);
	json_decref(state);
	free(token);
	buf_free(&reply_headers);
	buf_free(&reply_body);
	if (id >= 0)
		log_info("%s: row %lld: <%s>: answered <%s>: %s (row %lld)", pepsi_queue_id(ctx), pepsi_id(ctx), responder,
				 owner, subject, id);
	return id >= 0;
}

/* Carry out the commands of the message to responder; false when the message must fail. */
static bool
settings_handle(struct pepsi_ctx *ctx, const char *responder)
{
	const struct buf	   *headers = pepsi_headers(ctx);
	const struct buf	   *body = pepsi_body(ctx);
	struct settings_command c = {.problems = BUF_INIT, .changes = json_object()};
	struct buf				text = BUF_INIT;
	char				   *owner = NULL;
	const char			   *proof;
	const char			   *subject = NULL;
	char					why[256];
	bool					ok = true;

	if (headers == NULL || body == NULL)
		ok = false;
	else if ((owner = header_from_address(headers->data, headers->len)) == NULL)
		log_info("%s: row %lld: <%s>: a command without one From address: dropped", pepsi_queue_id(ctx),
				 pepsi_id(ctx), responder);
	else if ((proof = settings_proof(ctx, owner)) == NULL)
		log_warnx("%s: row %lld: <%s>: a command from <%s> without DMARC pass or an authenticated submission: "
				  "dropped, not answered",
				  pepsi_queue_id(ctx), pepsi_id(ctx), responder, owner);
	else if (strcasecmp(strrchr(owner, '@'), strrchr(responder, '@')) != 0)
		log_warnx("%s: row %lld: <%s>: a command from <%s>, of another domain: dropped", pepsi_queue_id(ctx),
				  pepsi_id(ctx), responder, owner);
	else if (autoreply_refused(headers->data, headers->len, pepsi_mail_from(ctx), responder, why, sizeof(why)))
		log_info("%s: row %lld: <%s>: a command from <%s> not answered: %s", pepsi_queue_id(ctx), pepsi_id(ctx),
				 responder, owner, why);
	else
	{
		log_info("%s: row %lld: <%s>: a command from <%s> (%s)", pepsi_queue_id(ctx), pepsi_id(ctx), responder,
				 owner, proof);
		/* A reply to the confirmation is one, whatever its text says (a greeting, the quote). */
		settings_subject_token(headers, &c);
		if (c.token == NULL)
			settings_parse(ctx, body, &c);
		if (c.problems.len > 0)
		{
			subject = "Settings: not changed";
			buf_printf(&text, "Nothing was changed, because of:\n\n%s\n", c.problems.data);
		}
		else if (c.token != NULL)
		{
			const char *values[2] = {owner, c.token};
			json_t	   *answer = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.settings_request_confirm($1, $2))",
												 2, values);

			if (answer == NULL)
				ok = false;
			else if (json_is_string(answer))
			{
				subject = "Settings: not changed";
				buf_printf(&text, "Nothing was changed: %s.\n", json_string_value(answer));
				log_info("%s: row %lld: <%s>: confirmation refused: %s", pepsi_queue_id(ctx), pepsi_id(ctx), owner,
						 json_string_value(answer));
			}
			else
			{
				subject = "Settings: changed";
				buf_append_str(&text, "Your changes are applied.\n\n");
				ok = settings_in_force(ctx, owner, &text);
				log_info("%s: row %lld: <%s>: confirmed changes applied", pepsi_queue_id(ctx), pepsi_id(ctx), owner);
			}
			json_decref(answer);
		}
		else if (json_object_size(c.changes) > 0)
		{
			char		ttl[48];
			char	   *changes = json_dumps(c.changes, JSON_COMPACT | JSON_SORT_KEYS);
			const char *values[3] = {owner, changes, ttl};
			json_t	   *answer;
			const char *option;
			json_t	   *value;

			snprintf(ttl, sizeof(ttl), "%.0f seconds", pepsi_option_seconds(ctx, "TOKEN_LIFETIME"));
			answer = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.settings_request_create($1, $2::jsonb, $3::interval))",
									 3, values);
			free(changes);
			if (answer == NULL || !json_is_string(answer))
				ok = false;
			else
			{
				char *token_subject = xasprintf("Settings: confirm %s", json_string_value(answer));

				buf_append_str(&text, "You asked for these changes:\n\n");
				json_object_foreach (c.changes, option, value)
				{
					if (json_is_null(value))
						buf_printf(&text, "  unset %s\n", option);
					else
						buf_printf(&text, "  set %s %s\n", option, json_string_value(value));
				}
				buf_printf(&text, "\nThey apply when you reply to this message, or send this line to %s:\n\n"
								  "confirm %s\n\nThe token works once, for %.0f minutes.\n",
						   responder, json_string_value(answer), pepsi_option_seconds(ctx, "TOKEN_LIFETIME") / 60);
				ok = settings_reply(ctx, responder, owner, token_subject, text.data);
				free(token_subject);
				buf_reset(&text);
				log_info("%s: row %lld: <%s>: %zu change(s) await confirmation", pepsi_queue_id(ctx), pepsi_id(ctx),
						 owner, json_object_size(c.changes));
			}
			json_decref(answer);
		}
		else if (c.show)
		{
			subject = "Settings";
			ok = settings_in_force(ctx, owner, &text);
		}
		else
		{
			subject = "Settings: no command";
			buf_printf(&text, "The message had no command.  One a line:\n\n"
							  "  set OPTION VALUE    (set OPTION << then lines, then a line \".\")\n"
							  "  unset OPTION\n  show\n  confirm TOKEN\n\n");
			ok = settings_in_force(ctx, owner, &text);
		}
		if (ok && subject != NULL)
			ok = settings_reply(ctx, responder, owner, subject, text.data);
	}
	free(owner);
	free(c.token);
	json_decref(c.changes);
	buf_free(&c.problems);
	buf_free(&text);
	return ok;
}

static int
settings_run(struct pepsi_ctx *ctx)
{
	const char *local_part = pepsi_option_text(ctx, "LOCAL_PART");
	size_t		count = pepsi_rcpt_count(ctx);
	int		   *others = xcalloc(count ? count : 1, sizeof(int));
	size_t		nothers = 0;
	const char *responder = NULL;
	int			rc;

	for (size_t i = 0; i < count; i++)
		if (settings_is_command_address(pepsi_rcpt(ctx, i), local_part))
		{
			if (responder == NULL)
				responder = pepsi_rcpt(ctx, i);
		}
		else
			others[nothers++] = (int) i + 1;
	if (responder == NULL)
	{
		free(others);
		return pepsi_advance(ctx);
	}
	if (nothers > 0 && pepsi_split_off_recipients(ctx, others, nothers, pepsi_option_text(ctx, "NEXT_STAGE")) < 0)
		rc = -1;
	else if (!settings_handle(ctx, responder))
		rc = -1;
	else
		rc = pepsi_finish(ctx);
	free(others);
	return rc;
}

const struct pepsi_stage pepsi_stage_settings_stage = {
	.program = "pepsi-stage-settings",
	.load = PEPSI_LOAD_FULL,
	.run = settings_run,
};

int
pepsi_stage_settings_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_settings_stage, argc, argv);
}
