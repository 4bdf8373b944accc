/*
 * queue.c: the dispatcher's one database connection.
 *
 * Non-blocking libpq driven by the event loop.  It LISTENs on
 * pepsi_workqueue (work to claim) and pepsi_config_changed (reload), runs
 * one statement at a time from a small job queue (the dispatcher's own
 * recovery writes, statistics, the override reload), and in between sends
 * the claim: one pepsi.workqueue_claim call for every stage with spare
 * capacity, built when it is sent so it sees the capacity of that moment.
 *
 * If the server goes away, rows stay safe where they are: workers commit
 * through their own connections, and the writes queued here wait.  The
 * connection comes back with decorrelated jittered backoff, and since a
 * claim in flight at the loss may have set rows running that no worker
 * got, setup puts every running row not in flight back to pending.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "db.h"
#include "dispatch.h"
#include "log.h"

#define QUEUE_BACKOFF_BASE 0.1
#define QUEUE_BACKOFF_CAP 30.0
/* Advisory lock keys ('PEPS', 2): one dispatcher per database. */
#define QUEUE_LOCK "SELECT pg_try_advisory_lock(1346720851, 2)"
#define QUEUE_CLAIM_NAME "pepsi_dispatch_claim"
#define QUEUE_CLAIM_SQL "SELECT id, stage, sender_key FROM pepsi.workqueue_claim(" \
	"$1::text[], $2::int[], $3::text[], $4::text[], $5::float8[], $6::int, $7::float8[])"

struct job
{
	char	   *sql;
	int			nparams;
	char	   *params[8];
	void		(*done) (struct job *job, PGresult *res);
	struct buf	recovering;		/* a recovery write: its ids, comma-separated */
	struct job *next;
};

static PGconn *conn;
static bool ready;
static ev_io socket_reader;
static ev_io socket_writer;
static ev_timer reconnect_timer;
static ev_idle claim_idle;
static double backoff;
static struct job *jobs_head;
static struct job *jobs_tail;
static struct job *running_job;
static bool claim_running;
static bool claim_wanted;
static PGresult *pending_result;
static bool was_connected;

static void queue_kick(void);
static void queue_lost(const char *why);

/* ---------------------------------------------------------------------------
 * Jobs
 * ------------------------------------------------------------------------- */

static struct job *
job_new(const char *sql, void (*done) (struct job *, PGresult *))
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
		job->next = jobs_head;
		jobs_head = job;
		if (jobs_tail == NULL)
			jobs_tail = job;
	}
	else
	{
		job->next = NULL;
		if (jobs_tail)
			jobs_tail->next = job;
		else
			jobs_head = job;
		jobs_tail = job;
	}
	queue_kick();
}

static void
job_log_failure(struct job *job, PGresult *res)
{
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
		log_warnx("database: %s", db_error(res, conn));
}

/* ---------------------------------------------------------------------------
 * Recovery writes and statistics
 * ------------------------------------------------------------------------- */

void
queue_recover(const char *stage, const struct inflight *rows, int count,
			  const char *status, const char *reason)
{
	struct job *job = job_new("SELECT pepsi.workqueue_recover($1::int8[], $2::text[],"
							  " $3::pepsi.status, $4)", job_log_failure);
	struct buf	ids = BUF_INIT;
	struct buf	stages = BUF_INIT;

	buf_append_char(&ids, '{');
	buf_append_char(&stages, '{');
	for (int i = 0; i < count; i++)
	{
		buf_printf(&ids, "%s%lld", i ? "," : "", rows[i].id);
		buf_printf(&job->recovering, "%s%lld", i ? "," : "", rows[i].id);
		db_array_append(&stages, stage);
	}
	buf_append_char(&ids, '}');
	buf_append_char(&stages, '}');
	job_param(job, ids.data);
	job_param(job, stages.data);
	job_param(job, status);
	job_param(job, reason);
	buf_free(&ids);
	buf_free(&stages);
	job_push(job, false);
}

static void
stats_done(struct job *job, PGresult *res)
{
	if (res && PQresultStatus(res) == PGRES_COMMAND_OK)
		return;
	if (res)
		log_warnx("cannot flush statistics: %s", db_error(res, conn));
}

