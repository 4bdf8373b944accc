/*
 * request.c: commands by mail and bounces (pepsi-stage-list,
 * docs/pepsi-stage-list.8.md).
 *
 * list-subscribe@, list-unsubscribe@ and list-request@ (whose Subject or
 * first text line says subscribe, unsubscribe, confirm TOKEN, approve
 * TOKEN or reject TOKEN) act for the From: address.  A subscription or
 * unsubscription is only recorded (pepsi.list_request) until the token
 * mailed to that address comes back (double opt-in); approve and reject
 * are a moderator's answer to a held post.  Answers go from the null
 * sender, never to an automatic sender (RFC 3834).
 *
 * list-bounces+user=domain@ (VERP) and list-bounces@ take DSNs (RFC 3464):
 * a permanent failure (Status 5.x.x) adds 1 to the subscriber's score, a
 * transient one a half; at the list's threshold delivery stops
 * and the owners are told.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "list.h"
#include "message/autoreply.h"
#include "message/header.h"
#include "runtime/stage.h"

/* A transient failure counts this much of a permanent one. */
#define BOUNCE_SOFT_WEIGHT 0.5

/* A token as the list functions make it: 64 hexadecimal digits. */
#define LIST_TOKEN_LEN 64

struct list_command
{
	char *verb; /* subscribe, unsubscribe, confirm, approve, reject, help */
	char *token;
};

/* The token after word in text ("confirm <64 hex>"), or NULL. */
static char *
request_token_after(const char *text, const char *word)
{
	for (const char *p = strcasestr(text, word); p; p = strcasestr(p + 1, word))
	{
		const char *t = p + strlen(word);

		t += strspn(t, " \t");
		if (strspn(t, "0123456789abcdefABCDEF") == LIST_TOKEN_LEN)
			return xstrndup(t, LIST_TOKEN_LEN);
	}
	return NULL;
}

/*
 * subscribe / unsubscribe by mail: record the request and mail its token
 * (double opt-in); the answer for nothing to do goes in text/subject.
 */
/*
 * The web link confirming a request, when the list has an unsubscribe_url
 * on pepsi-httpd (".../list/unsubscribe"): its /list/form/confirm page.
 */
static void
request_web_link(struct buf *text, const char *web, const char *list_id, const char *who, const char *token)
{
	const char *tail = web ? strstr(web, "/list/unsubscribe") : NULL;

	if (tail == NULL || strcmp(tail, "/list/unsubscribe") != 0)
		return;
	buf_printf(text, "\nOr open this link and press the button:\n\n%.*s/list/form/confirm?l=%s&a=", (int) (tail - web),
			   web, list_id);
	for (const char *p = who; *p; p++)
		if (*p == '%' || *p == '+' || *p == '&' || *p == '#' || *p == '?' || *p == '=')
			buf_printf(text, "%%%02X", (unsigned char) *p);
		else
			buf_append_char(text, *p);
	buf_printf(text, "&t=%s\n", token);
}

