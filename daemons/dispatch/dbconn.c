/*
 * dbconn.c: the dispatcher's one database connection.
 *
 * Non-blocking libpq driven by the event loop, as an explicit state
 * machine advanced by dbconn_advance (the way daemons/ingress drives its
 * connections and pg_cron its libpq tasks).  After connecting, a short
 * chain of set-up statements runs, each its own state: the one-dispatcher
 * lock, LISTEN on pepsi_workqueue (work to claim) and pepsi_config_changed
 * (reload), the claim prepared, orphaned rows reset, and on the first
 * connection the configuration overrides.  Once idle it runs one statement
 * at a time from a small job queue (the dispatcher's own recovery writes,
 * statistics, the override reload), and in between sends the claim: one
 * pepsi.workqueue_claim call for every stage with spare capacity, built
 * when it is sent so it sees the capacity of that moment.
 *
 * If the server goes away, rows stay safe where they are: workers commit
 * through their own connections, and the writes queued here wait.  The
 * connection comes back with decorrelated jittered backoff, and since a
 * claim in flight at the loss may have set rows running that no worker
 * got, set-up puts every running row not in flight back to pending.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "db.h"
#include "dispatch.h"
#include "log.h"
#include "xalloc.h"

#define DBCONN_BACKOFF_BASE 0.1
#define DBCONN_BACKOFF_CAP 30.0
/*
 * Advisory lock keys ('PEPS', 2): one dispatcher per database (db.h).  The
 * other keys of ('PEPS', n) are the maintenance worker's (1, maint.c) and
 * the queue gauges' refresh (3, pepsi--0.1--0.2.sql).
 */
#define DBCONN_LOCK_SQL "SELECT pg_try_advisory_lock(" PEPSI_LOCK_CLASS ", " PEPSI_LOCK_DISPATCH ")"
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
#define DBCONN_OVERRIDES_SQL "SELECT scope, section, option, value FROM pepsi.config_override" \
							 " ORDER BY scope, section, option"
/*
 * How long the claim a worker's answer asks for may wait for the answers
 * that follow: one claim then serves them all.  Each claim costs the
 * server milliseconds with many senders, and one per answer kept it
 * claiming without pause under load.
 */
#define DBCONN_CLAIM_COALESCE 0.005
#define DBCONN_CLAIM_NAME "pepsi_dispatch_claim"
#define DBCONN_CLAIM_SQL "SELECT id, stage, sender_key, claim_token FROM pepsi.workqueue_claim_tokens(" \
						 "$1::text[], $2::int[], $3::text[], $4::text[], $5::float8[], $6::int, $7::float8[])"

enum dbconn_state
{
	DBCONN_DOWN,			  /* no connection: the reconnect timer runs */
	DBCONN_CONNECTING,		  /* PQconnectPoll until CONNECTION_OK */
	DBCONN_LOCKING,			  /* set-up: the one-dispatcher advisory lock */
	DBCONN_LISTENING,		  /* set-up: asynchronous commits, LISTEN, started_at */
	DBCONN_PREPARING,		  /* set-up: the claim statement */
	DBCONN_RESETTING,		  /* set-up: running rows no worker holds back to pending */
	DBCONN_LOADING_OVERRIDES, /* set-up, first connection only: pepsi.config_override */
	DBCONN_IDLE,			  /* ready, nothing in flight */
	DBCONN_RUNNING_JOB,		  /* a queued job's statement is in flight */
	DBCONN_CLAIMING,		  /* the claim is in flight */
	DBCONN_CLOSED			  /* shut down */
};

struct job
{
	char *sql;
	int	  nparams;
	char *params[8];
	void (*done)(struct job *job, PGresult *res);
	dbconn_result_fn submitted; /* a statement of another part (dbconn_submit) */
	void			*submitted_arg;
	struct buf		 recovering; /* a recovery write: its ids, comma-separated */
	struct job		*next;
};

static struct
{
	enum dbconn_state state;
	PGconn			 *conn;
	ev_io			  io;
	ev_timer		  reconnect_timer;
	ev_idle			  claim_idle;  /* the claim waits for the loop's other events */
	ev_timer		  claim_timer; /* ... and, unless urgent, for DBCONN_CLAIM_COALESCE */
	double			  backoff;
	struct job		 *jobs_head;
	struct job		 *jobs_tail;
	struct job		 *running_job;	/* in DBCONN_RUNNING_JOB */
	PGresult		 *result;		/* the statement's result so far (its error, if any) */
	bool			  claim_wanted; /* something freed capacity or brought work */
	double			  claim_wanted_since;
	bool			  ever_ready; /* a reconnect, not the first connection */
} db;

static void dbconn_advance(int revents);
static void dbconn_lost(const char *why);

