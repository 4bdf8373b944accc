/*
 * pgconn.h: one non-blocking libpq connection driven by a libev loop, the
 * machine every daemon's database connection is (the dispatcher's, ingress's
 * admission pool and its local-recipient refresher).  It connects, lets its
 * owner run set-up statements, then runs one statement or one pipeline at
 * a time; a lost connection comes back with jittered backoff and one log
 * line naming the server and the reason.  The owner is told what happens
 * through struct pgconn_handlers and sends through the pgconn_send* calls.
 */
#ifndef PEPSI_PGCONN_H
#define PEPSI_PGCONN_H

#include <ev.h>
#include <libpq-fe.h>
#include <stdbool.h>

#include "config/config.h"

enum pgconn_state
{
	PGCONN_DOWN,	   /* no connection: the reconnect timer runs */
	PGCONN_CONNECTING, /* PQconnectPoll until CONNECTION_OK */
	PGCONN_SETUP,	   /* connected: the owner's set-up statements run */
	PGCONN_IDLE,	   /* set up, nothing in flight */
	PGCONN_BUSY,	   /* a statement, or a pipeline up to its Sync, is in flight */
	PGCONN_CLOSED	   /* pgconn_close or pgconn_detach: never again */
};

struct pgconn;

/*
 * What the owner is told.  Every handler may be NULL but result.  Sends
 * (pgconn_send*) are allowed in setup, done and ready, and from outside
 * the handlers while the connection is idle; never in result.
 */
struct pgconn_handlers
{
	/* Connected: send the first set-up statement, or nothing (set up at once). */
	void (*setup)(struct pgconn *c);
	/*
	 * Each statement's result, in order: item counts the statements sent
	 * since the connection was last idle (a pipeline's calls); item ==
	 * the number of statements is the pipeline's commit failing at its
	 * Sync.  A statement of several commands gives its first error, else
	 * its last result.  The result is freed when this returns.
	 */
	void (*result)(struct pgconn *c, int item, PGresult *res);
	/*
	 * Everything sent is answered.  During set-up, sending nothing more
	 * here ends it (ready follows).
	 */
	void (*done)(struct pgconn *c);
	/* Idle: set up, or done with nothing sent after it.  Send work here. */
	void (*ready)(struct pgconn *c);
	void (*notify)(struct pgconn *c, const PGnotify *notify);
	/*
	 * The connection is gone (or never came): what was in flight is lost,
	 * whether or not the server ran it.  Called before the reconnect is
	 * scheduled; it may call pgconn_close.
	 */
	void (*lost)(struct pgconn *c, const char *reason);
};

struct pgconn_options
{
	/* The conninfo is db_conninfo(cfg, section, option): [section] option, else [database] CONNINFO. */
	const struct pepsi_config *cfg;
	const char				  *section;
	const char				  *option;
	const char				  *application_name;
	const char				  *name;	 /* how the log lines name the connection */
	bool					   pipeline; /* libpq pipeline mode: sends go out at pgconn_sync */
	/*
	 * A standby will do (a reader).  Otherwise a session on a standby is
	 * dropped at connect, and a write refused as read-only (SQLSTATE
	 * 25006, the primary moved) drops the connection as lost.
	 */
	bool   may_be_standby;
	double backoff_min; /* seconds; 0.1 when 0 */
	double backoff_max; /* seconds; 30 when 0 (and at most a tenth of the outage so far) */
	void  *arg;			/* the owner's, for pgconn_arg */
};

/* A connection that starts connecting at once (the options' strings are copied). */
struct pgconn *pgconn_start(struct ev_loop *loop, const struct pgconn_options *options,
							const struct pgconn_handlers *handlers);
/* Stop for good, dropping the connection: no handler is called again. */
void pgconn_close(struct pgconn *c);
void pgconn_free(struct pgconn *c);
/*
 * Shutdown: wait for what is in flight (its result and done handlers run),
 * then hand the connection over blocking and out of pipeline mode; NULL
 * (and closed) if it is not set up.  The caller PQfinishes it.
 */
PGconn *pgconn_detach(struct pgconn *c);
/* Drop the connection (set-up refused, say) and reconnect after the backoff. */
void pgconn_reset(struct pgconn *c, const char *reason);

enum pgconn_state pgconn_state(const struct pgconn *c);
/* Set up, idle or busy: statements may be sent or are in flight. */
bool		pgconn_is_up(const struct pgconn *c);
PGconn	   *pgconn_conn(const struct pgconn *c);
void	   *pgconn_arg(const struct pgconn *c);
const char *pgconn_name(const struct pgconn *c);
/* The wait before the next attempt, as last drawn (0 once set up). */
double pgconn_backoff(const struct pgconn *c);

/*
 * Send a statement with text parameters (lengths and formats may be NULL
 * for text; results in text).  Without parameters and out of pipeline
 * mode, sql may hold several commands.  Out of pipeline mode one
 * statement is in flight at a time and goes out at once; in pipeline mode
 * statements queue up until pgconn_sync.  False if it could not be sent:
 * the connection is then dropped (the lost handler has run).
 */
bool pgconn_send(struct pgconn *c, const char *sql, int nparams, const char *const *values,
				 const int *lengths, const int *formats);
bool pgconn_send_prepared(struct pgconn *c, const char *name, int nparams, const char *const *values,
						  const int *lengths, const int *formats);
bool pgconn_send_prepare(struct pgconn *c, const char *name, const char *sql, int nparams);
/* Pipeline mode: end the pipeline with a Sync (one transaction) and send it. */
bool pgconn_sync(struct pgconn *c);
/*
 * Pipeline mode: send the statements queued so far without a Sync, so that
 * the server runs them while the pipeline stays open (its transaction
 * uncommitted); more may follow, and pgconn_sync ends it.  False if the
 * connection was dropped.
 */
bool pgconn_push(struct pgconn *c);

#endif