static bool
request_subscribe(struct pepsi_ctx *ctx, const char *list, const char *list_id, const char *web, const char *who,
				  const char *verb, const char *responder, struct buf *text, const char **subject)
{
	char		ttl[48];
	const char *values[4] = {list_id, who, verb, ttl};
	json_t	   *token;
	bool		ok = true;

	snprintf(ttl, sizeof(ttl), "%.0f seconds", pepsi_option_seconds(ctx, "CONFIRM_LIFETIME"));
	token = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.list_request($1::bigint, $2, $3, $4::interval))", 4, values);
	if (token == NULL)
		return false;
	if (!json_is_string(token))
	{
		*subject = strcmp(verb, "subscribe") == 0 ? "Already subscribed" : "Not subscribed";
		buf_printf(text, "<%s> %s %s: nothing to do.\n", who,
				   strcmp(verb, "subscribe") == 0 ? "is already subscribed to, or may not join," : "is not subscribed to",
				   list);
	}
	else
	{
		char *token_subject = xasprintf("Confirm %s (%s %s)", json_string_value(token), verb, list);

		buf_printf(text, "Someone, perhaps you, asked to %s <%s> %s %s.\n\n"
						 "Reply to this message to confirm, or send this line to %s:\n\n"
						 "confirm %s\n\nThe token works once, for %.0f hours.  "
						 "If you did not ask, ignore this message.\n",
				   verb, who, strcmp(verb, "subscribe") == 0 ? "to" : "from", list, responder,
				   json_string_value(token), pepsi_option_seconds(ctx, "CONFIRM_LIFETIME") / 3600);
		request_web_link(text, web, list_id, who, json_string_value(token));
		ok = list_notice(ctx, responder, who, token_subject, text->data, "confirm");
		free(token_subject);
		log_info("%s: row %lld: <%s>: the %s of <%s> awaits confirmation", pepsi_queue_id(ctx), pepsi_id(ctx), list,
				 verb, who);
	}
	json_decref(token);
	return ok;
}

/* confirm TOKEN by mail: carry out the request; the answer in text/subject. */
static bool
request_confirm(struct pepsi_ctx *ctx, const char *list, const char *list_id, const char *who, const char *token,
				struct buf *text, const char **subject)
{
	const char *values[3] = {list_id, who, token};
	json_t	   *answer = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.list_confirm($1::bigint, $2, $3))", 3, values);

	if (answer == NULL)
		return false;
	if (json_is_string(answer))
	{
		*subject = "Not confirmed";
		buf_printf(text, "Nothing was done: %s.\n", json_string_value(answer));
		log_info("%s: row %lld: <%s>: confirmation by <%s> refused: %s", pepsi_queue_id(ctx), pepsi_id(ctx), list,
				 who, json_string_value(answer));
	}
	else
	{
		*subject = "Confirmed";
		buf_printf(text, "Done: your request for %s is carried out.\n", list);
		log_info("%s: row %lld: <%s>: <%s> confirmed", pepsi_queue_id(ctx), pepsi_id(ctx), list, who);
	}
	json_decref(answer);
	return true;
}

/* The command in the Subject, else in the first text line of the body. */
static void
request_parse(struct pepsi_ctx *ctx, const char *kind, struct list_command *c)
{
	static const char *const verbs[] = {"confirm", "approve", "reject", "unsubscribe", "subscribe", "help", NULL};
	const struct buf		*headers = pepsi_headers(ctx);
	const struct buf		*body = pepsi_body(ctx);
	char					*subject = header_get(headers->data, headers->len, "Subject");
	char					*text = body ? xstrndup(body->data, body->len < 4096 ? body->len : 4096) : xstrdup("");
	char					*line = text;

	/* The body's first line that is not empty or quoted. */
	for (char *next; line && *line; line = next)
	{
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		line += strspn(line, " \t\r");
		if (*line && *line != '>')
			break;
	}
	for (size_t i = 0; verbs[i] && c->verb == NULL; i++)
	{
		const char *sources[2] = {subject ? subject : "", line ? line : ""};

		for (size_t s = 0; s < 2 && c->verb == NULL; s++)
		{
			if (i < 3 && (c->token = request_token_after(sources[s], verbs[i])) != NULL)
				c->verb = xstrdup(verbs[i]);
			else if (i >= 3 && strncasecmp(sources[s] + strspn(sources[s], " \t"), verbs[i], strlen(verbs[i])) == 0)
				c->verb = xstrdup(verbs[i]);
		}
	}
	/* The address says it all: the text may be anything (a greeting). */
	if (c->verb == NULL && strcmp(kind, "request") != 0)
		c->verb = xstrdup(kind);
	free(subject);
	free(text);
}

