/*
 * post.c: a post to list@ (pepsi-stage-list, docs/pepsi-stage-list.8.md).
 *
 * Refused before anything else: a loop (our own List-Id, or X-Loop naming
 * the list, arriving again).  Then the list's policy (pepsi.list_post_check)
 * on the From: address: accepted, held for the moderators (pepsi.list_hold;
 * they get the token that approves it, the row waits on hold until
 * pepsi.list_decide releases it), or dropped.  An accepted post gets the
 * RFC 2369 / RFC 2919 fields, the subject tag, the footer, and, when its
 * author's domain publishes DMARC p=reject or quarantine (ingress's verdict,
 * state.auth.dmarc, else a lookup), From: rewritten to the list; it then leaves from
 * list-bounces@ as the list's own mail (state.origin.trust "list", which
 * pepsi-stage-dkim-sign signs with the list's domain), and is split into
 * one row per subscriber, or per domain, on its second pass.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "auth/dmarc.h"
#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "dns/dns.h"
#include "list.h"
#include "message/header.h"
#include "message/origin.h"
#include "runtime/stage.h"

/*
 * Fields a list replaces: the upstream list's, and signatures our changes
 * break.  An upstream X-Loop stays (ours is added), so a post that goes
 * round two lists subscribed to each other comes back naming the list.
 */
static const char *const post_replaced_fields[] = {
	"List-Id", "List-Post", "List-Help", "List-Subscribe", "List-Unsubscribe", "List-Unsubscribe-Post",
	"List-Owner", "List-Archive", "Precedence", "DKIM-Signature", "Return-Path",
	"Sender", "Errors-To", NULL};

/* The RFC 2919 list-id: list.domain, the "@" a dot. */
static char *
post_list_id(const char *list)
{
	char *id = xstrdup(list);

	*strrchr(id, '@') = '.';
	return id;
}

/* Is the post one this list sent before (its List-Id, or X-Loop naming it)? */
static const char *
post_loop(const struct buf *headers, const char *list)
{
	char	   *list_id = header_get(headers->data, headers->len, "List-Id");
	char	   *id = post_list_id(list);
	char	   *bracketed = xasprintf("<%s>", id);
	struct buf	loops = BUF_INIT;
	const char *why = NULL;

	header_get_all(headers->data, headers->len, "X-Loop", &loops);
	if (list_id && strcasestr(list_id, bracketed))
		why = "it carries this list's own List-Id";
	else if (loops.len > 0)
	{
		char **addresses = NULL;
		size_t count = 0;

		header_addresses(loops.data, &addresses, &count);
		for (size_t i = 0; i < count; i++)
		{
			if (strcasecmp(addresses[i], list) == 0)
				why = "its X-Loop names this list";
			free(addresses[i]);
		}
		free(addresses);
	}
	free(list_id);
	free(id);
	free(bracketed);
	buf_free(&loops);
	return why;
}

/* The display name of a From: value (quotes and angle address dropped), or NULL. */
static char *
post_display_name(const char *from)
{
	const char *lt = strchr(from, '<');
	char	   *name;
	char	   *p;

	if (lt == NULL || lt == from)
		return NULL;
	name = xstrndup(from, (size_t) (lt - from));
	for (p = name + strlen(name); p > name && isspace((unsigned char) p[-1]); p--)
		;
	*p = '\0';
	p = name + strspn(name, " \t\"");
	if (*p && p[strlen(p) - 1] == '"')
		p[strlen(p) - 1] = '\0';
	if (*p == '\0' || strpbrk(p, "\r\n\"\\") != NULL)
	{
		free(name);
		return NULL;
	}
	memmove(name, p, strlen(p) + 1);
	return name;
}

