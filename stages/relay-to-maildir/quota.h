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

/* The use the maildir writer reported for a delivery (its reply's " quota=B/MB,C/MC"). */
struct maildir_quota_use
{
	long long bytes, max_bytes, messages, max_messages;
	bool	  delivered;
};

/* A delivery to record: what the writer reported, and (set by maildir_quota_record) the threshold to warn of. */
struct maildir_quota_item
{
	struct pepsi_ctx		*ctx;
	const char				*rcpt;
	struct maildir_quota_use use;
	bool					 recorded;
	int						 percent;
};

/*
 * The limits of rcpts[0..n) with one statement: a JSON array, one
 * {limits, daily} a recipient, in order (a new reference), or NULL when
 * the database could not answer (logged: the caller retries the rows).
 */
json_t *maildir_quota_lookup(struct pepsi_ctx *ctx, const char *const *rcpts, size_t n);
/*
 * One recipient's answer of maildir_quota_lookup: its limits as a
 * "quota" line added to request (none: the writer's QUOTA or
 * maildirsize), or false with the refusal's sentence in why when the
 * daily limit is reached (the writer is not asked).
 */
bool maildir_quota_apply(const json_t *answer, const char *rcpt, struct buf *request, char *why, size_t whylen);
/*
 * The writer's reply (status, text): its trailing " quota=..." is taken
 * off text into use.  True when it is a use to record (a delivery, or a
 * refusal over quota).
 */
bool maildir_quota_parse(const char *status, char *text, struct maildir_quota_use *use);
/*
 * Record items[0..n) with one statement (pepsi.quota_record_many, the
 * owners' QUOTA_WARNING read with one more): each item's recorded and
 * percent.  Logged when it cannot; never fails a message.
 */
void maildir_quota_record(struct maildir_quota_item *items, size_t n);
/* The owner's warning, when the item's recording crossed a QUOTA_WARNING threshold. */
void maildir_quota_warn_after(struct pepsi_ctx *ctx, const struct maildir_quota_item *item);

/*
 * After the writer's reply for one row: parse, record and warn (the
 * three above).  Never fails the message: a delivery made stays made.
 */
void maildir_quota_after(struct pepsi_ctx *ctx, const char *rcpt, const char *status, char *text);

#endif
