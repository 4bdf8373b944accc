/*
 * pepsi-stage-list: mailing lists (docs/pepsi-stage-list.8.md; issue 40).
 *
 * Each recipient is looked up in pepsi.mailing_list (pepsi.list_resolve):
 * list@ is a post (post.c), list-request@, -subscribe@ and -unsubscribe@
 * are commands and list-bounces@ / list-bounces+user=domain@ bounces
 * (request.c), list-owner@ is rewritten to the owners.  Recipients of no
 * list go on to NEXT_STAGE on a row of their own; a second list address
 * of the same message goes back to this stage on its own row.  A post
 * passes twice: the first pass decides and rewrites its headers, the
 * second (state.list.phase "fanout") makes the subscribers' rows, which
 * share its body, and deletes it in one call (post.c).  A row the schedule
 * injects with state.list_digest sends a digest (digest.c).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/buf.h"
#include "base/log.h"
#include "base/xalloc.h"
#include "list.h"
#include "message/autoreply.h"
#include "message/header.h"
#include "message/origin.h"
#include "runtime/stage.h"

int pepsi_stage_list_main(int argc, char **argv);

void
list_address_split(const char *address, char **local, char **domain)
{
	const char *at = strrchr(address, '@');

	*local = at ? xstrndup(address, (size_t) (at - address)) : xstrdup(address);
	*domain = xstrdup(at ? at + 1 : "");
}

char *
list_from_address(struct pepsi_ctx *ctx)
{
	const struct buf *headers = pepsi_headers(ctx);

	return headers ? header_from_address(headers->data, headers->len) : NULL;
}

bool
list_notice(struct pepsi_ctx *ctx, const char *responder, const char *recipient, const char *subject,
			const char *text, const char *key)
{
	const struct buf *headers = pepsi_headers(ctx);
	const char		 *reply_stage = pepsi_option_text(ctx, "REPLY_STAGE");
	struct buf		  reply_headers = BUF_INIT;
	struct buf		  reply_body = BUF_INIT;
	char			  unique[128];
	char			 *token;
	json_t			 *state;
	long long		  id;
	struct autoreply  reply = {
		 .responder = responder,
		 .recipient = recipient,
		 .subject = subject,
		 .text = text,
		 .hostname = config_hostname(pepsi_config(ctx)),
		 .unique = unique,
	 };

	snprintf(unique, sizeof(unique), "%lld.list.%s", pepsi_id(ctx), key);
	autoreply_build(&reply, headers ? headers->data : "", headers ? headers->len : 0, &reply_headers, &reply_body);
	token = xasprintf("list-%lld-%s-%s", pepsi_id(ctx), key, recipient);
	state = json_pack("{s:o}", "origin", origin_generated("pepsi-stage-list"));
	id = pepsi_enqueue_new(ctx, reply_stage ? reply_stage : "init", "", &recipient, 1, reply_headers.data,
						   reply_headers.len, reply_body.data, reply_body.len, state, token);
	json_decref(state);
	free(token);
	buf_free(&reply_headers);
	buf_free(&reply_body);
	if (id >= 0)
		log_info("%s: row %lld: <%s>: sent <%s> \"%s\" (row %lld)", pepsi_queue_id(ctx), pepsi_id(ctx), responder,
				 recipient, subject, id);
	return id >= 0;
}

/* Mail to list-owner@: to the owners, as it is. */
static int
list_to_owners(struct pepsi_ctx *ctx, json_t *resolved, const char *recipient)
{
	const char	*values[1];
	char		 id[32];
	json_t		*owners;
	const char **rcpt;
	size_t		 n;
	int			 rc;

	snprintf(id, sizeof(id), "%lld", (long long) json_integer_value(json_object_get(resolved, "id")));
	values[0] = id;
	owners = pepsi_call_json(ctx, "SELECT pepsi.list_owners($1::bigint)", 1, values);
	if (owners == NULL)
		return -1;
	n = json_array_size(owners);
	if (n == 0)
	{
		log_warnx("%s: row %lld: <%s>: the list has no owner: dropped", pepsi_queue_id(ctx), pepsi_id(ctx),
				  recipient);
		json_decref(owners);
		return pepsi_finish(ctx);
	}
	rcpt = xcalloc(n, sizeof(*rcpt));
	for (size_t i = 0; i < n; i++)
		rcpt[i] = json_string_value(json_array_get(owners, i));
	log_info("%s: row %lld: <%s>: to the %zu owner(s)", pepsi_queue_id(ctx), pepsi_id(ctx), recipient, n);
	rc = pepsi_rewrite_recipients(ctx, rcpt, n, NULL);
	free(rcpt);
	json_decref(owners);
	return rc;
}

