/*
 * dbconn.c: the dispatcher's one database connection and what it runs.
 *
 * The connection itself is common/runtime/pgconn.c's machine.  Here are its jobs:
 * after connecting, a short chain of set-up statements, each its own step:
 * the one-dispatcher lock, LISTEN on pepsi_workqueue (work to claim) and
 * pepsi_config_changed (reload), the claim prepared, orphaned rows reset,
 * and on the first connection the configuration overrides.  Once set up it
 * runs one statement at a time from a small job queue (the dispatcher's
 * own recovery writes and statistics, dbwrites.c; the override reload),
 * and in between sends the claim (claim.c).
 *
 * If the server goes away, rows stay safe where they are: workers commit
 * through their own connections, and the writes queued here wait.  Since
 * a claim in flight at the loss may have set rows running that no worker
 * got, set-up puts every running row not in flight back to pending.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "dispatch.h"
#include "runtime/db.h"
#include "runtime/pgconn.h"

/*
 * Advisory lock keys ('PEPS', 2): one dispatcher per database (db.h).  The
 * other keys of ('PEPS', n) are the maintenance worker's (1, maint.c) and
 * the queue gauges' refresh (3, pepsi--0.1--0.2.sql).
 */
#define DBCONN_LOCK_SQL "SELECT pg_try_advisory_lock(" PEPSI_LOCK_CLASS ", " PEPSI_LOCK_DISPATCH "), NULL::text"
/*
 * A dispatcher of a stage set ([dispatch] STAGES) holds the same lock in
 * its shared mode (so it conflicts with one serving every stage, and the
 * extension's recovery functions know it for a dispatcher) and one lock
 * per stage of its set (so two sets that overlap conflict).  The second
 * column names the stages another dispatcher holds.  A standby
 * ([dispatch] STANDBY) waits for the same locks, in the stages' order,
 * and takes over when their holder's session ends.
 */
#define DBCONN_LOCK_SET_SQL                                                              \
	"SELECT pg_try_advisory_lock_shared(" PEPSI_LOCK_CLASS ", " PEPSI_LOCK_DISPATCH ")," \
	" (SELECT string_agg(s, ', ' ORDER BY s) FROM unnest($1::text[]) s"                  \
	"   WHERE NOT pg_try_advisory_lock(" PEPSI_LOCK_STAGE_CLASS ", hashtext(s)))"
#define DBCONN_WAIT_LOCK_SQL \
	"SELECT count(pg_advisory_lock(" PEPSI_LOCK_CLASS ", " PEPSI_LOCK_DISPATCH ")) = 1, NULL::text"
#define DBCONN_WAIT_LOCK_SET_SQL                                                                    \
	"SELECT (SELECT count(pg_advisory_lock_shared(" PEPSI_LOCK_CLASS ", " PEPSI_LOCK_DISPATCH ")))" \
	"   + (SELECT count(pg_advisory_lock(" PEPSI_LOCK_STAGE_CLASS ", hashtext(s)))"                 \
	"      FROM (SELECT s FROM unnest($1::text[]) s ORDER BY s) ordered) > 0, NULL::text"
/*
 * The dispatcher's own commits do not wait for the WAL flush: none of its
 * writes needs to outlive a crash of the server.  A claim lost with it
 * leaves rows pending; a lost recovery write leaves a row running, which
 * the next set-up puts back to pending (reset_orphans), so the row is
 * tried again; statistics are statistics.  And a worker's commit flushes
 * the WAL before it, so a row a worker concluded was claimed durably.
 * What it saves is a flush per claim, which a claim otherwise waits for
 * with every worker's answer piling up behind it.
 */
#define DBCONN_LISTEN_SQL "SET synchronous_commit = off;"                         \
						  " LISTEN pepsi_workqueue; LISTEN pepsi_config_changed;" \
						  " UPDATE pepsi.dispatch_stats SET started_at = now()"
/*
 * Running rows no worker of ours holds go back to pending; the log names
 * the first few by queue id and row (read in the statement's snapshot,
 * through the index that holds running rows, as the reset's own scan).
 */