static const char *
dbconn_state_name(enum dbconn_state state)
{
	switch (state)
	{
		case DBCONN_DOWN:
			return "down";
		case DBCONN_CONNECTING:
			return "connecting";
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
		case DBCONN_IDLE:
			return "idle";
		case DBCONN_RUNNING_JOB:
			return "running a statement";
		case DBCONN_CLAIMING:
			return "claiming";
		case DBCONN_CLOSED:
			return "closed";
	}
	return "?";
}

static void
dbconn_enter(enum dbconn_state state)
{
	log_debug("database connection: %s -> %s", dbconn_state_name(db.state),
			  dbconn_state_name(state));
	db.state = state;
}

/* Ready for work: a job or the claim may be sent. */
static bool
dbconn_ready(void)
{
	return db.state == DBCONN_IDLE || db.state == DBCONN_RUNNING_JOB
		   || db.state == DBCONN_CLAIMING;
}

/* ---------------------------------------------------------------------------
 * Jobs
 * ------------------------------------------------------------------------- */

static struct job *
job_new(const char *sql, void (*done)(struct job *, PGresult *))
{
	struct job *job = xcalloc(1, sizeof(*job));

	job->sql = xstrdup(sql);
	job->done = done;
	return job;
}

static void
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

static void
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
	if (db.state == DBCONN_IDLE)
		dbconn_advance(0);
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
job_log_failure(struct job *job, PGresult *res)
{
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
		log_warnx("database: %s", db_error(res, db.conn));
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

/* ---------------------------------------------------------------------------
 * Recovery writes and statistics
 * ------------------------------------------------------------------------- */

void
dbconn_recover(const char *stage, const struct inflight *rows, int count,
			   const char *status, const char *reason)
{
	/* Each row under the claim token it was handed out with: not one claimed again since. */
	struct job *job = job_new("SELECT pepsi.workqueue_recover($1::int8[], $2::text[],"
							  " $3::pepsi.status, $4, $5::uuid[])",
							  job_log_failure);
	struct buf	ids = BUF_INIT;
	struct buf	stages = BUF_INIT;
	struct buf	tokens = BUF_INIT;

	buf_append_char(&ids, '{');
	buf_append_char(&stages, '{');
	buf_append_char(&tokens, '{');
	for (int i = 0; i < count; i++)
	{
		buf_printf(&ids, "%s%lld", i ? "," : "", rows[i].id);
		buf_printf(&job->recovering, "%s%lld", i ? "," : "", rows[i].id);
		db_array_append(&stages, stage);
		buf_printf(&tokens, "%s%s", i ? "," : "", rows[i].token[0] ? rows[i].token : "NULL");
	}
	buf_append_char(&ids, '}');
	buf_append_char(&stages, '}');
	buf_append_char(&tokens, '}');
	if (strcmp(status, "pending") == 0)
	{
		struct pool *pool = pool_find(stage);

		/* The job goes before the next claim, which then finds them. */
		if (pool != NULL)
			pool_may_have_work(pool);
	}
	job_param(job, ids.data);
	job_param(job, stages.data);
	job_param(job, status);
	job_param(job, reason);
	job_param(job, tokens.data);
	buf_free(&ids);
	buf_free(&stages);
	buf_free(&tokens);
	job_push(job, false);
}

static void
crashed_done(struct job *job, PGresult *res)
{
	const char *outcome;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("database: %s", db_error(res, db.conn));
		return;
	}
	if (PQgetisnull(res, 0, 0))
		return; /* its worker committed it before it died */
	outcome = PQgetvalue(res, 0, 0);
	if (strcmp(outcome, "paused") == 0)
		log_info("row %s paused for a retry: %s", job->params[0], job->params[2]);
	else
	{
		log_warnx("row %s isolated as %s after %s attempts that ended its worker (CRASH_LIMIT): %s",
				  job->params[0], outcome, job->params[3], job->params[2]);
		dispatcher.messages_failed++;
	}
}

/*
 * The worker died on row (crashed, killed for MAX_RUNTIME, or broke the
 * protocol): count the attempt and pause the row for a retry, or isolate
 * it as final_status once it reached CRASH_LIMIT (extension/src/crash.c).
 */
void
dbconn_crashed(const char *stage, const struct inflight *row, const char *reason,
			   const char *final_status)
{
	struct job *job = job_new("SELECT pepsi.workqueue_crashed($1, $2, $3, $4, $5, $6, $7::uuid)", crashed_done);
	char		number[32];

	snprintf(number, sizeof(number), "%lld", row->id);
	job_param(job, number);
	buf_append_str(&job->recovering, number);
	job_param(job, stage);
	job_param(job, reason);
	snprintf(number, sizeof(number), "%d", dispatcher.crash_limit);
	job_param(job, number);
	snprintf(number, sizeof(number), "%.3f", dispatcher.crash_retry_delay);
	job_param(job, number);
	job_param(job, final_status);
	job_param(job, row->token[0] ? row->token : NULL);
	job_push(job, false);
}