/* Each recipient's list_resolve answer (NULL for a recipient of no list), in order; NULL on error. */
static json_t *
list_resolve_all(struct pepsi_ctx *ctx)
{
	size_t		count = pepsi_rcpt_count(ctx);
	json_t	   *rcpt = json_array();
	json_t	   *resolved;
	char	   *rcpt_text;
	const char *values[1];

	for (size_t i = 0; i < count; i++)
		json_array_append_new(rcpt, json_string(pepsi_rcpt(ctx, i)));
	rcpt_text = json_dumps(rcpt, JSON_COMPACT);
	values[0] = rcpt_text;
	resolved = pepsi_call_json(ctx,
							   "SELECT coalesce(jsonb_agg(pepsi.list_resolve(r) ORDER BY n), '[]')"
							   " FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS x(r, n)",
							   1, values);
	free(rcpt_text);
	json_decref(rcpt);
	return resolved;
}

/* The row now holds one list address alone, which one resolved: to its handler. */
static int
list_dispatch(struct pepsi_ctx *ctx, json_t *one)
{
	const char *recipient = pepsi_rcpt(ctx, 0);
	const char *kind = json_string_value(json_object_get(one, "kind"));

	if (strcmp(kind, "post") == 0)
		return list_post(ctx, one);
	if (strcmp(kind, "owner") == 0)
		return list_to_owners(ctx, one, recipient);
	if (strcmp(kind, "bounces") == 0)
		return list_bounce(ctx, one, recipient) ? pepsi_finish(ctx) : -1;
	return list_request(ctx, one, recipient) ? pepsi_finish(ctx) : -1;
}

static int
list_run(struct pepsi_ctx *ctx)
{
	json_t	   *list_state = json_object_get(pepsi_state(ctx), "list");
	const char *phase = json_string_value(json_object_get(list_state, "phase"));
	size_t		count = pepsi_rcpt_count(ctx);
	json_t	   *resolved;
	int		   *others;
	int		   *more_lists;
	size_t		nothers = 0;
	size_t		nmore = 0;
	size_t		first = count;
	int			rc = -1;

	if (phase && strcmp(phase, "fanout") == 0)
		return list_fan_out(ctx, list_state);
	if (json_object_get(pepsi_state(ctx), "schedule") && json_is_true(json_object_get(pepsi_state(ctx), "list_digest")))
		return list_digest_run(ctx);
	if ((resolved = list_resolve_all(ctx)) == NULL)
		return -1;
	others = xcalloc(count + 1, sizeof(int));
	more_lists = xcalloc(count + 1, sizeof(int));
	for (size_t i = 0; i < count; i++)
	{
		if (json_is_null(json_array_get(resolved, i)))
			others[nothers++] = (int) i + 1;
		else if (first == count)
			first = i;
		else
			more_lists[nmore++] = (int) i + 1;
	}
	if (first == count)
		rc = pepsi_advance(ctx);
	else if ((nothers == 0
			  || pepsi_split_off_recipients(ctx, others, nothers, pepsi_option_text(ctx, "NEXT_STAGE")) >= 0)
			 && (nmore == 0 || pepsi_split_off_recipients(ctx, more_lists, nmore, pepsi_stage_name(ctx)) >= 0))
		rc = list_dispatch(ctx, json_array_get(resolved, first));
	json_decref(resolved);
	free(others);
	free(more_lists);
	return rc;
}

const struct pepsi_stage pepsi_stage_list_stage = {
	.program = "pepsi-stage-list",
	.load = PEPSI_LOAD_FULL,
	.run = list_run,
};

int
pepsi_stage_list_main(int argc, char **argv)
{
	return pepsi_worker_main(&pepsi_stage_list_stage, argc, argv);
}