/*
 * Flush the statistics gathered since the last flush in one statement
 * (one transaction): a row of pepsi.stage_stats per stage with activity,
 * and the global totals.
 */
void
queue_flush_stats(bool final)
{
	json_t	   *rows = json_array();
	struct job *job;
	char	   *text;
	char		number[4][32];

	for (struct pool *p = dispatcher.pools; p; p = p->next)
	{
		if (p->stats.messages == 0 && p->stats.kills == 0 && p->stats.crashes == 0
			&& p->stats.fused_hops == 0 && p->stats.timeouts == 0)
			continue;
		json_array_append_new(rows, json_pack("{s:s,s:I,s:f,s:I,s:I,s:I,s:I}",
											  "stage", p->spec.name,
											  "messages", (json_int_t) p->stats.messages,
											  "us", p->stats.processing_us,
											  "kills", (json_int_t) p->stats.kills,
											  "timeouts", (json_int_t) p->stats.timeouts,
											  "crashes", (json_int_t) p->stats.crashes,
											  "fused", (json_int_t) p->stats.fused_hops));
		memset(&p->stats, 0, sizeof(p->stats));
	}
	dispatcher.last_flush = now_seconds();
	if (json_array_size(rows) == 0 && dispatcher.stages_run == 0 && dispatcher.messages_failed == 0
		&& db_transient_retries == 0 && !final)
	{
		json_decref(rows);
		return;
	}
	job = job_new("WITH s AS (SELECT * FROM jsonb_to_recordset($1::jsonb) AS s(stage text,"
				  "   messages bigint, us float8, kills bigint, timeouts bigint, crashes bigint,"
				  "   fused bigint)),"
				  " per_stage AS (INSERT INTO pepsi.stage_stats AS t (stage, messages,"
				  "   processing_time, kills, timeouts, crashes, fused_hops, updated_at)"
				  "   SELECT stage, messages, us * interval '1 microsecond', kills, timeouts,"
				  "     crashes, fused, now() FROM s"
				  "   ON CONFLICT (stage) DO UPDATE SET messages = t.messages + excluded.messages,"
				  "     processing_time = t.processing_time + excluded.processing_time,"
				  "     kills = t.kills + excluded.kills, timeouts = t.timeouts + excluded.timeouts,"
				  "     crashes = t.crashes + excluded.crashes,"
				  "     fused_hops = t.fused_hops + excluded.fused_hops, updated_at = now()"
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
 * Configuration reload: the file again, and the overrides
 * ------------------------------------------------------------------------- */

static void
reload_done(struct job *job, PGresult *res)
{
	char		err[1024];
	struct pepsi_config *cfg;

	if (res == NULL || PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (res)
			log_warnx("cannot read pepsi.config_override: %s", db_error(res, conn));
		return;
	}
	if ((cfg = config_load(dispatcher.config_path, err, sizeof(err))) == NULL)
	{
		log_warnx("configuration not reloaded: %s", err);
		return;
	}
	for (int i = 0; i < PQntuples(res); i++)
		if (!config_add_override(cfg, PQgetvalue(res, i, 0), PQgetvalue(res, i, 1),
								 PQgetvalue(res, i, 2), PQgetvalue(res, i, 3), err, sizeof(err)))
		{
			log_warnx("configuration not reloaded: %s", err);
			config_free(cfg);
			return;
		}
	dispatch_apply_config(cfg);
}

void
queue_reload_config(void)
{
	job_push(job_new("SELECT scope, section, option, value FROM pepsi.config_override"
					 " ORDER BY scope, section, option", reload_done), false);
}

/* ---------------------------------------------------------------------------
 * The claim
 * ------------------------------------------------------------------------- */

static void
claim_done(PGresult *res)
{
	int			rows;

	claim_running = false;
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("claim failed: %s", db_error(res, conn));
		return;
	}
	rows = PQntuples(res);
	for (int i = 0; i < rows; i++)
	{
		long long	id = atoll(PQgetvalue(res, i, 0));
		const char *stage = PQgetvalue(res, i, 1);
		struct pool *pool = pool_find(stage);
		struct inflight row = {.id = id};

		if (pool && pool_assign(pool, id, PQgetvalue(res, i, 2)))
			continue;

		/*
		 * No worker could take it (the program will not start, we are
		 * stopping, or a reload removed the stage meanwhile): back to
		 * pending, or it would stay running until the next start.
		 */
		queue_recover(stage, &row, 1, "pending", NULL);
	}
	pools_flush();

	/*
	 * No claim again at once: a claim that came back short found its
	 * stages drained, one that came back full used their capacity up.
	 * Whatever frees capacity or brings work (an answer, a worker's exit, a
	 * NOTIFY, the heartbeat) has asked for the next one meanwhile.
	 */
	if (claim_wanted)
		ev_idle_start(dispatcher.loop, &claim_idle);
}

/* Build and send the claim, if any stage has room.  Returns whether sent. */
static bool
claim_send(void)
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
		int			capacity = pool_capacity(p, now);

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
		&& PQsendQueryPrepared(conn, QUEUE_CLAIM_NAME, 7, values, NULL, NULL, 0) == 1;
	if (nstages > 0 && !sent)
		log_warnx("cannot send the claim: %s", PQerrorMessage(conn));
	buf_free(&stages);
	buf_free(&capacities);
	buf_free(&costs);
	buf_free(&acct_stages);
	buf_free(&acct_senders);
	buf_free(&acct_used);
	return sent;
}