#define DBCONN_ORPHANS_NAMED 20
#define DBCONN_RESET_ORPHANS_SQL                                                             \
	"WITH orphan AS MATERIALIZED ("                                                          \
	"  SELECT id, coalesce(state ->> 'queue_id', id::text) AS queue_id FROM pepsi.workqueue" \
	"  WHERE index_status = 'pending' AND status = 'running'"                                \
	"    AND ($1::int8[] IS NULL OR id <> ALL ($1::int8[]))"                                 \
	"    AND ($2::text[] IS NULL OR stage = ANY ($2::text[]))"                               \
	"  ORDER BY id LIMIT 20)" /* DBCONN_ORPHANS_NAMED */                                     \
	" SELECT CASE WHEN $2::text[] IS NULL THEN pepsi.workqueue_reset_orphans($1::int8[])"    \
	"  ELSE pepsi.workqueue_reset_orphans($1::int8[], $2::text[]) END,"                      \
	"  (SELECT string_agg(queue_id || ' (row ' || id || ')', ', ' ORDER BY id) FROM orphan)"
#define DBCONN_BACKOFF_MIN 0.1
#define DBCONN_BACKOFF_MAX 30.0

/* What the statement in flight is: a set-up step, a job, the claim; or nothing. */
enum dbconn_step
{
	DBCONN_LOCKING,			  /* set-up: the one-dispatcher advisory lock */
	DBCONN_LISTENING,		  /* set-up: asynchronous commits, LISTEN, started_at */
	DBCONN_PREPARING,		  /* set-up: the claim statement */
	DBCONN_RESETTING,		  /* set-up: running rows no worker holds back to pending */
	DBCONN_LOADING_OVERRIDES, /* set-up, first connection only: pepsi.config_override */
	DBCONN_WAITING,			  /* nothing in flight (idle, or no connection) */
	DBCONN_RUNNING_JOB,		  /* a queued job's statement */
	DBCONN_CLAIMING			  /* the claim */
};

static struct
{
	struct pgconn	*conn;
	enum dbconn_step step;
	bool			 step_ok; /* the set-up statement in flight succeeded */
	struct job		*jobs_head;
	struct job		*jobs_tail;
	struct job		*running_job; /* in DBCONN_RUNNING_JOB */
	bool			 ever_ready;  /* a reconnect, not the first connection */
	double			 lock_wait_started;
} db;

static const char *
dbconn_step_name(enum dbconn_step step)
{
	switch (step)
	{
		case DBCONN_LOCKING:
			return "taking the dispatcher lock";
		case DBCONN_LISTENING:
			return "listening";
		case DBCONN_PREPARING:
			return "preparing the claim";
		case DBCONN_RESETTING:
			return "resetting orphaned rows";
		case DBCONN_LOADING_OVERRIDES:
			return "loading the configuration overrides";
		case DBCONN_WAITING:
			return "waiting";
		case DBCONN_RUNNING_JOB:
			return "running a statement";
		case DBCONN_CLAIMING:
			return "claiming";
	}
	return "?";
}

static void
dbconn_enter(enum dbconn_step step)
{
	log_debug("database connection: %s -> %s", dbconn_step_name(db.step), dbconn_step_name(step));
	db.step = step;
}

/* Set up and nothing in flight: a job or the claim may be sent. */
bool
dbconn_idle(void)
{
	return db.conn && pgconn_state(db.conn) == PGCONN_IDLE;
}

PGconn *
dbconn_pq(void)
{
	return db.conn ? pgconn_conn(db.conn) : NULL;
}

/* ---------------------------------------------------------------------------
 * Jobs
 * ------------------------------------------------------------------------- */

struct job *
job_new(const char *sql, void (*done)(struct job *, PGresult *))
{
	struct job *job = xcalloc(1, sizeof(*job));

	job->sql = xstrdup(sql);
	job->done = done;
	return job;
}

void
job_param(struct job *job, const char *value)
{
	job->params[job->nparams++] = value ? xstrdup(value) : NULL;
}

static void
job_free(struct job *job)
{
	for (int i = 0; i < job->nparams; i++)
		free(job->params[i]);
	free(job->sql);
	buf_free(&job->recovering);
	free(job);
}

void
job_push(struct job *job, bool front)
{
	if (front)
	{
		job->next = db.jobs_head;
		db.jobs_head = job;
		if (db.jobs_tail == NULL)
			db.jobs_tail = job;
	}
	else
	{
		job->next = NULL;
		if (db.jobs_tail)
			db.jobs_tail->next = job;
		else
			db.jobs_head = job;
		db.jobs_tail = job;
	}
	if (dbconn_idle())
		dbconn_send_work();
}

static struct job *
job_pop(void)
{
	struct job *job = db.jobs_head;

	if (job)
	{
		db.jobs_head = job->next;
		if (db.jobs_head == NULL)
			db.jobs_tail = NULL;
	}
	return job;
}

