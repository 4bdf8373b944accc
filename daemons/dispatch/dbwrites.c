/*
 * dbwrites.c: what the dispatcher writes through its connection (dbconn.c)
 * besides the claim: the rows it puts back or isolates when a worker could
 * not conclude them, its statistics, and the configuration overrides it
 * reads on a reload.  Each is a job run in turn with the others; a job in
 * flight when the connection is lost is sent again, so each must be safe
 * to repeat.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "dispatch.h"
#include "runtime/db.h"

static void
job_log_failure(struct job *job, PGresult *res)
{
	if (PQresultStatus(res) != PGRES_TUPLES_OK && PQresultStatus(res) != PGRES_COMMAND_OK)
		log_warnx("database: %s", db_error(res, dbconn_pq()));
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
	const char *queue_id;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		log_warnx("database: %s", db_error(res, dbconn_pq()));
		return;
	}
	if (PQgetisnull(res, 0, 0))
		return; /* its worker committed it before it died */
	outcome = PQgetvalue(res, 0, 0);
	queue_id = PQgetvalue(res, 0, 1);
	if (strcmp(outcome, "paused") == 0)
		log_info("%s: row %s paused for a retry: %s", queue_id, job->params[0], job->params[2]);
	else
	{
		log_warnx("%s: row %s isolated as %s after %s attempts that ended its worker (CRASH_LIMIT): %s",
				  queue_id, job->params[0], outcome, job->params[3], job->params[2]);
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
	/* With the row's queue id for the log, read in the statement's snapshot (before the change). */
	struct job *job = job_new("SELECT pepsi.workqueue_crashed($1, $2, $3, $4, $5, $6, $7::uuid),"
							  " (SELECT coalesce(state ->> 'queue_id', id::text) FROM pepsi.workqueue"
							  "   WHERE id = $1)",
							  crashed_done);
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
		log_warnx("cannot flush statistics: %s", db_error(res, dbconn_pq()));
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
void
dbconn_apply_overrides(PGresult *res, bool starting)
{
	char				 err[1024];
	struct pepsi_config *cfg;

	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		if (starting)
			fatalx("cannot read pepsi.config_override: %s", db_error(res, dbconn_pq()));
		log_warnx("cannot read pepsi.config_override: %s", db_error(res, dbconn_pq()));
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
