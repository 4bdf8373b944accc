/*
 * quota.h: pepsi-stage-relay-to-maildir's side of mailbox quotas
 * (pepsi.quota, docs/pepsi-quota.8.md): the limits looked up for the
 * maildir writer's request, the use it reports recorded, and the
 * owner's warning at a threshold.
 */
#ifndef PEPSI_MAILDIR_QUOTA_H
#define PEPSI_MAILDIR_QUOTA_H

#include <stdbool.h>

#include "base/buf.h"
#include "runtime/stage.h"

/*
 * The recipient's limits from the database (address, else domain; none:
 * the writer's QUOTA or maildirsize), as a "quota" line added to request.
 * False, with the refusal's sentence in why, when the daily limit is
 * reached (the writer is not asked); false with why empty when the
 * database could not answer (logged: the caller retries the row).
 */
bool maildir_quota_request(struct pepsi_ctx *ctx, const char *rcpt, struct buf *request, char *why,
						   size_t whylen);

/*
 * After the writer's reply (status, text: its trailing " quota=B/MB,C/MC"
 * is taken off text): the use recorded (pepsi.quota_record) and, when a
 * QUOTA_WARNING threshold was crossed, the warning sent to the owner.
 * Never fails the message: a delivery made stays made.
 */
void maildir_quota_after(struct pepsi_ctx *ctx, const char *rcpt, const char *status, char *text);

#endif