/* The DMARC policy of domain's record (_dmarc.name), for a subdomain its sp; NULL when none. */
static const char *
post_dmarc_record(struct dns_resolver *resolver, const char *name, bool subdomain)
{
	static const char *const names[] = {"none", "quarantine", "reject"};
	struct dns_answer		 answer;
	struct dmarc_record		 record;
	const char				*why;
	const char				*policy = NULL;
	char					 query[300];

	snprintf(query, sizeof(query), "_dmarc.%s", name);
	dns_resolve_sync(resolver, query, DNS_TYPE_TXT, &answer);
	for (size_t i = 0; answer.status == DNS_OK && i < answer.count && policy == NULL; i++)
		if (answer.records[i].type == DNS_TYPE_TXT && answer.records[i].text
			&& dmarc_record_parse(answer.records[i].text, answer.records[i].len, &record, &why))
			policy = names[subdomain ? record.sp : record.p];
	dns_answer_free(&answer);
	return policy;
}

/*
 * Does From:'s domain ask receivers to refuse mail that fails DMARC?
 * Ingress's verdict (state.auth.dmarc) when it made one, else a lookup
 * of the domain's record, or its organizational domain's.
 */
static const char *
post_dmarc_strict(struct pepsi_ctx *ctx, const char *author)
{
	static struct dns_resolver *resolver;
	json_t					   *dmarc = json_object_get(json_object_get(pepsi_state(ctx), "auth"), "dmarc");
	const char				   *policy = json_string_value(json_object_get(dmarc, "policy.dmarc"));
	const char				   *domain = strrchr(author, '@') + 1;

	if (policy == NULL)
	{
		char			  err[512];
		struct dns_config dns;

		if (resolver == NULL && dns_config_load(pepsi_config(ctx), &dns, err, sizeof(err)))
		{
			resolver = dns_resolver_new(NULL, &dns, err, sizeof(err));
			dns_config_free(&dns);
		}
		if (resolver == NULL)
			log_warnx("%s: row %lld: no DMARC verdict from ingress and no resolver to look one up: %s",
					  pepsi_queue_id(ctx), pepsi_id(ctx), err);
		else if ((policy = post_dmarc_record(resolver, domain, false)) == NULL)
		{
			char *organization = dmarc_organizational_domain(domain);

			if (organization && strcasecmp(organization, domain) != 0)
				policy = post_dmarc_record(resolver, organization, true);
			free(organization);
		}
	}
	if (policy && (strcmp(policy, "reject") == 0 || strcmp(policy, "quarantine") == 0))
		return policy;
	return NULL;
}

/* The footer appended to a plain-text body (not to MIME or encoded ones: they stay intact). */
static bool
post_footer(struct pepsi_ctx *ctx, const struct buf *headers, const char *footer)
{
	const struct buf *body = pepsi_body(ctx);
	char			 *type = header_get(headers->data, headers->len, "Content-Type");
	char			 *encoding = header_get(headers->data, headers->len, "Content-Transfer-Encoding");
	bool			  plain = (type == NULL || strncasecmp(type + strspn(type, " \t"), "text/plain", 10) == 0)
				 && (encoding == NULL || strcasestr(encoding, "base64") == NULL)
				 && (encoding == NULL || strcasestr(encoding, "quoted-printable") == NULL);
	struct buf out = BUF_INIT;

	free(type);
	free(encoding);
	if (!plain || body == NULL)
		return false;
	buf_append(&out, body->data, body->len);
	if (out.len > 0 && out.data[out.len - 1] != '\n')
		buf_append_str(&out, "\r\n");
	buf_append_str(&out, "-- \r\n");
	for (const char *p = footer; *p; p++)
		if (*p == '\n' && (p == footer || p[-1] != '\r'))
			buf_append_str(&out, "\r\n");
		else
			buf_append_char(&out, *p);
	if (out.data[out.len - 1] != '\n')
		buf_append_str(&out, "\r\n");
	pepsi_set_body(ctx, out.data, out.len);
	buf_free(&out);
	return true;
}