static void
stats_done(struct job *job, PGresult *res)
{
	if (res && (PQresultStatus(res) == PGRES_COMMAND_OK || PQresultStatus(res) == PGRES_TUPLES_OK))
		return;
	if (res)
		log_warnx("cannot flush statistics: %s", db_error(res, db.conn));
}

/*
 * The histograms, in a statement of their own: a database whose schema
 * predates them refuses it, and the counters still go.
 */
static void
dbconn_flush_histograms(json_t *histograms)
{
	struct job *job;
	char	   *text;

	if (json_array_size(histograms) > 0)
	{
		job = job_new("SELECT pepsi.stage_histogram_add($1::jsonb)", stats_done);
		text = json_dumps(histograms, JSON_COMPACT);
		job_param(job, text);
		free(text);
		job_push(job, false);
	}
	json_decref(histograms);
}

/*
 * Flush the statistics gathered since the last flush in one statement
 * (one transaction): a row of pepsi.stage_stats per stage with activity,
 * and the global totals.
 */
void
dbconn_flush_stats(bool final)
{
	json_t	   *rows = json_array();
	json_t	   *histograms = json_array();
	struct job *job;
	char	   *text;
	char		number[4][32];

	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		histogram_rows(histograms, p->spec.name, &p->stats);
		memset(p->stats.histograms, 0, sizeof(p->stats.histograms));
		if (p->stats.messages == 0 && p->stats.kills == 0 && p->stats.crashes == 0
			&& p->stats.fused_hops == 0 && p->stats.timeouts == 0)
			continue;
		json_array_append_new(rows, json_pack("{s:s,s:I,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I,s:I}",
											  "stage", p->spec.name,
											  "messages", (json_int_t) p->stats.messages,
											  "us", p->stats.processing_us,
											  "kills", (json_int_t) p->stats.kills,
											  "timeouts", (json_int_t) p->stats.timeouts,
											  "crashes", (json_int_t) p->stats.crashes,
											  "fused", (json_int_t) p->stats.fused_hops,
											  "sent", (json_int_t) p->stats.deliveries[0],
											  "deferred", (json_int_t) p->stats.deliveries[1],
											  "bounced", (json_int_t) p->stats.deliveries[2],
											  "expired", (json_int_t) p->stats.deliveries[3]));
		memset(&p->stats, 0, sizeof(p->stats));
	}
	dispatcher.last_flush = now_seconds();
	dbconn_flush_histograms(histograms);
	if (json_array_size(rows) == 0 && dispatcher.stages_run == 0 && dispatcher.messages_failed == 0
		&& db_transient_retries == 0 && !final)
	{
		json_decref(rows);
		return;
	}
	job = job_new("WITH s AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS s(stage text,"
				  "   messages bigint, us float8, kills bigint, timeouts bigint, crashes bigint,"
				  "   fused bigint, sent bigint, deferred bigint, bounced bigint, expired bigint)),"
				  " per_stage AS (INSERT INTO pepsi.stage_stats AS t (stage, messages,"
				  "   processing_time, kills, timeouts, crashes, fused_hops, deliveries_sent,"
				  "   deliveries_deferred, deliveries_bounced, deliveries_expired, updated_at)"
				  "   SELECT stage, messages, us * interval '1 microsecond', kills, timeouts,"
				  "     crashes, fused, sent, deferred, bounced, expired, now() FROM s"
				  "   ON CONFLICT (stage) DO UPDATE SET messages = t.messages + excluded.messages,"
				  "     processing_time = t.processing_time + excluded.processing_time,"
				  "     kills = t.kills + excluded.kills, timeouts = t.timeouts + excluded.timeouts,"
				  "     crashes = t.crashes + excluded.crashes,"
				  "     fused_hops = t.fused_hops + excluded.fused_hops,"
				  "     deliveries_sent = t.deliveries_sent + excluded.deliveries_sent,"
				  "     deliveries_deferred = t.deliveries_deferred + excluded.deliveries_deferred,"
				  "     deliveries_bounced = t.deliveries_bounced + excluded.deliveries_bounced,"
				  "     deliveries_expired = t.deliveries_expired + excluded.deliveries_expired,"
				  "     updated_at = now()"
				  "   RETURNING 1)"
				  " UPDATE pepsi.dispatch_stats SET stages_run = stages_run + $2,"
				  "   messages = messages + $3, messages_failed = messages_failed + $4,"
				  "   serialization_failures = serialization_failures + $5, updated_at = now()",
				  stats_done);
	text = json_dumps(rows, JSON_COMPACT);
	job_param(job, text);
	free(text);
	snprintf(number[0], sizeof(number[0]), "%lu", dispatcher.stages_run);
	snprintf(number[1], sizeof(number[1]), "%lu", dispatcher.messages);
	snprintf(number[2], sizeof(number[2]), "%lu", dispatcher.messages_failed);
	snprintf(number[3], sizeof(number[3]), "%lu", db_transient_retries);
	for (int i = 0; i < 4; i++)
		job_param(job, number[i]);
	dispatcher.stages_run = dispatcher.messages = dispatcher.messages_failed = 0;
	db_transient_retries = 0;
	json_decref(rows);
	job_push(job, false);
}