static void
submitted_done(struct job *job, PGresult *res)
{
	job->submitted(res, job->submitted_arg);
}

/*
 * Run sql (no parameters) in turn with the dispatcher's other statements
 * and hand its result to done.  A statement in flight when the connection
 * is lost is sent again: it must be safe to repeat.
 */
void
dbconn_submit(const char *sql, dbconn_result_fn done, void *arg)
{
	struct job *job = job_new(sql, submitted_done);

	job->submitted = done;
	job->submitted_arg = arg;
	job_push(job, false);
}

/* Send the next job, or else the claim, if there is one. */
void
dbconn_send_work(void)
{
	struct job *job;

	if (!dbconn_idle())
		return;
	if ((job = job_pop()) != NULL)
	{
		/* Set first: a failed send drops the connection, and lost requeues it. */
		db.running_job = job;
		dbconn_enter(DBCONN_RUNNING_JOB);
		pgconn_send(db.conn, job->sql, job->nparams, (const char *const *) job->params, NULL, NULL);
		return;
	}
	claim_send_if_due();
}

/* claim.c: the claim goes out now (step set before, for a send that fails). */
bool
dbconn_send_claim(int nparams, const char *const *values)
{
	dbconn_enter(DBCONN_CLAIMING);
	return pgconn_send_prepared(db.conn, DBCONN_CLAIM_NAME, nparams, values, NULL, NULL);
}

/* ---------------------------------------------------------------------------
 * Set-up: one statement per step, each sent when the previous one is done
 * ------------------------------------------------------------------------- */

/* The ids no running row may be reset from: held by a worker, or being recovered. */
static void
dbconn_inflight_ids(struct buf *ids)
{
	size_t count = 0;

	buf_append_char(ids, '{');
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct pool_worker *w = p->workers; w; w = w->next)
			for (int i = 0; i < w->count; i++)
				buf_printf(ids, "%s%lld", count++ ? "," : "", w->queue[(w->head + i) % w->ring].id);
	for (struct job *job = db.jobs_head; job; job = job->next)
		if (job->recovering.len > 0)
			buf_printf(ids, "%s%s", count++ ? "," : "", job->recovering.data);
	buf_append_char(ids, '}');
}

/* Send the statement of the set-up step we enter. */
static void
dbconn_send_setup(enum dbconn_step next)
{
	dbconn_enter(next);
	db.step_ok = false;
	switch (next)
	{
		case DBCONN_LOCKING:
			{
				const char *values[1] = {dispatcher.stage_set};

				if (dispatcher.standby)
					log_info("standby: waiting for the dispatcher lock of %s; taking over when the active "
							 "dispatcher's session ends",
							 dispatcher.stage_set_names);
				db.lock_wait_started = now_seconds();
				if (dispatcher.stage_set)
					pgconn_send(db.conn, dispatcher.standby ? DBCONN_WAIT_LOCK_SET_SQL : DBCONN_LOCK_SET_SQL, 1,
								values, NULL, NULL);
				else
					pgconn_send(db.conn, dispatcher.standby ? DBCONN_WAIT_LOCK_SQL : DBCONN_LOCK_SQL, 0, NULL,
								NULL, NULL);
				break;
			}
		case DBCONN_LISTENING:
			pgconn_send(db.conn, DBCONN_LISTEN_SQL, 0, NULL, NULL, NULL);
			break;
		case DBCONN_PREPARING:
			/* The claim is sent on every wake: parse and plan it once. */
			pgconn_send_prepare(db.conn, DBCONN_CLAIM_NAME, DBCONN_CLAIM_SQL, 7);
			break;
		case DBCONN_RESETTING:
			{
				/*
				 * Running rows that no worker of ours holds are orphans:
				 * back to pending.  Rows whose fate we decided while the
				 * connection was down (failed, timeout) are not: their
				 * recovery writes are still queued.
				 */
				struct buf	ids = BUF_INIT;
				const char *values[2];

				dbconn_inflight_ids(&ids);
				values[0] = ids.data;
				values[1] = dispatcher.stage_set; /* NULL: every stage's */
				pgconn_send(db.conn, DBCONN_RESET_ORPHANS_SQL, 2, values, NULL, NULL);
				buf_free(&ids);
				break;
			}
		case DBCONN_LOADING_OVERRIDES:
			pgconn_send(db.conn, DBCONN_OVERRIDES_SQL, 0, NULL, NULL, NULL);
			break;
		default:
			fatalx("database connection: no set-up statement for %s", dbconn_step_name(next));
	}
}

