/*
 * stage_commit.c: committing the outcomes of a pass.  One message's outcome
 * is one extension call; plain outcomes of a body-free stage's batch are
 * grouped by shape into one pepsi.workqueue_commit_many each.
 */
#include "runtime/stage.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <libpq-fe.h>

#include "base/log.h"
#include "base/xalloc.h"
#include "runtime/db.h"
#include "runtime/stage_internal.h"
#include "touched.h"

/* ---------------------------------------------------------------------------
 * Committing
 * ------------------------------------------------------------------------- */

int
stage_check_result(struct pepsi_ctx *ctx, PGresult *res, const char *what)
{
	if (PQresultStatus(res) == PGRES_TUPLES_OK || PQresultStatus(res) == PGRES_COMMAND_OK)
	{
		PQclear(res);
		return 0;
	}
	pepsi_error(ctx, "%s of row %lld failed: %s", what, ctx->id, db_error(res, ctx->worker->conn));
	PQclear(res);
	return -1;
}

static const char *
stage_transition_name(enum terminal_kind kind)
{
	switch (kind)
	{
		case TERMINAL_ADVANCE:
			return "advance";
		case TERMINAL_PAUSE:
		case TERMINAL_PAUSE_WITH:
			return "pause";
		case TERMINAL_FAIL:
			return "fail";
		case TERMINAL_FINISH:
		case TERMINAL_FINISH_WITH:
			return "finish";
		case TERMINAL_NONE:
		case TERMINAL_HELD_BY_CALL:
			break;
	}
	return NULL;
}

/* The stage a paused or failed row stays at: the one that paused it, even when fused. */
static const char *
stage_at_stage(const struct pepsi_ctx *ctx)
{
	return strcmp(ctx->stage_name, ctx->db_stage) != 0 ? ctx->stage_name : NULL;
}

/*
 * The statement that commits an outcome, carrying the message's mail_log
 * events (pepsi_mail_log) when it has any: a data-modifying CTE before the
 * call, so the rows are written by the same statement as the transition,
 * and exactly when it commits.  The events are parameter $events_param,
 * the row id always $1.
 */
static char *
stage_with_mail_log(const char *statement, const char *events, int events_param)
{
	if (events == NULL)
		return xstrdup(statement);
	return xasprintf("WITH logged AS (INSERT INTO pepsi.mail_log (workqueue_id, queue_id, event, detail)"
					 " SELECT $1::bigint, e ->> 'queue_id', e ->> 'event', e -> 'detail'"
					 " FROM jsonb_array_elements($%d::jsonb) AS e) %s",
					 events_param, statement);
}

const char *
stage_claim_token(const struct pepsi_ctx *ctx)
{
	return ctx->token[0] ? ctx->token : NULL;
}