/* ---------------------------------------------------------------------------
 * Configuration: the file, and the overrides
 * ------------------------------------------------------------------------- */

/*
 * The file again with the overrides read from res.  On a reload a refused
 * configuration leaves the running one in place; at start it is fatal.
 */
static void
dbconn_apply_overrides(PGresult *res, bool starting)
{
	char				 err[1024];
	struct pepsi_config *cfg;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (starting)
			fatalx("cannot read pepsi.config_override: %s", db_error(res, db.conn));
		log_warnx("cannot read pepsi.config_override: %s", db_error(res, db.conn));
		return;
	}
	if ((cfg = config_load(dispatcher.config_path, err, sizeof(err))) == NULL)
	{
		if (starting)
			fatalx("%s", err);
		log_warnx("configuration not reloaded: %s", err);
		return;
	}
	for (int i = 0; i < PQntuples(res); i++)
		if (!config_add_override(cfg, PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
								 PQgetvalue(res, i, 2), PQgetvalue(res, i, 3), err, sizeof(err)))
		{
			if (starting)
				fatalx("%s", err);
			log_warnx("configuration not reloaded: %s", err);
			config_free(cfg);
			return;
		}
	dispatch_apply_config(cfg);
}

static void
reload_done(struct job *job, PGresult *res)
{
	if (res)
		dbconn_apply_overrides(res, false);
}

void
dbconn_reload_config(void)
{
	job_push(job_new(DBCONN_OVERRIDES_SQL, reload_done), false);
}

/* ---------------------------------------------------------------------------
 * The claim
 * ------------------------------------------------------------------------- */

static void
claim_done(PGresult *res)
{
	int rows;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("claim failed: %s", db_error(res, db.conn));
		return;
	}
	rows = PQntuples(res);
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		if (p->claim_asked > 0)
		{
			int count = 0;

			for (int i = 0; i < rows; i++)
				count += strcmp(PQgetvalue(res, i, 1), p->spec.name) == 0;
			pool_claimed(p, count);
		}
	for (int i = 0; i < rows; i++)
	{
		long long		id = atoll(PQgetvalue(res, i, 0));
		const char	   *stage = PQgetvalue(res, i, 1);
		struct pool	   *pool = pool_find(stage);
		struct inflight row = {.id = id};

		snprintf(row.token, sizeof(row.token), "%s", PQgetvalue(res, i, 3));

		if (pool && pool_assign(pool, id, PQgetvalue(res, i, 3), PQgetvalue(res, i, 2)))
			continue;

		/*
		 * No worker could take it (the program will not start, we are
		 * stopping, or a reload removed the stage meanwhile): back to
		 * pending, or it would stay running until the next start.
		 */
		dbconn_recover(stage, &row, 1, "pending", NULL);
	}
	pools_flush();
}

/*
 * Build and send the claim, if any stage has room (for lanes_only, room
 * in a light lane: pools_claim_urgency).  Returns whether sent.
 */