static void
dbconn_on_setup(struct pgconn *c)
{
	dbconn_send_setup(DBCONN_LOCKING);
}

/*
 * The lock's answer.  Refused: another dispatcher serves (some of) these
 * stages, and two would claim the same rows.  At start that is a
 * configuration error; after a reconnect, a standby took over while this
 * one's connection was down, and it is the one that stays.  Either way
 * this one exits, before it claims anything, naming the stages.
 */
static void
dbconn_check_lock(PGresult *res)
{
	const char *held = PQgetisnull(res, 0, 1) ? NULL : PQgetvalue(res, 0, 1);

	if (strcmp(PQgetvalue(res, 0, 0), "t") == 0 && held == NULL)
	{
		if (dispatcher.standby)
			log_info("standby: took over %s after %.1f s: the dispatcher that held them is gone",
					 dispatcher.stage_set_names, now_seconds() - db.lock_wait_started);
		return;
	}
	if (held)
		fatalx("another pepsi-dispatch already serves stage%s %s of this one's [dispatch] STAGES "
			   "(%s): refused%s; give each dispatcher its own stages, or set [dispatch] STANDBY = yes "
			   "to wait and take over",
			   strchr(held, ',') ? "s" : "", held, dispatcher.stage_set_names,
			   db.ever_ready ? " (it took over while this one's connection was down)" : "");
	fatalx("another pepsi-dispatch is already running against this database, serving %s of this one's "
		   "stages: refused%s; split the stages between dispatchers with [dispatch] STAGES, or set "
		   "[dispatch] STANDBY = yes to wait and take over",
		   dispatcher.stage_set ? "some" : "all",
		   db.ever_ready ? " (it took over while this one's connection was down)" : "");
}

/* A set-up statement's result: whether set-up may go on (logged if not). */
static bool
dbconn_setup_result(PGresult *res)
{
	ExecStatusType status = PQresultStatus(res);

	switch (db.step)
	{
		case DBCONN_LOCKING:
			if (status != PGRES_TUPLES_OK)
			{
				log_warnx("cannot take the dispatcher lock: %s", db_error(res, dbconn_pq()));
				return false;
			}
			dbconn_check_lock(res);
			return true;
		case DBCONN_LISTENING:
			if (status != PGRES_COMMAND_OK)
				log_warnx("cannot listen for work: %s", db_error(res, dbconn_pq()));
			return status == PGRES_COMMAND_OK;
		case DBCONN_PREPARING:
			if (status != PGRES_COMMAND_OK)
				log_warnx("cannot prepare the claim: %s", db_error(res, dbconn_pq()));
			return status == PGRES_COMMAND_OK;
		case DBCONN_RESETTING:
			if (status != PGRES_TUPLES_OK)
			{
				log_warnx("cannot reset orphaned rows: %s", db_error(res, dbconn_pq()));
				return false;
			}
			if (atoi(PQgetvalue(res, 0, 0)) > 0)
				log_info("put %s orphaned running rows back to pending: %s%s", PQgetvalue(res, 0, 0),
						 PQgetvalue(res, 0, 1),
						 atoi(PQgetvalue(res, 0, 0)) > DBCONN_ORPHANS_NAMED ? ", ..." : "");
			return true;
		case DBCONN_LOADING_OVERRIDES:
			dbconn_apply_overrides(res, true);
			return true;
		default:
			fatalx("database connection: set-up result while %s", dbconn_step_name(db.step));
	}
}

/* The set-up steps are done. */
static void
dbconn_set_up(void)
{
	if (db.ever_ready)
	{
		/*
		 * If the server went away, so did the workers' sessions, and a
		 * worker finds out only when its next load fails, failing the
		 * message.  Replacements start with fresh sessions.
		 */
		log_info("the workers retire so that their replacements connect afresh");
		pools_retire_all();
	}
	db.ever_ready = true;
	dbconn_enter(DBCONN_WAITING);
	maintenance_check_soon();
	claim_after_connect();
}