/* Commit one message's outcome with one extension call. */
static int
stage_commit_attempt(struct pepsi_ctx *ctx)
{
	PGconn	  *conn = ctx->worker->conn;
	char	   id[32];
	char	   retry[64];
	char	  *merge = json_object_size(ctx->merge) ? stage_json_text(ctx->merge) : NULL;
	char	  *state = (ctx->touched & TOUCHED_SET_STATE) ? stage_json_text(ctx->state) : NULL;
	char	  *events;
	char	  *sql;
	char	  *clones = NULL;
	struct buf array = BUF_INIT;
	PGresult  *res;
	int		   rc;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	/* Infinity is a hold (pepsi_hold), which workqueue_commit takes in this spelling. */
	if (isinf(ctx->retry_seconds))
		snprintf(retry, sizeof(retry), "Infinity");
	else
		snprintf(retry, sizeof(retry), "%.3f", ctx->retry_seconds);
	events = ctx->mail_log ? stage_json_text(ctx->mail_log) : NULL;
	if (ctx->terminal == TERMINAL_PAUSE_WITH)
	{
		const char *values[9] = {id, ctx->db_stage, retry, merge, NULL, NULL, stage_at_stage(ctx),
								 stage_claim_token(ctx), events};

		if (ctx->nkeep > 0)
		{
			stage_int_array(&array, ctx->keep, ctx->nkeep);
			values[4] = array.data;
		}
		values[5] = clones = ctx->clones ? stage_json_text(ctx->clones) : NULL;
		sql = stage_with_mail_log("SELECT pepsi.workqueue_pause($1, $2, $3, $4, $5, $6, $7, $8::uuid)", events, 9);
		res = db_exec(conn, sql, events ? 9 : 8, values);
	}
	else if (ctx->terminal == TERMINAL_FINISH_WITH)
	{
		const char *values[5] = {id, ctx->db_stage, NULL, stage_claim_token(ctx), events};

		values[2] = clones = stage_json_text(ctx->clones);
		sql = stage_with_mail_log("SELECT pepsi.workqueue_finish_with_clones($1, $2, $3, $4::uuid)", events, 5);
		res = db_exec(conn, sql, events ? 5 : 4, values);
	}
	else
	{
		const char *values[14];
		int			lengths[14] = {0};
		int			formats[14] = {0};
		bool		finish = ctx->terminal == TERMINAL_FINISH;
		int			nparams = events ? 14 : 13;

		values[0] = id;
		values[1] = ctx->db_stage;
		values[2] = stage_transition_name(ctx->terminal);
		values[3] = ctx->terminal == TERMINAL_ADVANCE ? ctx->target : NULL;
		values[4] = finish ? NULL : merge;
		values[5] = ctx->terminal == TERMINAL_PAUSE ? retry : NULL;
		values[6] = !finish && (ctx->touched & TOUCHED_HEADERS) ? ctx->headers.data : NULL;
		lengths[6] = (int) ctx->headers.len;
		formats[6] = 1;
		values[7] = !finish && (ctx->touched & TOUCHED_BODY) ? ctx->body.data : NULL;
		lengths[7] = (int) ctx->body.len;
		formats[7] = 1;
		values[8] = !finish && (ctx->touched & TOUCHED_MAIL_FROM) ? ctx->mail_from : NULL;
		values[9] = NULL;
		if (!finish && (ctx->touched & TOUCHED_RCPT_TO))
		{
			buf_append_char(&array, '{');
			for (size_t i = 0; i < ctx->nrcpt; i++)
				db_array_append(&array, ctx->rcpt[i]);
			buf_append_char(&array, '}');
			values[9] = array.data;
		}
		values[10] = finish ? NULL : state;
		values[11] = ctx->terminal == TERMINAL_ADVANCE || finish ? NULL : stage_at_stage(ctx);
		values[12] = stage_claim_token(ctx);
		values[13] = events;
		sql = stage_with_mail_log("SELECT pepsi.workqueue_commit($1, $2, $3, $4, $5, $6, $7, $8,"
								  " $9, $10, $11, $12, $13::uuid)",
								  events, 14);
		/* Every row's: prepared once a session (db_exec_kept). */
		res = db_exec_kept(conn, sql, nparams, values, lengths, formats);
	}
	rc = stage_check_result(ctx, res, "commit");
	free(sql);
	free(events);
	free(merge);
	free(state);
	free(clones);
	buf_free(&array);
	return rc;
}

/*
 * Commit one message's outcome; if the session was lost, reconnect and try
 * once more.  Had the lost statement committed after all, the retry finds
 * the row no longer running and says so, and that outcome stands.
 */
static int
stage_commit_one(struct pepsi_ctx *ctx)
{
	int rc = stage_commit_attempt(ctx);

	if (rc != 0 && stage_reconnect(ctx->worker))
	{
		free(ctx->error);
		ctx->error = NULL;
		rc = stage_commit_attempt(ctx);
	}
	return rc;
}

/*
 * The outcome of a message whose stage wrote with it (pepsi_write_with_outcome),
 * committed in the transaction of those writes right after its pass, then
 * that transaction; on any failure it is all rolled back and the message
 * fails.  No second attempt on a new session as stage_commit_one makes:
 * the writes went with the old one.  A successor that would have been
 * fused late is not: the row advances to it.
 */
void
stage_commit_with_writes(struct pepsi_ctx *ctx)
{
	PGconn	 *conn = ctx->worker->conn;
	PGresult *res;
	bool	  commit;

	ctx->own_transaction = false;
	ctx->committed = true;
	ctx->awaiting_load = false;
	if (ctx->error == NULL && PQtransactionStatus(conn) == PQTRANS_INERROR)
		pepsi_error(ctx, "a statement %s made for row %lld failed (logged above), so nothing of it is committed",
					ctx->stage->program, ctx->id);
	if (ctx->error == NULL && ctx->terminal != TERMINAL_HELD_BY_CALL)
		stage_commit_attempt(ctx);
	commit = ctx->error == NULL;
	res = PQexec(conn, commit ? "COMMIT" : "ROLLBACK");
	/* COMMIT of a transaction an error aborted answers ROLLBACK, with no error. */
	if (commit
		&& (PQresultStatus(res) != PGRES_COMMAND_OK || strcmp(PQcmdStatus(res), "COMMIT") != 0))
		pepsi_error(ctx, "commit of row %lld failed: %s", ctx->id,
					PQresultStatus(res) == PGRES_COMMAND_OK ? "the transaction was rolled back"
															: db_error(res, conn));
	PQclear(res);
}

/*
 * May this outcome ride in an arrayed commit? Plain transitions with at
 * most a state merge, and finishes whatever the pass changed: a finished
 * row keeps none of it (a signed message relayed in the same pass).
 */
