/*
 * maillog.h: the delivery log.  One line per delivery attempt, in the
 * shape postmasters grep Postfix's for:
 *
 *   pepsi-stage-relay-to-smarthost[812]: 4711: to=<bob@example.net>,
 *     relay=mx.example.net[192.0.2.25]:25, delay=1.42,
 *     delays=0.91/0.02/0.31/0.18, dsn=2.0.0, status=sent (250 2.0.0 Ok),
 *     tls=TLSv1.3 TLS_AES_256_GCM_SHA384 verified, milter=accept
 *
 * (on one line).  delays= splits delay= as Postfix does: the message's age
 * when this stage's worker took it (time queued and in earlier stages),
 * this worker's own time before it reached the next hop, connecting
 * (greeting, EHLO, STARTTLS, AUTH; 0 for a reused session), and
 * transmission.  status= is sent, deferred, bounced or expired; milter=
 * the verdict of pepsi-stage-milter (state.milter.verdict) when the
 * message went through one.  With
 * [pepsi] LOG_FORMAT = json the same fields are members of the line's
 * JSON object; with [pepsi] MAIL_LOG = yes they are also a pepsi.mail_log
 * row (event "delivery"), written by the statement that commits the
 * outcome.
 */
#ifndef PEPSI_MAILLOG_H
#define PEPSI_MAILLOG_H

#include "delivery/delivery.h"
#include "runtime/stage.h"

/*
 * The line Postfix's qmgr writes when a message enters the queue, under
 * the qmgr tag, by whoever queued it (ingress, a stage making a DSN or a
 * reply, pepsi-sendmail):
 *   4Yj3Rb0Wg1p9000: from=<a@example.org>, size=912, nrcpt=2 (queue active, row 17)
 */
void maillog_queued(const char *queue_id, const char *mail_from, size_t size, size_t nrcpt,
					long long row_id);
/*
 * The line Postfix's pickup writes for a message a local program handed
 * to sendmail, under the pickup tag (pflogsumm counts it as received):
 *   4Yj3Rb0Wg1p9000: uid=1000 from=<alice@example.org>
 */
void maillog_pickup(const char *queue_id, unsigned long uid, const char *mail_from);

/*
 * One line for each recipient of the row.  note: a parenthesised remark
 * after the reply ("attempt 3, next in 600s"), or NULL.
 */
void maillog_delivery(struct pepsi_ctx *ctx, const char *status, const struct delivery_report *r,
					  const char *note);
/* The line of recipient index alone (a transaction whose recipients fared differently). */
void maillog_delivery_recipient(struct pepsi_ctx *ctx, size_t index, const char *status,
								const struct delivery_report *r, const char *note);

#endif