static bool
claim_send(bool lanes_only)
{
	double		now = now_seconds();
	struct buf	stages = BUF_INIT;
	struct buf	capacities = BUF_INIT;
	struct buf	costs = BUF_INIT;
	struct buf	acct_stages = BUF_INIT;
	struct buf	acct_senders = BUF_INIT;
	struct buf	acct_used = BUF_INIT;
	char		fifo[16];
	const char *values[7];
	int			nstages = 0;
	bool		sent;

	buf_append_char(&stages, '{');
	buf_append_char(&capacities, '{');
	buf_append_char(&costs, '{');
	buf_append_char(&acct_stages, '{');
	buf_append_char(&acct_senders, '{');
	buf_append_char(&acct_used, '{');
	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		/* Only the stages that may have pending rows (pool_may_have_work). */
		int capacity = !p->may_have_work ? 0
					   : lanes_only		 ? pool_lane_capacity(p, now)
										 : pool_capacity(p, now);

		p->claim_asked = capacity > 0 ? capacity : 0;
		if (capacity <= 0)
			continue;
		db_array_append(&stages, p->spec.name);
		buf_printf(&capacities, "%s%d", nstages ? "," : "", capacity);
		buf_printf(&costs, "%s%.1f", nstages ? "," : "", p->row_cost_us);
		fair_export(p->fair, p->spec.name, now, dispatcher.fair_half_life,
					p->row_cost_us * 0.01, &acct_stages, &acct_senders, &acct_used);
		nstages++;
	}
	buf_append_char(&stages, '}');
	buf_append_char(&capacities, '}');
	buf_append_char(&costs, '}');
	buf_append_char(&acct_stages, '}');
	buf_append_char(&acct_senders, '}');
	buf_append_char(&acct_used, '}');
	snprintf(fifo, sizeof(fifo), "%d", dispatcher.fair_fifo_percent);
	values[0] = stages.data;
	values[1] = capacities.data;
	values[2] = acct_stages.data;
	values[3] = acct_senders.data;
	values[4] = acct_used.data;
	values[5] = fifo;
	values[6] = costs.data;
	sent = nstages > 0
		   && PQsendQueryPrepared(db.conn, DBCONN_CLAIM_NAME, 7, values, NULL, NULL, 0) == 1;
	if (sent)
		pools_claim_sent();
	if (nstages > 0 && !sent)
		log_warnx("cannot send the claim: %s", PQerrorMessage(db.conn));
	buf_free(&stages);
	buf_free(&capacities);
	buf_free(&costs);
	buf_free(&acct_stages);
	buf_free(&acct_senders);
	buf_free(&acct_used);
	return sent;
}

/*
 * Whether the claim wanted should go now: a stage's workers idle with
 * work perhaps waiting, or it has waited DBCONN_CLAIM_COALESCE for the
 * answers after the first that asked for it; or a claim for the light
 * lanes only should (pools_claim_urgency).  Otherwise the timer is set
 * for when it may.
 */
static enum claim_urgency
claim_due(void)
{
	double			   now = now_seconds();
	double			   wait = db.claim_wanted_since + DBCONN_CLAIM_COALESCE - now;
	enum claim_urgency urgency = wait <= 0 ? CLAIM_NOW : pools_claim_urgency(now);

	if (urgency == CLAIM_NOW)
	{
		ev_timer_stop(dispatcher.loop, &db.claim_timer);
		return CLAIM_NOW;
	}
	if (!ev_is_active(&db.claim_timer))
	{
		ev_timer_set(&db.claim_timer, wait, 0);
		ev_timer_start(dispatcher.loop, &db.claim_timer);
	}
	return urgency;
}

/*
 * Ask for a claim: capacity was freed (an answer, a worker's exit), or
 * new_work may wait (a NOTIFY, the heartbeat, a new configuration).
 */
void
dbconn_want_claim(bool new_work)
{
	if (dispatcher.shutting_down)
		return;
	if (new_work)
		pools_may_have_work();
	if (!db.claim_wanted)
		db.claim_wanted_since = now_seconds();
	db.claim_wanted = true;
	if (db.state == DBCONN_IDLE && claim_due() != CLAIM_LATER)
		ev_idle_start(dispatcher.loop, &db.claim_idle);
}

static void
claim_on_idle(struct ev_loop *loop, ev_idle *watcher, int revents)
{
	ev_idle_stop(loop, watcher);
	if (db.state == DBCONN_IDLE)
		dbconn_advance(0);
}

static void
claim_on_timer(struct ev_loop *loop, ev_timer *watcher, int revents)
{
	if (db.state == DBCONN_IDLE)
		dbconn_advance(0);
}

/* ---------------------------------------------------------------------------
 * Set-up: one statement per state, each sent when the previous one is done
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

/* Send the statement of the set-up state we enter. */
static bool
dbconn_send_setup(enum dbconn_state next)
{
	int sent = 0;

	switch (next)
	{
		case DBCONN_LOCKING:
			sent = PQsendQuery(db.conn, DBCONN_LOCK_SQL);
			break;
		case DBCONN_LISTENING:
			sent = PQsendQuery(db.conn, DBCONN_LISTEN_SQL);
			break;
		case DBCONN_PREPARING:
			/* The claim is sent on every wake: parse and plan it once. */
			sent = PQsendPrepare(db.conn, DBCONN_CLAIM_NAME, DBCONN_CLAIM_SQL, 7, NULL);
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
				const char *values[1];

				dbconn_inflight_ids(&ids);
				values[0] = ids.data;
				sent = PQsendQueryParams(db.conn, "SELECT pepsi.workqueue_reset_orphans($1::int8[])",
										 1, NULL, values, NULL, NULL, 0);
				buf_free(&ids);
				break;
			}
		case DBCONN_LOADING_OVERRIDES:
			sent = PQsendQuery(db.conn, DBCONN_OVERRIDES_SQL);
			break;
		default:
			fatalx("database connection: no set-up statement for state %s",
				   dbconn_state_name(next));
	}
	if (sent != 1)
		return false;
	dbconn_enter(next);
	return true;
}

