/*
 * list.h: the parts of pepsi-stage-list (docs/pepsi-stage-list.8.md):
 * list.c finds the list a recipient belongs to and sends each kind of
 * address to its handler, post.c takes a post (policy, moderation,
 * headers, fan-out), request.c the -request/-subscribe/-unsubscribe
 * commands and the -bounces+ DSNs, guard.c the posts held as bad input,
 * wrap.c the DMARC wrap, digest.c the digests.
 */
#ifndef PEPSI_STAGE_LIST_H
#define PEPSI_STAGE_LIST_H

#include <stdbool.h>

#include <jansson.h>

#include "runtime/stage.h"

/* list@domain -> its parts "list" and "domain" (the caller frees both). */
void list_address_split(const char *address, char **local, char **domain);
/* The one address of the From: field, lower case, or NULL. */
char *list_from_address(struct pepsi_ctx *ctx);
/*
 * A notice from the list (from the null sender, From: responder) to
 * recipient, injected at REPLY_STAGE, at most once per (row, key).
 */
bool list_notice(struct pepsi_ctx *ctx, const char *responder, const char *recipient, const char *subject,
				 const char *text, const char *key);

/* A post to the list of resolved (list_resolve's answer): concludes the row. */
int list_post(struct pepsi_ctx *ctx, json_t *resolved);
/* The second pass of an accepted post: one row per subscriber (or domain). */
int list_fan_out(struct pepsi_ctx *ctx, json_t *list_state);
/* A command to -request, -subscribe or -unsubscribe; false when the row must fail. */
bool list_request(struct pepsi_ctx *ctx, json_t *resolved, const char *recipient);
/* A bounce at -bounces(+...); false when the row must fail. */
bool list_bounce(struct pepsi_ctx *ctx, json_t *resolved, const char *recipient);

/* Why an accepted post goes to the moderators instead (too big, broken MIME), or NULL; the caller frees it. */
char *list_post_suspect(struct pepsi_ctx *ctx, json_t *resolved);
/* Wrap the post in a message from list (dmarc_mitigation "wrap"); policy is the author domain's. */
void list_wrap(struct pepsi_ctx *ctx, const char *list, const char *author, const char *display_name,
			   const char *policy);
/*
 * At fan-out, one call: keep the post for list_id's next digest, archive
 * it, and return the subscribers' groups at next (NULL on an error).
 */
json_t *list_fanout_call(struct pepsi_ctx *ctx, const char *list_id, const char *next);
/* A scheduled digest row: send the digest of the list it names, then finish the row. */
int list_digest_run(struct pepsi_ctx *ctx);

#endif
