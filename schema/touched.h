/*
 * touched.h: which columns a transition rewrites, as bits.
 *
 * Shared by the stage runtime (common/stage*.c, which records what a stage
 * changed) and the extension (extension/src/transition.c, which keys its
 * plan cache on the same bits), so the two can never number them apart.
 * Plain C with no includes: the extension includes it beside postgres.h.
 */
#ifndef PEPSI_TOUCHED_H
#define PEPSI_TOUCHED_H

#define TOUCHED_HEADERS 0x01
#define TOUCHED_BODY 0x02
#define TOUCHED_MAIL_FROM 0x04
#define TOUCHED_RCPT_TO 0x08
#define TOUCHED_MERGE_STATE 0x10  /* state || merge */
#define TOUCHED_SET_STATE 0x20	  /* state replaced whole */
#define TOUCHED_AT_STAGE 0x40	  /* a pause or failure parked at another stage */
#define TOUCHED_COMBINATIONS 0x80 /* one past the largest combination */

#endif