/* The header block of an accepted post. */
static void
post_headers(struct pepsi_ctx *ctx, json_t *resolved, const char *author, const char *strict, struct buf *out,
			 bool *rewrote_from)
{
	const struct buf *headers = pepsi_headers(ctx);
	const char		 *list = json_string_value(json_object_get(resolved, "list"));
	const char		 *description = json_string_value(json_object_get(resolved, "description"));
	const char		 *tag = json_string_value(json_object_get(resolved, "subject_tag"));
	const char		 *policy = json_string_value(json_object_get(resolved, "posting_policy"));
	const char		 *mitigation = json_string_value(json_object_get(resolved, "dmarc_mitigation"));
	char			 *subject = header_get(headers->data, headers->len, "Subject");
	char			 *from = header_get(headers->data, headers->len, "From");
	char			 *reply_to = header_get(headers->data, headers->len, "Reply-To");
	char			 *message_id = header_get(headers->data, headers->len, "Message-ID");
	char			 *list_id = post_list_id(list);
	char			 *local;
	char			 *domain;
	struct buf		  work = BUF_INIT;
	struct buf		  next = BUF_INIT;

	list_address_split(list, &local, &domain);
	buf_append(&work, headers->data, headers->len);
	for (size_t i = 0; post_replaced_fields[i]; i++)
	{
		buf_reset(&next);
		header_remove(work.data, work.len, post_replaced_fields[i], &next);
		buf_reset(&work);
		buf_append(&work, next.data, next.len);
	}
	*rewrote_from = strict && from && strcmp(mitigation, "from") == 0;
	if (tag && subject && strcasestr(subject, tag) == NULL)
	{
		buf_reset(&next);
		header_remove(work.data, work.len, "Subject", &next);
		buf_reset(&work);
		buf_append(&work, next.data, next.len);
		buf_printf(out, "Subject: %s %s\r\n", tag, subject + strspn(subject, " \t"));
	}
	else if (tag && subject == NULL)
		buf_printf(out, "Subject: %s\r\n", tag);
	if (*rewrote_from)
	{
		char *name = post_display_name(from);

		buf_reset(&next);
		header_remove(work.data, work.len, "From", &next);
		buf_reset(&work);
		buf_append(&work, next.data, next.len);
		buf_printf(out, "From: \"%s via %s\" <%s>\r\n", name ? name : author, local, list);
		buf_printf(out, "X-Original-From: %s\r\n", from);
		if (reply_to == NULL)
			buf_printf(out, "Reply-To: %s\r\n", from);
		free(name);
		log_info("%s: row %lld: <%s>: From: <%s> rewritten to the list (its domain's DMARC policy is %s)",
				 pepsi_queue_id(ctx), pepsi_id(ctx), list, author, strict);
	}
	if (message_id == NULL)
	{
		char id[64];

		pepsi_new_queue_id(ctx, id);
		buf_printf(out, "Message-ID: <%s.list@%s>\r\n", id, domain);
		log_info("%s: row %lld: <%s>: the post from <%s> has no Message-ID: given one", pepsi_queue_id(ctx),
				 pepsi_id(ctx), list, author);
	}
	if (description && *description && strpbrk(description, "\r\n\"\\") == NULL)
		buf_printf(out, "List-Id: \"%s\" <%s>\r\n", description, list_id);
	else
		buf_printf(out, "List-Id: <%s>\r\n", list_id);
	if (strcmp(policy, "announce") == 0)
		buf_append_str(out, "List-Post: NO\r\n");
	else
		buf_printf(out, "List-Post: <mailto:%s>\r\n", list);
	buf_printf(out, "List-Help: <mailto:%s-request@%s?subject=help>\r\n", local, domain);
	buf_printf(out, "List-Subscribe: <mailto:%s-subscribe@%s>\r\n", local, domain);
	buf_printf(out, "List-Owner: <mailto:%s-owner@%s>\r\n", local, domain);
	buf_printf(out, "X-Loop: %s\r\nPrecedence: list\r\n", list);
	buf_append(out, work.data, work.len);
	free(subject);
	free(from);
	free(reply_to);
	free(message_id);
	free(list_id);
	free(local);
	free(domain);
	buf_free(&work);
	buf_free(&next);
}