void
queue_want_claim(void)
{
	if (dispatcher.shutting_down)
		return;
	claim_wanted = true;
	if (ready && !claim_running)
		ev_idle_start(dispatcher.loop, &claim_idle);
}

static void
claim_on_idle(struct ev_loop *loop, ev_idle *watcher, int revents)
{
	ev_idle_stop(loop, watcher);
	queue_kick();
}

/* ---------------------------------------------------------------------------
 * Driving the connection
 * ------------------------------------------------------------------------- */

static void
queue_flush_output(void)
{
	int			rc = PQflush(conn);

	if (rc == 1)
		ev_io_start(dispatcher.loop, &socket_writer);
	else
		ev_io_stop(dispatcher.loop, &socket_writer);
	if (rc < 0)
		queue_lost(PQerrorMessage(conn));
}

/* Send the next job, or else the claim, if the connection is free. */
static void
queue_kick(void)
{
	if (!ready || running_job || claim_running)
		return;
	if (jobs_head)
	{
		struct job *job = jobs_head;

		jobs_head = job->next;
		if (jobs_head == NULL)
			jobs_tail = NULL;
		if (PQsendQueryParams(conn, job->sql, job->nparams, NULL,
							  (const char *const *) job->params, NULL, NULL, 0) != 1)
		{
			job_push(job, true);
			queue_lost(PQerrorMessage(conn));
			return;
		}
		running_job = job;
		queue_flush_output();
		return;
	}
	if (claim_wanted && !dispatcher.shutting_down)
	{
		claim_wanted = false;
		if (claim_send())
		{
			claim_running = true;
			queue_flush_output();
		}
	}
}

static void
queue_on_writable(struct ev_loop *loop, ev_io *watcher, int revents)
{
	queue_flush_output();
}

static void
queue_on_readable(struct ev_loop *loop, ev_io *watcher, int revents)
{
	PGnotify   *notify;

	if (!PQconsumeInput(conn))
	{
		queue_lost(PQerrorMessage(conn));
		return;
	}
	while ((notify = PQnotifies(conn)) != NULL)
	{
		if (strcmp(notify->relname, "pepsi_config_changed") == 0)
			queue_reload_config();
		else
			queue_want_claim();
		PQfreemem(notify);
	}
	while ((running_job || claim_running) && !PQisBusy(conn))
	{
		PGresult   *res = PQgetResult(conn);

		if (res != NULL)
		{
			/* Keep the statement's result; the NULL that follows ends it. */
			if (pending_result)
				PQclear(pending_result);
			pending_result = res;
			continue;
		}
		if (claim_running)
			claim_done(pending_result);
		else
		{
			struct job *job = running_job;

			running_job = NULL;
			job->done(job, pending_result);
			job_free(job);
		}
		PQclear(pending_result);
		pending_result = NULL;
		queue_kick();
	}
}

