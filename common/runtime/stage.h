/*
 * stage.h: the stage contract (docs/architecture.md 3), in C.
 *
 * A stage program is a struct pepsi_stage and a main that calls
 * pepsi_worker_main.  The runtime reads workqueue ids from stdin, loads
 * each running row with exactly the columns the stage's load needs, checks
 * that the row's [stage-<name>] PROGRAM is this program, runs the stage,
 * and commits the content it changed together with its one terminal in a
 * single call of the extension, then writes one status line to stdout.
 *
 * Content setters change the in-memory row; terminals record the outcome.
 * Nothing reaches the database until run returns, which is what lets a
 * successor be fused into the same pass and the chain commit once.  The
 * fan-out helpers and enqueue_new are the exception: they write at once.
 */
#ifndef PEPSI_STAGE_H
#define PEPSI_STAGE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "base/buf.h"
#include "config/config.h"

/*
 * Set to "1" in a worker's environment by a dispatcher that reads the
 * status line's "queued" (docs/pepsi-stage.7.md): the runtime then says
 * at which stages each pass left rows pending.
 */
#define STAGE_STATUS_QUEUED_ENV "PEPSI_STATUS_QUEUED"

enum pepsi_load
{
	PEPSI_LOAD_METADATA = 0, /* envelope and state only */
	PEPSI_LOAD_HEADERS = 1,	 /* plus the header block */
	PEPSI_LOAD_FULL = 2		 /* plus the body */
};

struct pepsi_ctx;

struct pepsi_stage
{
	const char	   *program; /* the PROGRAM name of its [stage-*] sections */
	enum pepsi_load load;
	/* Calls exactly one terminal and returns 0; non-zero fails the message. */
	int (*run)(struct pepsi_ctx *ctx);
	/* Optional: may this row run fused into the pass of its predecessor? */
	bool (*can_fuse)(struct pepsi_ctx *ctx);
	/* Optional: check the stage's own options in one of its sections, at start. */
	bool (*check_config)(const struct pepsi_config *cfg, const char *section,
						 char *err, size_t errlen);
	/*
	 * Optional, for a stage that loads headers or the body (a body-free
	 * stage always takes what is waiting): the most ids it takes at once
	 * of those already waiting on its input (0 or 1: one at a time).
	 */
	size_t batch_max;
	/*
	 * Optional: called with the batch's loaded rows before run is called
	 * on each, so that a stage can do their work at once (a delivery
	 * stage: one batch of files and one fsync of their directory, one
	 * session); run then concludes each row as usual.  Only the rows that
	 * loaded, each still at this stage; nothing is committed before run.
	 */
	void (*prepare)(struct pepsi_ctx *const *ctxs, size_t count);
	/*
	 * Optional: may this stage run fused after a predecessor that loaded
	 * less (a body-free route before a relay)?  The columns it lacks are
	 * then loaded in the same pass, one statement for the batch's rows
	 * that go on to it, instead of the row being committed at the
	 * predecessor, claimed again and loaded again (docs/architecture.md
	 * 3.4).  Its can_fuse sees the row as loaded so far: the envelope and
	 * state.  Its prepare is called on the rows of each late load that
	 * switched to it, before their passes go on; with a prepare, the rows
	 * that reach it with nothing left to load meet there too, to be
	 * prepared together rather than run one by one.
	 */
	bool late_load;
	/*
	 * Optional, with can_fuse: a row its can_fuse accepts is only passed
	 * on, and needs nothing but the envelope and state, and none of the
	 * set-id privileges the program may be installed with (dot-forward: a
	 * row none of whose recipients may have a .forward).  Such a row runs
	 * fused after any predecessor, without the columns of load, even in a
	 * worker that lacks the program's set-id bit; the rows can_fuse
	 * refuses are committed for the stage's own workers.
	 */
	bool fuses_passing_on;
	/*
	 * Optional: the section whose CONNINFO the worker connects with,
	 * instead of [database]'s (the crypto stages: [crypto] CONNINFO, a
	 * member of pepsi_crypto over the local socket, even where the
	 * pipeline goes through a pooler).
	 */
	const char *conninfo_section;
};

/* The multi-call binary installs the registry fusion looks successors up in. */
typedef const struct pepsi_stage *(*pepsi_registry_fn)(const char *program);
void pepsi_registry_install(pepsi_registry_fn lookup);
/* Is program a stage of this (multi-call) binary?  False when no registry is installed. */
bool pepsi_registry_has(const char *program);
/*
 * Is program a stage of this binary whose worker takes one id at a time
 * (it loads headers or body, and has no batch_max)?  False when not known.
 */
bool pepsi_registry_one_at_a_time(const char *program);

