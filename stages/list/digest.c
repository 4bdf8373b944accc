/*
 * digest.c: digests (pepsi-stage-list, docs/pepsi-stage-list.8.md).
 *
 * At its fan-out a post is copied for the next digest when the list has
 * digest members (pepsi.list_digest_add, keyed by the queue row, so a
 * fan-out that runs again copies nothing twice), in the one call that also
 * archives it and returns the subscribers' groups (list_fanout_call).  A schedule row
 * (pepsi.schedule, run by the maintenance worker) injects a row at this
 * stage whose recipient is the list and whose state says list_digest;
 * the stage then has pepsi.list_digest_send build the digest (MIME
 * multipart/digest or RFC 1153 plain text, the list's digest_format),
 * queue it at NEXT_STAGE for the digest members and take the posts, all in
 * one transaction: a second run finds nothing waiting.  The same run
 * drops the subscribe requests that expired unconfirmed, each logged.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "list.h"
#include "message/header.h"
#include "runtime/stage.h"

/*
 * The accepted post's one call before its commit (pepsi.list_fanout_post):
 * its copy for the next digest when the list has digest members
 * (list_digest_add, keyed by the row, so a fan-out that runs again copies
 * nothing twice), the archive's copy (archive_post, once) and the
 * subscribers' groups (list_fanout), which it returns; NULL on an error.
 */
json_t *
list_fanout_call(struct pepsi_ctx *ctx, const char *list_id, const char *next)
{
	static const char *const fields[] = {"Subject", "From", "Date", "Message-ID", "Content-Type"};
	const struct buf		*headers = pepsi_headers(ctx);
	char					*values[5];
	char					 row[32];
	const char				*params[8] = {list_id, row, next};
	json_t					*done;
	json_t					*groups = NULL;

	snprintf(row, sizeof(row), "%lld", pepsi_id(ctx));
	for (size_t i = 0; i < 5; i++)
	{
		values[i] = headers ? header_get(headers->data, headers->len, fields[i]) : NULL;
		params[i + 3] = values[i] ? values[i] + strspn(values[i], " \t") : "";
	}
	done = pepsi_call_json(ctx, "SELECT pepsi.list_fanout_post($1::bigint, $2::bigint, $3, $4, $5, $6, $7, $8)", 8,
						   params);
	for (size_t i = 0; i < 5; i++)
		free(values[i]);
	if (done == NULL)
		return NULL;
	if (json_is_true(json_object_get(done, "kept")))
		log_info("%s: row %lld: list %s: the post is kept for the next digest", pepsi_queue_id(ctx), pepsi_id(ctx),
				 list_id);
	if (json_integer_value(json_object_get(done, "archived")) > 0)
		log_info("%s: row %lld: list %s: archived as message %lld", pepsi_queue_id(ctx), pepsi_id(ctx), list_id,
				 (long long) json_integer_value(json_object_get(done, "archived")));
	groups = json_incref(json_object_get(done, "groups"));
	json_decref(done);
	return groups;
}

int
list_digest_run(struct pepsi_ctx *ctx)
{
	const char *next = pepsi_option_text(ctx, "NEXT_STAGE");
	const char *address = pepsi_rcpt(ctx, 0);
	const char *values[2] = {address, next};
	json_t	   *sent;
	json_t	   *expired;

	sent = pepsi_call_json(ctx,
						   "SELECT CASE WHEN r IS NULL THEN jsonb_build_object('missing', true)"
						   " ELSE pepsi.list_digest_send((r ->> 'id')::bigint, $2) END FROM pepsi.list_resolve($1) r",
						   2, values);
	if (sent == NULL)
		return -1;
	if (json_is_true(json_object_get(sent, "missing")))
		log_warnx("%s: row %lld: a digest for <%s>, which is no list: nothing sent", pepsi_queue_id(ctx),
				  pepsi_id(ctx), address);
	else if (json_integer_value(json_object_get(sent, "posts")) == 0)
		log_info("%s: row %lld: <%s>: no post since the last digest: none sent", pepsi_queue_id(ctx), pepsi_id(ctx),
				 address);
	else
		log_info("%s: row %lld: <%s>: digest issue %lld of %lld post(s) goes out on %lld row(s)", pepsi_queue_id(ctx),
				 pepsi_id(ctx), address, (long long) json_integer_value(json_object_get(sent, "issue")),
				 (long long) json_integer_value(json_object_get(sent, "posts")),
				 (long long) json_integer_value(json_object_get(sent, "rows")));
	json_decref(sent);
	expired = pepsi_call_json(ctx, "SELECT to_jsonb(pepsi.list_pending_expire())", 0, NULL);
	if (expired == NULL)
		return -1;
	if (json_integer_value(expired) > 0)
		log_info("%s: row %lld: %lld request(s) expired unconfirmed: dropped", pepsi_queue_id(ctx), pepsi_id(ctx),
				 (long long) json_integer_value(expired));
	json_decref(expired);
	return pepsi_finish(ctx);
}