bool
list_request(struct pepsi_ctx *ctx, json_t *resolved, const char *recipient)
{
	const struct buf   *headers = pepsi_headers(ctx);
	const char		   *list = json_string_value(json_object_get(resolved, "list"));
	const char		   *kind = json_string_value(json_object_get(resolved, "kind"));
	struct list_command c = {0};
	char			   *who = NULL;
	char			   *local;
	char			   *domain;
	char			   *responder;
	char				list_id[32];
	char				why[256];
	struct buf			text = BUF_INIT;
	const char		   *subject = NULL;
	bool				ok = true;

	if (headers == NULL || pepsi_body(ctx) == NULL)
		return false;
	list_address_split(list, &local, &domain);
	responder = xasprintf("%s-request@%s", local, domain);
	snprintf(list_id, sizeof(list_id), "%lld", (long long) json_integer_value(json_object_get(resolved, "id")));
	if ((who = list_from_address(ctx)) == NULL)
		log_warnx("%s: row %lld: <%s>: a command without one From: address: dropped", pepsi_queue_id(ctx),
				  pepsi_id(ctx), recipient);
	else if (autoreply_refused(headers->data, headers->len, pepsi_mail_from(ctx), recipient, why, sizeof(why)))
		log_info("%s: row %lld: <%s>: a command from <%s> not answered: %s", pepsi_queue_id(ctx), pepsi_id(ctx),
				 recipient, who, why);
	else
	{
		request_parse(ctx, kind, &c);
		log_info("%s: row %lld: <%s>: %s from <%s>", pepsi_queue_id(ctx), pepsi_id(ctx), recipient,
				 c.verb ? c.verb : "no command", who);
		if (c.verb == NULL || strcmp(c.verb, "help") == 0)
		{
			subject = "Help";
			buf_printf(&text, "Commands for %s, one in the Subject or the first line, sent to %s:\n\n"
							  "  subscribe\n  unsubscribe\n  confirm TOKEN\n\n"
							  "Or write to %s-subscribe@%s or %s-unsubscribe@%s.\n",
					   list, responder, local, domain, local, domain);
		}
		else if (strcmp(c.verb, "subscribe") == 0 || strcmp(c.verb, "unsubscribe") == 0)
			ok = request_subscribe(ctx, list, list_id,
								   json_string_value(json_object_get(resolved, "unsubscribe_url")), who, c.verb,
								   responder, &text, &subject);
		else if (strcmp(c.verb, "confirm") == 0)
			ok = request_confirm(ctx, list, list_id, who, c.token, &text, &subject);
		else
		{
			/* approve / reject: a moderator's answer to a held post. */
			const char *values[3] = {c.token, c.verb, who};
			json_t	   *answer = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.list_decide_by_token($1, $2, $3))", 3,
												 values);

			if (answer == NULL)
				ok = false;
			else if (json_is_string(answer))
			{
				subject = "Moderation: not done";
				buf_printf(&text, "Nothing was done: %s.\n", json_string_value(answer));
				log_warnx("%s: row %lld: <%s>: moderation by <%s> refused: %s", pepsi_queue_id(ctx), pepsi_id(ctx),
						  list, who, json_string_value(answer));
			}
			else
				log_info("%s: row %lld: <%s>: <%s>: %s a held post", pepsi_queue_id(ctx), pepsi_id(ctx), list, who,
						 strcmp(c.verb, "approve") == 0 ? "approved" : "rejected");
			json_decref(answer);
		}
		if (ok && subject)
			ok = list_notice(ctx, responder, who, subject, text.data, "answer");
	}
	free(c.verb);
	free(c.token);
	free(who);
	free(local);
	free(domain);
	free(responder);
	buf_free(&text);
	return ok;
}

/* The value of the first "Name:" line of a DSN's text (unfolded only as far as the line), or NULL. */
static char *
bounce_field(const char *text, const char *name)
{
	size_t len = strlen(name);

	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (strncasecmp(p, name, len) == 0 && p[len] == ':')
		{
			const char *v = p + len + 1;

			v += strspn(v, " \t");
			return xstrndup(v, strcspn(v, "\r\n"));
		}
	return NULL;
}