/* "PROGRAM worker [-c CONFIG] [-v]": the worker loop.  Returns the exit code. */
int pepsi_worker_main(const struct pepsi_stage *stage, int argc, char **argv);

/* The row */
long long pepsi_id(const struct pepsi_ctx *ctx);
/*
 * The message's queue id (common/message/queue_id.h): state.queue_id, shared by
 * every row split from the message; the row id in decimal for a row made
 * without one.  Valid until the row's state changes.
 */
const char *pepsi_queue_id(struct pepsi_ctx *ctx);
/* A new queue id, for a new message this stage makes of the row (a DSN); out has QUEUE_ID_LEN + 1 bytes. */
void pepsi_new_queue_id(struct pepsi_ctx *ctx, char *out);
/* The program of the stage running now (a successor's, when fused): whose service logs its lines. */
const char *pepsi_program(const struct pepsi_ctx *ctx);
const char *pepsi_stage_name(const struct pepsi_ctx *ctx);
/* "stage-" and the stage's name: its section, for the config_*_for getters of config.h. */
const char *pepsi_section(const struct pepsi_ctx *ctx);
const char *pepsi_mail_from(const struct pepsi_ctx *ctx);
/* Seconds since the row's received_at (when the pass loaded it): MAX_LIFETIME. */
double pepsi_message_age(const struct pepsi_ctx *ctx);
/* The row's received_at in microseconds since the epoch: the same on every pass. */
long long pepsi_received_us(const struct pepsi_ctx *ctx);
/*
 * Was this pass sent back by a crash: did a worker die on the row at the
 * stage it is at (state.crash.stage, extension/src/crash.c), so that what
 * that worker did before it died (a file written, say) may be done
 * already?  Not for the rows queued behind it that it never started, nor
 * for those the dispatcher's start-up puts back (workqueue_reset_orphans
 * marks nothing).
 */
bool pepsi_crash_retry(const struct pepsi_ctx *ctx);
/* Seconds since this pass loaded the row: the stage's own time so far. */
double pepsi_pass_seconds(const struct pepsi_ctx *ctx);
/* The columns this pass has loaded so far (a late_load successor's can_fuse: its predecessor's). */
enum pepsi_load pepsi_loaded(const struct pepsi_ctx *ctx);
/*
 * With [pepsi] MAIL_LOG on, a row of pepsi.mail_log (event, detail) written
 * by the very statement that commits this message's outcome (no round trip
 * of its own); with it off, nothing.  detail is borrowed.
 */
void pepsi_mail_log(struct pepsi_ctx *ctx, const char *event, json_t *detail);
/*
 * A delivery attempt's outcome ("sent", "deferred", "bounced", "expired":
 * a string that outlives the pass) and its delay since the message was
 * received, reported on the worker's status line and counted by the
 * dispatcher in pepsi.stage_stats and pepsi.stage_histogram for /metrics.
 */
void		pepsi_report_delivery(struct pepsi_ctx *ctx, const char *status, double delay_seconds);
size_t		pepsi_rcpt_count(const struct pepsi_ctx *ctx);
const char *pepsi_rcpt(const struct pepsi_ctx *ctx, size_t index);
/* The row's state object: borrowed from the context, never NULL, read only. */
json_t *pepsi_state(const struct pepsi_ctx *ctx);
/* These fail (NULL, and the message fails) if the stage under-declared its load. */
const struct buf *pepsi_headers(struct pepsi_ctx *ctx);
const struct buf *pepsi_body(struct pepsi_ctx *ctx);
bool			  pepsi_raw_message(struct pepsi_ctx *ctx, struct buf *out);

/*
 * Options of the current [stage-*] section, with the overlay: the value in
 * force for this row's recipients (their address when the row has one,
 * the domain they all share when they share one, else the global value),
 * so a domain- or address-scoped override applies to a message only when
 * it applies to all its recipients.
 *
 * The typed getters read an option declared in schema/options.def (for
 * every stage, or for this stage's program), whose type, default and range
 * it gives; the value was checked when loaded, so they cannot fail (a
 * missing declaration is fatal).  pepsi_option is the raw string (NULL when
 * unset), for the options of a program the schema does not declare.
 */