/* Hold the post for the moderators; they are sent the token that decides it. */
static int
post_hold(struct pepsi_ctx *ctx, json_t *resolved, const char *author, const char *reason)
{
	const struct buf *headers = pepsi_headers(ctx);
	const char		 *list = json_string_value(json_object_get(resolved, "list"));
	char			 *subject = header_get(headers->data, headers->len, "Subject");
	char			  list_id[32];
	char			  row[32];
	const char		 *values[5] = {list_id, row, author, subject ? subject : "", reason};
	json_t			 *held;
	json_t			 *moderators;
	char			 *local;
	char			 *domain;
	char			 *responder;
	size_t			  i;
	json_t			 *moderator;
	bool			  ok = true;
	int				  rc;

	snprintf(list_id, sizeof(list_id), "%lld", (long long) json_integer_value(json_object_get(resolved, "id")));
	snprintf(row, sizeof(row), "%lld", pepsi_id(ctx));
	held = pepsi_call_json(ctx, "SELECT pepsi.list_hold($1::bigint, $2::bigint, $3, $4, $5)", 5, values);
	if (held == NULL)
	{
		free(subject);
		return -1;
	}
	list_address_split(list, &local, &domain);
	responder = xasprintf("%s-request@%s", local, domain);
	moderators = json_object_get(held, "moderators");
	json_array_foreach (moderators, i, moderator)
	{
		char *notice_subject = xasprintf("Moderation: approve %s", json_string_value(json_object_get(held, "token")));
		char *text = xasprintf("A post to %s from <%s> is held: %s.\n\nSubject: %s\n\n"
							   "Reply to this message to approve it, or send this line to %s:\n\n"
							   "approve %s\n\nTo reject it instead, send:\n\nreject %s\n",
							   list, author, reason, subject ? subject : "(none)", responder,
							   json_string_value(json_object_get(held, "token")),
							   json_string_value(json_object_get(held, "token")));

		ok = ok && list_notice(ctx, responder, json_string_value(moderator), notice_subject, text, "hold");
		free(notice_subject);
		free(text);
	}
	if (json_array_size(moderators) == 0)
		log_warnx("%s: row %lld: <%s>: held, and the list has no moderator or owner to tell", pepsi_queue_id(ctx),
				  pepsi_id(ctx), list);
	log_info("%s: row %lld: <%s>: the post from <%s> is held (%s): held post %lld", pepsi_queue_id(ctx),
			 pepsi_id(ctx), list, author, reason, (long long) json_integer_value(json_object_get(held, "id")));
	if (ok)
	{
		json_t *merge = json_pack("{s:{s:s, s:I}}", "list", "phase", "held", "held",
								  json_integer_value(json_object_get(held, "id")));

		rc = pepsi_hold(ctx, merge);
		json_decref(merge);
	}
	else
		rc = -1;
	json_decref(held);
	free(subject);
	free(local);
	free(domain);
	free(responder);
	return rc;
}

/* What the moderators decided on this row, if it was held: "approve", "reject" or NULL. */
static char *
post_moderated(struct pepsi_ctx *ctx, bool *failed)
{
	json_t	   *list_state = json_object_get(pepsi_state(ctx), "list");
	const char *phase = json_string_value(json_object_get(list_state, "phase"));
	char		row[32];
	const char *values[1] = {row};
	json_t	   *decision;
	char	   *answer = NULL;

	*failed = false;
	if (phase == NULL || strcmp(phase, "held") != 0)
		return NULL;
	snprintf(row, sizeof(row), "%lld", pepsi_id(ctx));
	decision = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.list_held_decision($1::bigint))", 1, values);
	if (decision == NULL)
		*failed = true;
	else if (json_is_string(decision))
		answer = xstrdup(json_string_value(decision));
	json_decref(decision);
	return answer;
}