/*
 * A set-up statement is done with res: check it and go on to the next
 * state.  Returns false (having logged why) if the connection must be
 * dropped and tried again later.
 */
static bool
dbconn_setup_done(PGresult *res)
{
	ExecStatusType status = PQresultStatus(res);

	switch (db.state)
	{
		case DBCONN_LOCKING:
			if (status != PGRES_TUPLES_OK)
			{
				log_warnx("cannot take the dispatcher lock: %s", db_error(res, db.conn));
				return false;
			}
			if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
				fatalx("another pepsi-dispatch is already running against this database");
			return dbconn_send_setup(DBCONN_LISTENING);
		case DBCONN_LISTENING:
			if (status != PGRES_COMMAND_OK)
			{
				log_warnx("cannot listen for work: %s", db_error(res, db.conn));
				return false;
			}
			return dbconn_send_setup(DBCONN_PREPARING);
		case DBCONN_PREPARING:
			if (status != PGRES_COMMAND_OK)
			{
				log_warnx("cannot prepare the claim: %s", db_error(res, db.conn));
				return false;
			}
			return dbconn_send_setup(DBCONN_RESETTING);
		case DBCONN_RESETTING:
			if (status != PGRES_TUPLES_OK)
			{
				log_warnx("cannot reset orphaned rows: %s", db_error(res, db.conn));
				return false;
			}
			if (atoi(PQgetvalue(res, 0, 0)) > 0)
				log_info("put %s orphaned running rows back to pending", PQgetvalue(res, 0, 0));
			if (!db.ever_ready)
				return dbconn_send_setup(DBCONN_LOADING_OVERRIDES);
			break;
		case DBCONN_LOADING_OVERRIDES:
			dbconn_apply_overrides(res, true);
			break;
		default:
			fatalx("database connection: set-up result in state %s", dbconn_state_name(db.state));
	}

	/* Set up. */
	if (db.ever_ready)
	{
		/*
		 * If the server went away, so did the workers' sessions, and a
		 * worker finds out only when its next load fails, failing the
		 * message.  Replacements start with fresh sessions.
		 */
		log_info("reconnected; the workers retire so that their replacements connect afresh");
		pools_retire_all();
	}
	db.ever_ready = true;
	db.backoff = 0;
	maintenance_check_soon();
	db.claim_wanted = true;
	db.claim_wanted_since = 0; /* due at once */
	pools_may_have_work();
	dbconn_enter(DBCONN_IDLE);
	log_info("connected to the database");
	return true;
}

/* ---------------------------------------------------------------------------
 * Driving the connection
 * ------------------------------------------------------------------------- */

static void
dbconn_watch(int events)
{
	int fd = db.conn ? PQsocket(db.conn) : -1;

	if (ev_is_active(&db.io) && (db.io.fd != fd || (db.io.events & (EV_READ | EV_WRITE)) != events))
		ev_io_stop(dispatcher.loop, &db.io);
	if (fd < 0 || events == 0 || ev_is_active(&db.io))
		return;
	ev_io_set(&db.io, fd, events);
	ev_io_start(dispatcher.loop, &db.io);
}

/* Send what libpq has buffered; watch for writability if it could not. */
static bool
dbconn_flush(void)
{
	int rc = PQflush(db.conn);

	if (rc < 0)
		return false;
	dbconn_watch(EV_READ | (rc == 1 ? EV_WRITE : 0));
	return true;
}

static void
dbconn_on_reconnect(struct ev_loop *loop, ev_timer *watcher, int revents)
{
	dbconn_advance(0);
}

static void
dbconn_on_io(struct ev_loop *loop, ev_io *watcher, int revents)
{
	dbconn_advance(revents);
}

static void
dbconn_schedule_reconnect(void)
{
	/* Decorrelated jitter: random between the base and three times the last wait. */
	double upper = db.backoff * 3 > DBCONN_BACKOFF_BASE ? db.backoff * 3 : DBCONN_BACKOFF_BASE * 3;

	db.backoff = DBCONN_BACKOFF_BASE + (upper - DBCONN_BACKOFF_BASE) * ((double) random() / RAND_MAX);
	if (db.backoff > DBCONN_BACKOFF_CAP)
		db.backoff = DBCONN_BACKOFF_CAP;
	ev_timer_set(&db.reconnect_timer, db.backoff, 0);
	ev_timer_start(dispatcher.loop, &db.reconnect_timer);
}