static void queue_connect(void);

static void
queue_on_reconnect(struct ev_loop *loop, ev_timer *watcher, int revents)
{
	queue_connect();
}

static void
queue_schedule_reconnect(void)
{
	/* Decorrelated jitter: random between the base and three times the last wait. */
	double		upper = backoff * 3 > QUEUE_BACKOFF_BASE ? backoff * 3 : QUEUE_BACKOFF_BASE * 3;

	backoff = QUEUE_BACKOFF_BASE + (upper - QUEUE_BACKOFF_BASE) * ((double) random() / RAND_MAX);
	if (backoff > QUEUE_BACKOFF_CAP)
		backoff = QUEUE_BACKOFF_CAP;
	ev_timer_set(&reconnect_timer, backoff, 0);
	ev_timer_start(dispatcher.loop, &reconnect_timer);
}

static void
queue_lost(const char *why)
{
	char		reason[512];

	snprintf(reason, sizeof(reason), "%s", why ? why : "connection lost");
	for (char *p = reason; *p; p++)
		if (*p == '\n')
			*p = ' ';
	log_warnx("lost the database connection (%s); reconnecting", reason);
	ready = false;
	ev_io_stop(dispatcher.loop, &socket_reader);
	ev_io_stop(dispatcher.loop, &socket_writer);
	if (running_job)
	{
		/* Its effect is unknown; the writes are safe to repeat, so send it again. */
		job_push(running_job, true);
		running_job = NULL;
	}
	claim_running = false;
	claim_wanted = true;
	if (pending_result)
	{
		PQclear(pending_result);
		pending_result = NULL;
	}
	PQfinish(conn);
	conn = NULL;
	queue_schedule_reconnect();
}

/* Blocking setup on a fresh connection: lock, listen, orphans, overrides. */
static bool
queue_setup(void)
{
	PGresult   *res;
	struct buf	inflight = BUF_INIT;
	const char *values[1];
	static bool overrides_applied;
	size_t		count = 0;

	res = PQexec(conn, QUEUE_LOCK);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("cannot take the dispatcher lock: %s", db_error(res, conn));
		PQclear(res);
		return false;
	}
	if (strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		fatalx("another pepsi-dispatch is already running against this database");
	PQclear(res);
	res = PQexec(conn, "LISTEN pepsi_workqueue; LISTEN pepsi_config_changed;"
				 " UPDATE pepsi.dispatch_stats SET started_at = now()");
	PQclear(res);
	/* The claim is sent on every wake: parse and plan it once. */
	res = PQprepare(conn, QUEUE_CLAIM_NAME, QUEUE_CLAIM_SQL, 7, NULL);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
	{
		log_warnx("cannot prepare the claim: %s", db_error(res, conn));
		PQclear(res);
		return false;
	}
	PQclear(res);

	/*
	 * Running rows that no worker of ours holds are orphans: back to
	 * pending.  Rows whose fate we decided while the connection was down
	 * (failed, timeout) are not: their recovery writes are still queued.
	 */
	buf_append_char(&inflight, '{');
	for (struct pool *p = dispatcher.pools; p; p = p->next)
		for (struct worker *w = p->workers; w; w = w->next)
			for (int i = 0; i < w->count; i++)
				buf_printf(&inflight, "%s%lld", count++ ? "," : "",
						   w->queue[(w->head + i) % w->ring].id);
	for (struct job *job = jobs_head; job; job = job->next)
		if (job->recovering.len > 0)
			buf_printf(&inflight, "%s%s", count++ ? "," : "", job->recovering.data);
	buf_append_char(&inflight, '}');
	values[0] = inflight.data;
	res = PQexecParams(conn, "SELECT pepsi.workqueue_reset_orphans($1::int8[])", 1, NULL, values,
					   NULL, NULL, 0);
	buf_free(&inflight);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("cannot reset orphaned rows: %s", db_error(res, conn));
		PQclear(res);
		return false;
	}
	if (atoi(PQgetvalue(res, 0, 0)) > 0)
		log_info("put %s orphaned running rows back to pending", PQgetvalue(res, 0, 0));
	PQclear(res);

	if (!overrides_applied)
	{
		char		err[1024];
		struct pepsi_config *cfg = config_load(dispatcher.config_path, err, sizeof(err));

		if (cfg == NULL)
			fatalx("%s", err);
		if (!db_load_overrides(conn, cfg, err, sizeof(err)))
			fatalx("%s", err);
		dispatch_apply_config(cfg);
		overrides_applied = true;
	}
	return true;
}

