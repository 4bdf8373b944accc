/*
 * delivery.h: the outcomes shared by the delivery stages (relay-to-smarthost,
 * relay-to-maildir); docs/architecture.md 3.2 and 2.4.
 *
 * A delivery stage handles one recipient per row (it splits first) and
 * ends every attempt in one of three ways:
 *   delivered  state.delivery records how; complete_success (a success DSN
 *              when asked for and ORIGINATE_SUCCESS_DSN), else advance or finish;
 *   deferred   pause with exponential backoff (state.attempts,
 *              state.last_error), one delay DSN clone once the message is
 *              DELAY_DSN_AFTER old, about every recipient whose NOTIFY asks
 *              for DELAY (state.delay_sent); past MAX_LIFETIME it bounces
 *              instead.  Recipients deferred beside delivered ones and
 *              split off for their retry (delivery_each) get theirs too;
 *   bounced    reroute to BOUNCE_STAGE with state.bounce; a message from
 *              the null sender is finished with a log line instead.
 *
 * Options of the stage's section (schema/options.def): MAX_LIFETIME,
 * ORIGINATE_SUCCESS_DSN (read by the runtime's complete_success) and
 * BOUNCE_STAGE, which every stage has, and RETRY_BASE, RETRY_MAX and
 * DELAY_DSN_AFTER, which a program using delivery_deferred declares.
 */
#ifndef PEPSI_DELIVERY_H
#define PEPSI_DELIVERY_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#include "config/config.h"
#include "runtime/stage.h"

/* Why one recipient's delivery did not happen (or, for success, how it did). */
struct delivery_report
{
	const char *status;		/* enhanced status code: "5.1.1" */
	const char *diagnostic; /* a Diagnostic-Code: "smtp; 550 5.1.1 ..." or "X-Pepsi; ..." */
	const char *remote_mta; /* the next hop's name, NULL for local delivery */
	int			smtp_code;	/* 0 when there was no reply */
	const char *phase;		/* "RCPT TO", "end of DATA", ... or NULL */
	const char *reply_text; /* the reply's text, or NULL */
	/* for the delivery log line (maillog.h) */
	const char *relay; /* "host[address]:port", "local", or NULL when none was reached */
	const char *tls;   /* the session's TLS, or NULL in clear */
	/* the TLS policy's outcome (tls_policy.h: "dane verified", ...) and its RFC 8460 result type, or NULL */
	const char *tls_policy;
	const char *tls_result;
	double		connect_seconds;  /* reaching the next hop (0 when the session was reused) */
	double		transfer_seconds; /* handing the message over */
};

/*
 * Delivered to the row's recipient.  action is "delivered" or "relayed"
 * (RFC 3464); next_hop_notifies says the next hop took the DSN request
 * itself, so no success DSN is originated here.
 */
int delivery_succeeded(struct pepsi_ctx *ctx, const char *action,
					   const struct delivery_report *how, bool next_hop_notifies);
/* A temporary failure: pause with backoff, a delay DSN, or past MAX_LIFETIME a bounce. */
int delivery_deferred(struct pepsi_ctx *ctx, const struct delivery_report *why);
/* A permanent failure: to BOUNCE_STAGE with state.bounce. */
int delivery_bounced(struct pepsi_ctx *ctx, const struct delivery_report *why);

/*
 * state.bounce for the row's first recipient (one per row in a delivery
 * stage): kind "permanent", "delay" or "success", and the report.  For a
 * stage that sends a failed part on to BOUNCE_STAGE as a sibling of its own.
 */
json_t *delivery_bounce_json(struct pepsi_ctx *ctx, const char *kind, const struct delivery_report *r);

/*
 * Not to be tried now, through no fault of the message (its destination
 * is backing off, at its concurrency or rate limit): paused for seconds
 * without counting an attempt; past MAX_LIFETIME it bounces as deferred
 * mail does.
 */
int delivery_postponed(struct pepsi_ctx *ctx, const struct delivery_report *why, double seconds);

/* How one recipient of a transaction fared. */
enum delivery_class
{
	DELIVERY_SENT,
	DELIVERY_DEFERRED,
	DELIVERY_BOUNCED
};
struct delivery_outcome
{
	enum delivery_class class;
	struct delivery_report report;
};

/*
 * The outcomes of a transaction to all the row's recipients (outcomes[i]
 * for recipient i), each as the functions above would conclude a row of
 * its own: the row keeps the delivered recipients (else the deferred, else
 * one bounced) and is concluded so; the deferred others are split off
 * paused for their retry, each bounced other onto its own row at
 * BOUNCE_STAGE with its state.bounce.  One log line per recipient.
 */
int delivery_each(struct pepsi_ctx *ctx, const struct delivery_outcome *outcomes,
				  const char *action, bool next_hop_notifies);

struct smtp_result;
struct smtp_reply;
/*
 * The report of an SMTP attempt (common/smtp/smtp_client.h): reply is the one
 * that decided (a recipient's RCPT reply, or its LMTP reply after the
 * message), NULL for the result's own.
 * status and diagnostic hold the strings the report points to.
 */
void delivery_report_from_smtp(const struct smtp_result *r, const struct smtp_reply *reply,
							   struct delivery_report *report, char *status, size_t status_len,
							   struct buf *diagnostic);

struct smtp_envelope;
/*
 * The SMTP envelope of the row's first n recipients: sender, recipients
 * with their NOTIFY and ORCPT, RET and ENVID, and BODY/SMTPUTF8 as
 * ingress recorded them.  rcpt, notify and orcpt are the caller's arrays
 * of n; the strings are the row's.
 */
void delivery_envelope(const struct pepsi_ctx *ctx, size_t n, const char **rcpt,
					   const char **notify, const char **orcpt, struct smtp_envelope *env);

/* The NOTIFY of recipient index (state.dsn.rcpt), or NULL when none was given. */
const char *delivery_notify(const struct pepsi_ctx *ctx, size_t index);
/* Does a NOTIFY value (NULL: none given) ask for this kind: "SUCCESS", "DELAY", "FAILURE"? */
bool delivery_notify_wants(const char *notify, const char *kind);
/* state.dsn.<key> (ret, envid), any case, or NULL. */
const char *delivery_dsn_param(const struct pepsi_ctx *ctx, const char *key);
const char *delivery_orcpt(const struct pepsi_ctx *ctx, size_t index);
/* The row's state.dsn.rcpt (borrowed), or NULL. */
json_t *delivery_dsn_rcpts(const struct pepsi_ctx *ctx);
/* NOTIFY and ORCPT of recipient index in a state.dsn.rcpt array of a row of count recipients. */
const char *delivery_notify_in(json_t *rcpts, size_t count, size_t index);
const char *delivery_orcpt_in(json_t *rcpts, size_t count, size_t index);

/* The age of the message in seconds (from received_at, or state.created_at of a DSN), or -1. */
double delivery_message_age(struct pepsi_ctx *ctx);

#endif