const char *pepsi_option(const struct pepsi_ctx *ctx, const char *option);
/* For one recipient (a per-recipient decision of a stage that handles several). */
const char *pepsi_option_for(const struct pepsi_ctx *ctx, const char *option, const char *address);
/* TEXT, PATH, STAGE, DOMAIN, lists: the value or the default (NULL when neither). */
const char *pepsi_option_text(const struct pepsi_ctx *ctx, const char *option);
bool		pepsi_option_bool(const struct pepsi_ctx *ctx, const char *option);
long long	pepsi_option_int(const struct pepsi_ctx *ctx, const char *option);
double		pepsi_option_seconds(const struct pepsi_ctx *ctx, const char *option); /* DURATION */
long long	pepsi_option_size(const struct pepsi_ctx *ctx, const char *option);	   /* bytes */
/* ENUM: the index of the value among its choices ("a|b|c": 0, 1, 2). */
int						   pepsi_option_enum(const struct pepsi_ctx *ctx, const char *option);
const struct pepsi_config *pepsi_config(const struct pepsi_ctx *ctx);
/*
 * The worker's database session, for a stage's calls of the extension's
 * own functions (a relay's destination bookkeeping), in autocommit; never
 * for the queue's rows, which only the terminals write.
 */
PGconn *pepsi_db(const struct pepsi_ctx *ctx);

/*
 * What the stage holds beyond its row for the next one (a relay's
 * destination slot): fn is called once the worker has no row to work on
 * (its input is empty), with the seconds idle so far (0 first), and again
 * each time the milliseconds it returns pass with no input, until it
 * returns -1 (let go: not called again until registered again).  It runs
 * in whatever worker ran the stage, fused or not.  Registering fn again
 * while it is registered changes nothing.
 */
typedef int (*pepsi_idle_fn)(PGconn *conn, double idle_seconds);
void pepsi_when_idle(struct pepsi_ctx *ctx, pepsi_idle_fn fn);

/*
 * Content setters (in memory; committed with the terminal).
 *
 * json_t ownership, here and below: every json_t argument is borrowed (the
 * caller keeps its reference and must still decref it); where a NULL is
 * allowed the comment says so.
 */
void pepsi_set_headers(struct pepsi_ctx *ctx, const char *headers, size_t len);
void pepsi_set_body(struct pepsi_ctx *ctx, const char *body, size_t len);
void pepsi_set_mail_from(struct pepsi_ctx *ctx, const char *mail_from);
void pepsi_set_rcpt_to(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count);
/* merge: borrowed, may be NULL (nothing merged); a non-object is ignored. */
void pepsi_merge_state(struct pepsi_ctx *ctx, json_t *merge);
/* state: borrowed and copied; NULL or a non-object sets the empty object. */
void pepsi_set_state(struct pepsi_ctx *ctx, json_t *state);

/*
 * Terminals: exactly one per message.  They return 0, or -1 on misuse.
 * Every merge is borrowed and may be NULL (as for pepsi_merge_state).
 */
int pepsi_advance(struct pepsi_ctx *ctx);
int pepsi_advance_to(struct pepsi_ctx *ctx, const char *stage);
int pepsi_reroute(struct pepsi_ctx *ctx, const char *stage, json_t *merge);
int pepsi_pause(struct pepsi_ctx *ctx, json_t *merge, double seconds);
/* clones: borrowed (a reference is kept until the commit), may be NULL (none). */
int pepsi_pause_with(struct pepsi_ctx *ctx, json_t *merge, double seconds,
					 const int *keep_indices, size_t nkeep, json_t *clones);
/*
 * Hold the row at this stage until an operator releases it
 * (pepsi.queue_release): paused with no retry time, as pepsi.queue_hold
 * leaves a row.  For what must not go on without a person's decision.
 */
int pepsi_hold(struct pepsi_ctx *ctx, json_t *merge);
/*
 * A hold committed by the stage's own extension call, in the transaction
 * that decided it (the secretary's batch, pepsi.secretary_decide_many):
 * pepsi_hold_args says what that call must check and write, a JSON object
 * {"expected_stage", "at_stage", "claim_token", "merge"} (the row's
 * stage in the database, the stage that holds it when fused there, the
 * claim token, the state merges of the pass so far), a new reference; NULL
 * when the pass changed more than the state or has mail_log events, or
 * already called a terminal: the row is then held through pepsi_hold as
 * usual.  pepsi_held_by_call is then the row's terminal: nothing is left to
 * commit (-1, and the row fails, if the pass changed the row since).
 */
json_t *pepsi_hold_args(struct pepsi_ctx *ctx);
int		pepsi_held_by_call(struct pepsi_ctx *ctx);
int		pepsi_fail(struct pepsi_ctx *ctx, json_t *merge);
int		pepsi_finish(struct pepsi_ctx *ctx);
/* clones: borrowed (a reference is kept until the commit), may be NULL (none). */
int pepsi_finish_with(struct pepsi_ctx *ctx, json_t *clones);
int pepsi_advance_or_finish(struct pepsi_ctx *ctx);
int pepsi_complete_success(struct pepsi_ctx *ctx);
/* state: borrowed, may be NULL (the state is left as it is). */
int pepsi_rewrite_recipients(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count,
							 json_t *state);