static void
queue_connect(void)
{
	char		err[1024];

	conn = db_connect(dispatcher.cfg, "pepsi-dispatch", err, sizeof(err));
	if (conn == NULL)
	{
		log_warnx("%s", err);
		queue_schedule_reconnect();
		return;
	}
	if (!queue_setup())
	{
		PQfinish(conn);
		conn = NULL;
		queue_schedule_reconnect();
		return;
	}
	if (PQsetnonblocking(conn, 1) != 0)
		fatalx("cannot make the database connection non-blocking");
	if (was_connected)
	{
		/*
		 * If the server went away, so did the workers' sessions, and a
		 * worker finds out only when its next load fails, failing the
		 * message.  Replacements start with fresh sessions.
		 */
		log_info("reconnected; the workers retire so that their replacements connect afresh");
		pools_retire_all();
	}
	was_connected = true;
	backoff = 0;
	ready = true;
	ev_io_set(&socket_reader, PQsocket(conn), EV_READ);
	ev_io_set(&socket_writer, PQsocket(conn), EV_WRITE);
	ev_io_start(dispatcher.loop, &socket_reader);
	log_info("connected to the database");
	claim_wanted = true;
	queue_kick();
}

void
queue_start(void)
{
	ev_io_init(&socket_reader, queue_on_readable, -1, EV_READ);
	ev_io_init(&socket_writer, queue_on_writable, -1, EV_WRITE);
	ev_timer_init(&reconnect_timer, queue_on_reconnect, 0, 0);
	ev_idle_init(&claim_idle, claim_on_idle);
	queue_connect();
}

bool
queue_drained(void)
{
	return running_job == NULL && jobs_head == NULL && !claim_running;
}

/*
 * At shutdown, after the workers are gone: run what is queued (the rows
 * they held go back to pending, the last statistics) synchronously.
 */
void
queue_finish(void)
{
	if (conn == NULL || !ready)
	{
		log_warnx("no database connection at shutdown: rows still running are reset when a "
				  "dispatcher next starts");
		return;
	}
	queue_flush_stats(true);
	PQsetnonblocking(conn, 0);
	ev_io_stop(dispatcher.loop, &socket_reader);
	ev_io_stop(dispatcher.loop, &socket_writer);
	if (running_job || claim_running)
	{
		PGresult   *res;

		while ((res = PQgetResult(conn)) != NULL)
		{
			if (claim_running)
			{
				/* Claimed as we stopped: give them straight back. */
				for (int i = 0; PQresultStatus(res) == PGRES_TUPLES_OK && i < PQntuples(res); i++)
				{
					struct inflight row = {.id = atoll(PQgetvalue(res, i, 0))};

					queue_recover(PQgetvalue(res, i, 1), &row, 1, "pending", NULL);
				}
			}
			else
				running_job->done(running_job, res);
			PQclear(res);
		}
		if (running_job)
			job_free(running_job);
		running_job = NULL;
		claim_running = false;
	}
	while (jobs_head)
	{
		struct job *job = jobs_head;
		PGresult   *res;

		jobs_head = job->next;
		res = PQexecParams(conn, job->sql, job->nparams, NULL,
						   (const char *const *) job->params, NULL, NULL, 0);
		job->done(job, res);
		PQclear(res);
		job_free(job);
	}
	jobs_tail = NULL;
	PQfinish(conn);
	conn = NULL;
	ready = false;
}