static bool
stage_batchable(const struct pepsi_ctx *ctx)
{
	/* (mail_log events ride a statement of their own message's commit) */
	if (ctx->error || ctx->committed || ctx->mail_log || (ctx->touched != 0 && ctx->terminal != TERMINAL_FINISH))
		return false;
	switch (ctx->terminal)
	{
		case TERMINAL_ADVANCE:
		case TERMINAL_FINISH:
			return true;
		case TERMINAL_PAUSE:
			/* a hold rides too: workqueue_commit_many takes +Infinity as one (the secretary's held mail) */
			return stage_at_stage(ctx) == NULL;
		case TERMINAL_FAIL:
			return stage_at_stage(ctx) == NULL;
		default:
			return false;
	}
}

/* One workqueue_commit_many for every batchable message with outcome kind. */
static void
stage_commit_shape(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count, enum terminal_kind kind)
{
	struct buf *ids = &w->scratch[SCRATCH_IDS];
	struct buf *stages = &w->scratch[SCRATCH_STAGES];
	struct buf *targets = &w->scratch[SCRATCH_TARGETS];
	struct buf *merges = &w->scratch[SCRATCH_MERGES];
	struct buf *retries = &w->scratch[SCRATCH_RETRIES];
	struct buf *tokens = &w->scratch[SCRATCH_TOKENS];
	size_t		members = 0;
	const char *values[7];
	PGresult   *res;

	buf_append_char(ids, '{');
	buf_append_char(stages, '{');
	buf_append_char(targets, '{');
	buf_append_char(merges, '{');
	buf_append_char(retries, '{');
	buf_append_char(tokens, '{');
	for (size_t i = 0; i < count; i++)
	{
		struct pepsi_ctx *ctx = &ctxs[i];
		char			 *merge;

		if (!stage_batchable(ctx) || ctx->terminal != kind)
			continue;
		buf_printf(ids, "%s%lld", members ? "," : "", ctx->id);
		db_array_append(stages, ctx->db_stage);
		db_array_append(targets, ctx->target);
		merge = json_object_size(ctx->merge) ? stage_json_text(ctx->merge) : NULL;
		db_array_append(merges, merge);
		free(merge);
		if (isinf(ctx->retry_seconds))
			buf_printf(retries, "%sInfinity", members ? "," : "");
		else
			buf_printf(retries, "%s%.3f", members ? "," : "", ctx->retry_seconds);
		buf_printf(tokens, "%s%s", members ? "," : "", ctx->token[0] ? ctx->token : "NULL");
		members++;
	}
	buf_append_char(ids, '}');
	buf_append_char(stages, '}');
	buf_append_char(targets, '}');
	buf_append_char(merges, '}');
	buf_append_char(retries, '}');
	buf_append_char(tokens, '}');

	if (members == 1)
	{
		/* One row: the single-row commit is the cheaper statement. */
		for (size_t i = 0; i < count; i++)
			if (stage_batchable(&ctxs[i]) && ctxs[i].terminal == kind)
				stage_commit_one(&ctxs[i]);
	}
	else if (members > 1)
	{
		values[0] = ids->data;
		values[1] = stages->data;
		values[2] = stage_transition_name(kind);
		values[3] = kind == TERMINAL_ADVANCE ? targets->data : NULL;
		values[4] = kind == TERMINAL_FINISH ? NULL : merges->data;
		values[5] = kind == TERMINAL_PAUSE ? retries->data : NULL;
		values[6] = tokens->data;
		res = db_exec(w->conn, "SELECT pepsi.workqueue_commit_many($1, $2, $3, $4, $5, $6, $7::uuid[])",
					  7, values);
		if (PQresultStatus(res) != PGRES_TUPLES_OK)
		{
			/* One row refused spoils the statement: commit them one by one to find it. */
			log_warnx("batch commit failed (%s); committing row by row", db_error(res, w->conn));
			for (size_t i = 0; i < count; i++)
				if (stage_batchable(&ctxs[i]) && ctxs[i].terminal == kind)
					stage_commit_one(&ctxs[i]);
		}
		PQclear(res);
	}
	buf_reset(ids);
	buf_reset(stages);
	buf_reset(targets);
	buf_reset(merges);
	buf_reset(retries);
	buf_reset(tokens);
}

void
stage_commit_all(struct stage_worker *w, struct pepsi_ctx *ctxs, size_t count)
{
	static const enum terminal_kind shapes[] = {TERMINAL_ADVANCE, TERMINAL_PAUSE, TERMINAL_FAIL,
												TERMINAL_FINISH};

	if (count > 1)
		for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++)
			stage_commit_shape(w, ctxs, count, shapes[s]);
	for (size_t i = 0; i < count; i++)
		if (ctxs[i].error == NULL && !ctxs[i].committed && ctxs[i].terminal != TERMINAL_HELD_BY_CALL
			&& (count == 1 || !stage_batchable(&ctxs[i])))
			stage_commit_one(&ctxs[i]);
}