/*
 * Fan-out helpers: they write at once (one extension call each), reduce
 * this row's recipients, and leave it to the caller to conclude the row
 * with a terminal.  Recipient indices are 1-based.  They refuse a stage
 * that already rewrote content.  Return the new ids' count, or -1.
 */
int pepsi_split_off_recipients(struct pepsi_ctx *ctx, const int *indices, size_t count,
							   const char *target_stage);
int pepsi_split_to_one_per_row(struct pepsi_ctx *ctx);
/* groups: borrowed, not NULL (a JSON array of groups, as workqueue_split takes). */
int pepsi_fan_out(struct pepsi_ctx *ctx, const int *keep, size_t nkeep, json_t *groups);
/*
 * A brand-new side message at stage (auto-reply, DSN).  state: borrowed, may
 * be NULL (the empty object); token may be NULL.
 */
/*
 * Call a function of the extension that answers with one JSON value (one
 * row, one column), on the worker's session, outside the commit: for a
 * stage that must read or take other rows.  The answer is the caller's to
 * json_decref; NULL (and the message fails) on an error.
 */
json_t *pepsi_call_json(struct pepsi_ctx *ctx, const char *sql, int nparams,
						const char *const *values);
/*
 * pepsi_call_json for a function that only reads (a lookup): it queues
 * nothing, so a fused pass goes on after it, and a failure is not the
 * message's: NULL with why in err, for the caller to decide.
 */
json_t	 *pepsi_read_json(struct pepsi_ctx *ctx, const char *sql, int nparams, const char *const *values,
						  char *err, size_t errlen);
long long pepsi_enqueue_new(struct pepsi_ctx *ctx, const char *stage, const char *mail_from,
							const char *const *rcpt, size_t nrcpt, const char *headers,
							size_t hlen, const char *body, size_t blen, json_t *state,
							const char *token);

/*
 * An automatic reply (RFC 3834, common/message/autoreply.h) from responder to
 * recipient: enqueue_new, but only if responder sent recipient no reply
 * in the last interval seconds, and recorded in the same statement
 * (pepsi.autoreply_due), so two rows racing still send one.  mail_from is
 * the reply's envelope sender (RFC 3834 3.3: the null sender).  Returns
 * the new id, 0 when a reply went within the interval, or -1.
 */
long long pepsi_enqueue_autoreply(struct pepsi_ctx *ctx, const char *responder, double interval,
								  const char *stage, const char *mail_from, const char *recipient,
								  const char *headers, size_t hlen, const char *body, size_t blen,
								  json_t *state, const char *token);

/*
 * For a stage's prepare: one transaction on the worker's session for the
 * calls that follow (pepsi_read_json, pepsi_call_json, pepsi_enqueue_new),
 * until pepsi_batch_end commits it (commit true) or rolls it back.  Both
 * return false (the transaction then rolled back, or never opened) on an
 * error, with why in err.  Nothing of the queue's rows may be left to a
 * terminal in between: the runtime commits those after prepare and run.
 */
bool pepsi_batch_begin(struct pepsi_ctx *ctx, char *err, size_t errlen);
bool pepsi_batch_end(struct pepsi_ctx *ctx, bool commit, char *err, size_t errlen);

/*
 * For a stage's run: what it writes for this message from now on (rows of
 * its own tables, through pepsi_db: a key request, a portal link) stands
 * or falls with the message's outcome.  The first call opens a transaction
 * on the worker's session for those writes; the runtime commits the
 * message's outcome in it as soon as its pass ends, then the transaction.
 * If either fails (the row moved or deleted meanwhile, its claim gone
 * stale, the session lost, a write that failed), all of it is rolled back
 * and the message fails with the reason: nothing is left written for a
 * message whose outcome was not committed.  Later calls for the same
 * message do nothing.  false, with why in err, if the transaction did not
 * open (then nothing is written).
 */
bool pepsi_write_with_outcome(struct pepsi_ctx *ctx, char *err, size_t errlen);

/*
 * The per-address settings of address (pepsi.settings, common/config/settings.h):
 * a JSON object option -> value, a new reference; NULL (and the message
 * fails) when they cannot be read.
 */
json_t *pepsi_address_settings(struct pepsi_ctx *ctx, const char *address);
/*
 * For a stage's prepare: read the settings of every recipient of the
 * rows with one statement, which their pepsi_address_settings calls in
 * this batch then answer from, instead of one round trip each.  If the
 * statement fails, each reads its own as before.
 */
void pepsi_prefetch_address_settings(struct pepsi_ctx *const *ctxs, size_t count);

/* Fail the message with a reason (logged, and on the status line). */
int pepsi_error(struct pepsi_ctx *ctx, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