bool
list_bounce(struct pepsi_ctx *ctx, json_t *resolved, const char *recipient)
{
	const struct buf *body = pepsi_body(ctx);
	const char		 *list = json_string_value(json_object_get(resolved, "list"));
	const char		 *verp = json_string_value(json_object_get(resolved, "verp"));
	char			 *text = body ? xstrndup(body->data, body->len) : xstrdup("");
	char			 *status = bounce_field(text, "Status");
	char			 *action = bounce_field(text, "Action");
	char			 *diagnostic = bounce_field(text, "Diagnostic-Code");
	char			 *final = NULL;
	char			 *member = NULL;
	char			  list_id[32];
	char			  weight[32];
	json_t			 *answer;
	bool			  ok = true;

	if (body == NULL)
	{
		free(text);
		return false;
	}
	if (verp)
		member = xstrdup(verp);
	else if ((final = bounce_field(text, "Final-Recipient")) != NULL && strchr(final, ';'))
	{
		const char *a = strchr(final, ';') + 1;

		member = xstrdup(a + strspn(a, " \t<"));
		member[strcspn(member, "> \t")] = '\0';
	}
	if (member == NULL || status == NULL || (action && strcasecmp(action, "failed") != 0 && status[0] != '5'))
	{
		log_info("%s: row %lld: <%s>: not a failure report for a subscriber (%s): dropped", pepsi_queue_id(ctx),
				 pepsi_id(ctx), recipient,
				 member == NULL ? "no subscriber named" : status == NULL ? "no DSN Status"
																		 : "a delay report");
		goto out;
	}
	snprintf(list_id, sizeof(list_id), "%lld", (long long) json_integer_value(json_object_get(resolved, "id")));
	snprintf(weight, sizeof(weight), "%g", status[0] == '5' ? 1.0 : BOUNCE_SOFT_WEIGHT);
	{
		const char *values[5] = {list_id, member, status, diagnostic, weight};

		answer = pepsi_call_json(ctx, "SELECT pepsi.list_bounce_record($1::bigint, $2, $3, $4, $5::real)", 5, values);
	}
	if (answer == NULL)
	{
		ok = false;
		goto out;
	}
	if (!json_is_true(json_object_get(answer, "member")))
		log_info("%s: row %lld: <%s>: a bounce (%s) for <%s>, not a subscriber", pepsi_queue_id(ctx), pepsi_id(ctx),
				 list, status, member);
	else
	{
		log_info("%s: row %lld: <%s>: a bounce (%s) for <%s>: score %g of %g", pepsi_queue_id(ctx), pepsi_id(ctx),
				 list, status, member, json_number_value(json_object_get(answer, "score")),
				 json_number_value(json_object_get(answer, "threshold")));
		if (json_is_true(json_object_get(answer, "disabled")))
		{
			size_t	i;
			json_t *owner;
			char   *local;
			char   *domain;
			char   *responder;
			char   *notice;

			list_address_split(list, &local, &domain);
			responder = xasprintf("%s-owner@%s", local, domain);
			notice = xasprintf("Delivery of %s to <%s> has stopped: its bounce score reached %g (the last: %s%s%s).\n"
							   "Re-enable it with: pepsi-list enable %s %s\n",
							   list, member, json_number_value(json_object_get(answer, "score")), status,
							   diagnostic ? ", " : "", diagnostic ? diagnostic : "", list, member);
			log_warnx("%s: row %lld: <%s>: <%s> disabled by bounces", pepsi_queue_id(ctx), pepsi_id(ctx), list,
					  member);
			json_array_foreach (json_object_get(answer, "owners"), i, owner)
				ok = ok && list_notice(ctx, responder, json_string_value(owner), "Subscriber disabled by bounces", notice, "disabled");
			free(local);
			free(domain);
			free(responder);
			free(notice);
		}
	}
	json_decref(answer);
out:
	free(text);
	free(status);
	free(action);
	free(diagnostic);
	free(final);
	free(member);
	return ok;
}