/*
 * An accepted post: wrapped or given the list's fields, footer and return
 * path, then to its second pass (the fan-out), through ARC_SEAL_STAGE
 * when the list's posts are ARC-sealed (that stage's NEXT_STAGE is this
 * one).
 */
static int
post_accept(struct pepsi_ctx *ctx, json_t *resolved, const char *author, bool moderated)
{
	const char *list = json_string_value(json_object_get(resolved, "list"));
	const char *footer = json_string_value(json_object_get(resolved, "footer_text"));
	const char *mitigation = json_string_value(json_object_get(resolved, "dmarc_mitigation"));
	const char *seal = pepsi_option_text(ctx, "ARC_SEAL_STAGE");
	const char *strict = post_dmarc_strict(ctx, author);
	struct buf	out = BUF_INIT;
	bool		rewrote_from = false;
	bool		wrapped = strict && mitigation && strcmp(mitigation, "wrap") == 0;
	char	   *local;
	char	   *domain;
	char	   *bounces;
	json_t	   *merge;
	int			rc;

	if (wrapped)
	{
		const struct buf *headers = pepsi_headers(ctx);
		char			 *from = header_get(headers->data, headers->len, "From");
		char			 *name = from ? post_display_name(from) : NULL;

		list_wrap(ctx, list, author, name, strict);
		free(name);
		free(from);
	}
	post_headers(ctx, resolved, author, strict, &out, &rewrote_from);
	if (footer && *footer && !wrapped)
		post_footer(ctx, pepsi_headers(ctx), footer);
	pepsi_set_headers(ctx, out.data, out.len);
	list_address_split(list, &local, &domain);
	bounces = xasprintf("%s-bounces@%s", local, domain);
	pepsi_set_mail_from(ctx, bounces);
	merge = json_pack("{s:{s:s, s:s, s:s, s:s}, s:{s:s, s:I, s:s, s:O?, s:b, s:b}}", "origin", "trust",
					  ORIGIN_TRUST_LIST, "program", "pepsi-stage-list", "list", list, "domain", domain, "list", "phase",
					  "fanout", "id", json_integer_value(json_object_get(resolved, "id")), "author", author, "origin",
					  json_object_get(pepsi_state(ctx), "origin"), "from_rewritten", rewrote_from, "wrapped", wrapped);
	log_info("%s: row %lld: <%s>: the post from <%s> is accepted%s", pepsi_queue_id(ctx), pepsi_id(ctx), list, author,
			 moderated ? " (approved by a moderator)" : "");
	rc = pepsi_reroute(ctx, seal && *seal ? seal : pepsi_stage_name(ctx), merge);
	json_decref(merge);
	free(bounces);
	free(local);
	free(domain);
	buf_free(&out);
	return rc;
}

/* The list's policy on a post not yet moderated: 1 accepted, 0 concluded (held or refused), -1 an error. */
static int
post_policy(struct pepsi_ctx *ctx, json_t *resolved, const char *author, int *rc)
{
	const char *list = json_string_value(json_object_get(resolved, "list"));
	char		list_id[32];
	const char *values[2] = {list_id, author};
	char	   *suspect = list_post_suspect(ctx, resolved);
	json_t	   *verdict;
	const char *decision;
	const char *reason;
	int			accepted = 0;

	if (suspect)
	{
		*rc = post_hold(ctx, resolved, author, suspect);
		free(suspect);
		return 0;
	}
	snprintf(list_id, sizeof(list_id), "%lld", (long long) json_integer_value(json_object_get(resolved, "id")));
	verdict = pepsi_call_json(ctx, "SELECT pepsi.list_post_check($1::bigint, $2)", 2, values);
	decision = json_string_value(json_object_get(verdict, "decision"));
	reason = json_string_value(json_object_get(verdict, "reason"));
	if (verdict == NULL || decision == NULL)
		accepted = -1;
	else if (strcmp(decision, "hold") == 0)
		*rc = post_hold(ctx, resolved, author, reason);
	else if (strcmp(decision, "reject") == 0)
	{
		log_warnx("%s: row %lld: <%s>: the post from <%s> is refused (%s): dropped", pepsi_queue_id(ctx),
				  pepsi_id(ctx), list, author, reason);
		*rc = pepsi_finish(ctx);
	}
	else
		accepted = strcmp(decision, "accept") == 0 ? 1 : -1;
	json_decref(verdict);
	return accepted;
}