/* A set-up step is done: the next one, or the end of set-up. */
static void
dbconn_setup_done(void)
{
	if (!db.step_ok)
	{
		pgconn_reset(db.conn, "set-up failed");
		return;
	}
	switch (db.step)
	{
		case DBCONN_LOCKING:
			dbconn_send_setup(DBCONN_LISTENING);
			break;
		case DBCONN_LISTENING:
			dbconn_send_setup(DBCONN_PREPARING);
			break;
		case DBCONN_PREPARING:
			dbconn_send_setup(DBCONN_RESETTING);
			break;
		case DBCONN_RESETTING:
			if (!db.ever_ready)
				dbconn_send_setup(DBCONN_LOADING_OVERRIDES);
			else
				dbconn_set_up();
			break;
		default:
			dbconn_set_up();
			break;
	}
}

/* ---------------------------------------------------------------------------
 * The connection's handlers (pgconn.h)
 * ------------------------------------------------------------------------- */

static void
dbconn_on_result(struct pgconn *c, int item, PGresult *res)
{
	switch (db.step)
	{
		case DBCONN_CLAIMING:
			claim_done(res);
			break;
		case DBCONN_RUNNING_JOB:
			db.running_job->done(db.running_job, res);
			break;
		case DBCONN_WAITING:
			break;
		default:
			db.step_ok = dbconn_setup_result(res);
			break;
	}
}

static void
dbconn_on_done(struct pgconn *c)
{
	switch (db.step)
	{
		case DBCONN_CLAIMING:
			dbconn_enter(DBCONN_WAITING);
			break;
		case DBCONN_RUNNING_JOB:
			job_free(db.running_job);
			db.running_job = NULL;
			dbconn_enter(DBCONN_WAITING);
			break;
		case DBCONN_WAITING:
			break;
		default:
			dbconn_setup_done();
			break;
	}
}

static void
dbconn_on_ready(struct pgconn *c)
{
	dbconn_send_work();
}

static void
dbconn_on_notify(struct pgconn *c, const PGnotify *notify)
{
	if (strcmp(notify->relname, "pepsi_config_changed") == 0)
		dbconn_reload_config();
	else
		dbconn_want_claim(true);
}

/* The connection is gone: pgconn logged it and reconnects. */
static void
dbconn_on_lost(struct pgconn *c, const char *reason)
{
	if (db.running_job)
	{
		/* Its effect is unknown; the writes are safe to repeat, so send it again. */
		job_push(db.running_job, true);
		db.running_job = NULL;
	}
	dbconn_enter(DBCONN_WAITING);
	claim_connection_lost();
	if (dispatcher.shutting_down)
		pgconn_close(c);
}

void
dbconn_start(void)
{
	static const struct pgconn_handlers handlers = {
		.setup = dbconn_on_setup,
		.result = dbconn_on_result,
		.done = dbconn_on_done,
		.ready = dbconn_on_ready,
		.notify = dbconn_on_notify,
		.lost = dbconn_on_lost,
	};
	struct pgconn_options options = {
		.cfg = dispatcher.cfg,
		.section = "database",
		.option = "CONNINFO",
		.application_name = "pepsi-dispatch",
		.name = "pepsi-dispatch",
		.backoff_min = DBCONN_BACKOFF_MIN,
		.backoff_max = DBCONN_BACKOFF_MAX,
	};

	claim_init();
	db.step = DBCONN_WAITING;
	db.conn = pgconn_start(dispatcher.loop, &options, &handlers);
}

/*
 * At shutdown, after the workers are gone: let what is in flight finish
 * (a claim's rows go straight back, claim_done), then run what is queued
 * (the rows they held go back to pending, the last statistics)
 * synchronously.
 */
void
dbconn_finish(void)
{
	PGconn *conn;

	if (!dbconn_idle() && !(db.conn && pgconn_state(db.conn) == PGCONN_BUSY))
	{
		log_warnx("no database connection at shutdown: rows still running are reset when a "
				  "dispatcher next starts");
		pgconn_free(db.conn);
		db.conn = NULL;
		return;
	}
	dbconn_flush_stats(true);
	conn = pgconn_detach(db.conn);
	if (conn == NULL)
		log_warnx("lost the database connection at shutdown: rows still running are reset "
				  "when a dispatcher next starts");
	while (conn && db.jobs_head)
	{
		struct job *job = job_pop();
		PGresult   *res = PQexecParams(conn, job->sql, job->nparams, NULL,
									   (const char *const *) job->params, NULL, NULL, 0);

		job->done(job, res);
		PQclear(res);
		job_free(job);
	}
	PQfinish(conn);
	pgconn_free(db.conn);
	db.conn = NULL;
}