/* The connection is gone (or set-up failed): drop it and try again later. */
static void
dbconn_lost(const char *why)
{
	char reason[512];

	snprintf(reason, sizeof(reason), "%s", why && *why ? why : "connection lost");
	for (char *p = reason; *p; p++)
		if (*p == '\n')
			*p = ' ';
	if (dbconn_ready())
		log_warnx("lost the database connection (%s); reconnecting", reason);
	else if (db.state == DBCONN_CONNECTING)
		log_warnx("cannot connect to the database: %s", reason);
	dbconn_watch(0);
	if (db.running_job)
	{
		/* Its effect is unknown; the writes are safe to repeat, so send it again. */
		job_push(db.running_job, true);
		db.running_job = NULL;
	}
	db.claim_wanted = true;
	db.claim_wanted_since = 0;
	if (db.result)
	{
		PQclear(db.result);
		db.result = NULL;
	}
	PQfinish(db.conn);
	db.conn = NULL;
	dbconn_enter(DBCONN_DOWN);
	dbconn_schedule_reconnect();
}

static void
dbconn_connect(void)
{
	const char *conninfo = config_get(dispatcher.cfg, "database", "CONNINFO");
	const char *keywords[] = {"dbname", "application_name", NULL};
	const char *values[] = {conninfo ? conninfo : PEPSI_DEFAULT_CONNINFO, "pepsi-dispatch", NULL};

	db.conn = PQconnectStartParams(keywords, values, 1);
	dbconn_enter(DBCONN_CONNECTING);
	if (db.conn == NULL || PQstatus(db.conn) == CONNECTION_BAD)
	{
		dbconn_lost(db.conn ? PQerrorMessage(db.conn) : "out of memory");
		return;
	}
	dbconn_watch(EV_WRITE);
}

static void
dbconn_poll_connect(void)
{
	switch (PQconnectPoll(db.conn))
	{
		case PGRES_POLLING_FAILED:
			dbconn_lost(PQerrorMessage(db.conn));
			return;
		case PGRES_POLLING_READING:
			dbconn_watch(EV_READ);
			return;
		case PGRES_POLLING_WRITING:
			dbconn_watch(EV_WRITE);
			return;
		default:
			break;
	}
	if (PQsetnonblocking(db.conn, 1) != 0 || !dbconn_send_setup(DBCONN_LOCKING) || !dbconn_flush())
		dbconn_lost(PQerrorMessage(db.conn));
}

/* Send the next job, or else the claim, if there is one. */
static void
dbconn_send_work(void)
{
	struct job		  *job = job_pop();
	enum claim_urgency urgency;

	if (job)
	{
		if (PQsendQueryParams(db.conn, job->sql, job->nparams, NULL,
							  (const char *const *) job->params, NULL, NULL, 0)
			!= 1)
		{
			job_push(job, true);
			dbconn_lost(PQerrorMessage(db.conn));
			return;
		}
		db.running_job = job;
		dbconn_enter(DBCONN_RUNNING_JOB);
	}
	else if (db.claim_wanted && !dispatcher.shutting_down && (urgency = claim_due()) != CLAIM_LATER)
	{
		/* A claim for the lanes leaves the rest wanted, for its timer. */
		db.claim_wanted = urgency == CLAIM_LANES;
		if (!claim_send(urgency == CLAIM_LANES))
			return;
		dbconn_enter(DBCONN_CLAIMING);
	}
	else
		return;
	if (!dbconn_flush())
		dbconn_lost(PQerrorMessage(db.conn));
}

/* The statement in flight is done with db.result: act on it by state. */
static void
dbconn_statement_done(void)
{
	PGresult   *res = db.result;
	struct job *job = db.running_job;

	db.result = NULL;
	switch (db.state)
	{
		case DBCONN_CLAIMING:
			dbconn_enter(DBCONN_IDLE);
			claim_done(res);
			break;
		case DBCONN_RUNNING_JOB:
			db.running_job = NULL;
			dbconn_enter(DBCONN_IDLE);
			job->done(job, res);
			job_free(job);
			break;
		default:
			if (!dbconn_setup_done(res))
			{
				PQclear(res);
				dbconn_lost("set-up failed");
				return;
			}
			break;
	}
	PQclear(res);
}

/*
 * Read what the server sent: notifications, and the results of the
 * statement in flight.  A statement of several commands (the LISTENs)
 * gives several results: the first error among them stands for all.
 */