int
list_post(struct pepsi_ctx *ctx, json_t *resolved)
{
	const struct buf *headers = pepsi_headers(ctx);
	const char		 *list = json_string_value(json_object_get(resolved, "list"));
	char			 *author = NULL;
	const char		 *loop;
	char			 *moderated = NULL;
	bool			  failed;
	int				  rc = -1;

	if (headers == NULL || pepsi_body(ctx) == NULL)
		return -1;
	if ((loop = post_loop(headers, list)) != NULL)
	{
		log_warnx("%s: row %lld: <%s>: a loop: %s: dropped", pepsi_queue_id(ctx), pepsi_id(ctx), list, loop);
		return pepsi_finish(ctx);
	}
	author = list_from_address(ctx);
	if (author == NULL)
	{
		log_warnx("%s: row %lld: <%s>: the post has not one From: address: dropped", pepsi_queue_id(ctx),
				  pepsi_id(ctx), list);
		return pepsi_finish(ctx);
	}
	moderated = post_moderated(ctx, &failed);
	if (failed)
		goto out;
	if (moderated && strcmp(moderated, "reject") == 0)
	{
		log_info("%s: row %lld: <%s>: the held post from <%s> was rejected by a moderator: dropped",
				 pepsi_queue_id(ctx), pepsi_id(ctx), list, author);
		rc = pepsi_finish(ctx);
		goto out;
	}
	if (moderated != NULL || post_policy(ctx, resolved, author, &rc) == 1)
		rc = post_accept(ctx, resolved, author, moderated != NULL);
out:
	free(moderated);
	free(author);
	return rc;
}

/*
 * The second pass of an accepted post: the list's archive keeps its own
 * copy of it, copied from the row server-side (pepsi.archive_post), and
 * the subscribers' rows are clones of this row (they share its body),
 * made and this row deleted by one call at the commit (pepsi_finish_with, pepsi.workqueue_finish_with_clones).  A
 * worker that dies before it commits leaves the row to run again and no
 * copy sent; one that dies after leaves nothing to run again.  Each clone's
 * token names this row and its group, so even a second run could not make
 * a copy twice.
 */
int
list_fan_out(struct pepsi_ctx *ctx, json_t *list_state)
{
	const char *next = pepsi_option_text(ctx, "NEXT_STAGE");
	char		list_id[32];
	json_t	   *groups;
	json_t	   *group;
	size_t		i;
	int			rc;

	snprintf(list_id, sizeof(list_id), "%lld", (long long) json_integer_value(json_object_get(list_state, "id")));
	/*
	 * One call: the digest's copy and the archive's (keyed by this row, so a
	 * second run adds each once), then the subscribers' groups.
	 */
	if ((groups = list_fanout_call(ctx, list_id, next)) == NULL)
		return -1;
	if (json_array_size(groups) == 0)
		log_info("%s: row %lld: list %s has no subscriber taking each message: nothing sent", pepsi_queue_id(ctx),
				 pepsi_id(ctx), list_id);
	else
		log_info("%s: row %lld: list %s: the post goes out on %zu row(s)", pepsi_queue_id(ctx), pepsi_id(ctx),
				 list_id, json_array_size(groups));
	json_array_foreach (groups, i, group)
		json_object_set_new(group, "token", json_sprintf("list-%lld-%zu", pepsi_id(ctx), i + 1));
	rc = pepsi_finish_with(ctx, groups);
	json_decref(groups);
	return rc;
}
