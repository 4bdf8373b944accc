/*
 * payment.h: the secretary's paid alternative to confirmation
 * (pepsi-stage-check-whitelist(8), SECRETARY_PAYMENT).
 */
#ifndef PEPSI_SECRETARY_PAYMENT_H
#define PEPSI_SECRETARY_PAYMENT_H

#include <stdbool.h>

#include "base/buf.h"
#include "runtime/stage.h"

/*
 * When owner offers one (SECRETARY_PAYMENT, SECRETARY_PRICE: theirs or the
 * configuration's), the payment request of challenge, whose order
 * reference is reference (pepsi.secretary_decide's "reference"): its
 * fields (Payment-Request: URI of the order pepsi-ID-REFERENCE,
 * Payment-Amount: PRICE) appended to fields, a paragraph saying so to
 * text.  Nothing when owner offers none, or reference is not one.
 */
void secretary_payment_offer(struct pepsi_ctx *ctx, const char *owner, long long challenge, const char *reference,
							 struct buf *fields, struct buf *text);

/*
 * Is the row a proof of payment (Payment-Proof: URI PROOF) of one of
 * owner's challenges?  1: it was, and the held mail is released (or was
 * already): the row is done with; 0: it is none, or not a valid one, or
 * names no open challenge of owner's, or not its order reference (then not
 * judged at all: PAYMENT_VERIFY_COMMAND is not run), or
 * PAYMENT_VERIFY_COMMAND could not say (logged; the challenge stays
 * open): decide on it as on any mail; -1: an error (the message fails).
 */
int secretary_payment_proof(struct pepsi_ctx *ctx, const struct buf *headers, const char *owner);

#endif
