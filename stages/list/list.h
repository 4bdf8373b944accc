/*
 * list.h: the parts of pepsi-stage-list (docs/pepsi-stage-list.8.md):
 * list.c finds the list a recipient belongs to and sends each kind of
 * address to its handler, post.c takes a post (policy, moderation,
 * headers, fan-out), request.c the -request/-subscribe/-unsubscribe
 * commands and the -bounces+ DSNs.
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

#endif