static void
dbconn_read(void)
{
	PGnotify *notify;

	if (!PQconsumeInput(db.conn))
	{
		dbconn_lost(PQerrorMessage(db.conn));
		return;
	}
	while ((notify = PQnotifies(db.conn)) != NULL)
	{
		if (strcmp(notify->relname, "pepsi_config_changed") == 0)
			dbconn_reload_config();
		else
			dbconn_want_claim(true);
		PQfreemem(notify);
	}
	if (db.state == DBCONN_IDLE)
	{
		/* Nothing in flight: the server closing on us shows here. */
		if (PQstatus(db.conn) != CONNECTION_OK)
			dbconn_lost(PQerrorMessage(db.conn));
		return;
	}
	while (db.state != DBCONN_IDLE && db.state != DBCONN_DOWN && !PQisBusy(db.conn))
	{
		PGresult	  *res = PQgetResult(db.conn);
		ExecStatusType status;

		if (res == NULL)
		{
			dbconn_statement_done();
			continue;
		}
		status = PQresultStatus(res);
		if (db.result && PQresultStatus(db.result) != PGRES_COMMAND_OK
			&& PQresultStatus(db.result) != PGRES_TUPLES_OK
			&& (status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK))
			PQclear(res); /* an error came first: keep it */
		else
		{
			if (db.result)
				PQclear(db.result);
			db.result = res;
		}
	}
}

/*
 * The one function that moves the connection along, on the reconnect
 * timer (revents 0), on socket events, and when work arrives while idle.
 */
static void
dbconn_advance(int revents)
{
	switch (db.state)
	{
		case DBCONN_DOWN:
			if (!dispatcher.shutting_down)
				dbconn_connect();
			break;
		case DBCONN_CONNECTING:
			if (revents)
				dbconn_poll_connect();
			break;
		case DBCONN_LOCKING:
		case DBCONN_LISTENING:
		case DBCONN_PREPARING:
		case DBCONN_RESETTING:
		case DBCONN_LOADING_OVERRIDES:
		case DBCONN_RUNNING_JOB:
		case DBCONN_CLAIMING:
		case DBCONN_IDLE:
			if ((revents & EV_WRITE) && !dbconn_flush())
			{
				dbconn_lost(PQerrorMessage(db.conn));
				break;
			}
			if (revents & EV_READ)
				dbconn_read();
			break;
		case DBCONN_CLOSED:
			break;
	}
	/* Whatever just finished, the connection may be free for the next statement. */
	if (db.state == DBCONN_IDLE)
		dbconn_send_work();
	else if (db.state != DBCONN_DOWN && db.state != DBCONN_CONNECTING
			 && db.state != DBCONN_CLOSED && !dbconn_flush())
		dbconn_lost(PQerrorMessage(db.conn));
}

void
dbconn_start(void)
{
	ev_io_init(&db.io, dbconn_on_io, -1, EV_READ);
	ev_timer_init(&db.reconnect_timer, dbconn_on_reconnect, 0, 0);
	ev_idle_init(&db.claim_idle, claim_on_idle);
	ev_timer_init(&db.claim_timer, claim_on_timer, 0, 0);
	db.state = DBCONN_DOWN;
	dbconn_advance(0);
}

/*
 * At shutdown, after the workers are gone: run what is queued (the rows
 * they held go back to pending, the last statistics) synchronously.
 */
void
dbconn_finish(void)
{
	if (!dbconn_ready())
	{
		log_warnx("no database connection at shutdown: rows still running are reset when a "
				  "dispatcher next starts");
		return;
	}
	dbconn_flush_stats(true);
	PQsetnonblocking(db.conn, 0);
	dbconn_watch(0);
	ev_timer_stop(dispatcher.loop, &db.reconnect_timer);
	if (db.state != DBCONN_IDLE)
	{
		PGresult *res;

		while ((res = PQgetResult(db.conn)) != NULL)
		{
			if (db.state == DBCONN_CLAIMING)
			{
				/* Claimed as we stopped: give them straight back. */
				for (int i = 0; PQresultStatus(res) == PGRES_TUPLES_OK && i < PQntuples(res); i++)
				{
					struct inflight row = {.id = atoll(PQgetvalue(res, i, 0))};

					snprintf(row.token, sizeof(row.token), "%s", PQgetvalue(res, i, 3));

					dbconn_recover(PQgetvalue(res, i, 1), &row, 1, "pending", NULL);
				}
			}
			else
				db.running_job->done(db.running_job, res);
			PQclear(res);
		}
		if (db.running_job)
			job_free(db.running_job);
		db.running_job = NULL;
	}
	dbconn_enter(DBCONN_CLOSED);
	while (db.jobs_head)
	{
		struct job *job = job_pop();
		PGresult   *res = PQexecParams(db.conn, job->sql, job->nparams, NULL,
									   (const char *const *) job->params, NULL, NULL, 0);

		job->done(job, res);
		PQclear(res);
		job_free(job);
	}
	PQfinish(db.conn);
	db.conn = NULL;
}
