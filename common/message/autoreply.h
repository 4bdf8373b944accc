/*
 * autoreply.h: the RFC 3834 rules every automatic responder follows
 * (pepsi-stage-vacation; spec 22.1, "the RFC 3834 auto-reply rules"): to
 * whom a reply may never go, and the reply itself.  The once-per-interval
 * memory is the database's (pepsi_enqueue_autoreply, stage.h).
 */
#ifndef PEPSI_AUTOREPLY_H
#define PEPSI_AUTOREPLY_H

#include <stdbool.h>
#include <stddef.h>

#include "base/buf.h"

/*
 * Why no automatic reply may answer this message (RFC 3834 section 2 and
 * 3.1.1): the null sender, the responder's own address, list and system
 * senders (owner-*, *-request, MAILER-DAEMON, ...), Auto-Submitted other
 * than "no", Precedence bulk/list/junk, a mailing list's List-* fields,
 * X-Auto-Response-Suppress, and a message whose To, Cc (Bcc, Resent-*)
 * do not name the responder (a list's copy, an alias's expansion).  False
 * when one may; else true with why.
 */
bool autoreply_refused(const char *headers, size_t hlen, const char *sender,
					   const char *responder, char *why, size_t whylen);

struct autoreply
{
	const char *responder; /* From: the address that was written to */
	const char *recipient; /* To: the original envelope sender */
	const char *subject;   /* NULL: "Auto: " and the original subject */
	const char *text;	   /* the body, UTF-8, any line ends */
	const char *hostname;  /* for Message-ID */
	const char *unique;	   /* makes Message-ID unique: row id and recipient index */
};

/*
 * The reply to the message whose header block is headers: From, To,
 * Subject, Date, Message-ID, In-Reply-To and References (RFC 3834 3.1.5),
 * Auto-Submitted: auto-replied, a text/plain UTF-8 body with CRLF ends.
 */
void autoreply_build(const struct autoreply *reply, const char *headers, size_t hlen,
					 struct buf *out_headers, struct buf *out_body);

#endif
