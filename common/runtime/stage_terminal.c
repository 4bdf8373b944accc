/*
 * stage_terminal.c: the terminals (one per message, recorded in memory and
 * committed by stage_commit.c) and the fan-out helpers, which call the
 * extension at once.
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
#include "delivery/maillog.h"
#include "message/queue_id.h"
#include "runtime/db.h"
#include "runtime/stage_internal.h"
#include "touched.h"

/* ---------------------------------------------------------------------------
 * Terminals
 * ------------------------------------------------------------------------- */

int
stage_terminal(struct pepsi_ctx *ctx, enum terminal_kind kind)
{
	if (++ctx->terminals > 1)
		return pepsi_error(ctx, "%s called a second terminal for row %lld",
						   ctx->stage->program, ctx->id);
	ctx->terminal = kind;
	return 0;
}

int
pepsi_advance_to(struct pepsi_ctx *ctx, const char *stage)
{
	if (stage == NULL || *stage == '\0')
		return pepsi_error(ctx, "%s advanced to no stage", ctx->stage->program);
	if (stage_terminal(ctx, TERMINAL_ADVANCE) != 0)
		return -1;
	free(ctx->target);
	ctx->target = xstrdup(stage);
	return 0;
}

int
pepsi_advance(struct pepsi_ctx *ctx)
{
	const char *next = pepsi_option(ctx, "NEXT_STAGE");

	if (next == NULL)
		return pepsi_error(ctx, "[%s] has no NEXT_STAGE to advance to", ctx->section);
	return pepsi_advance_to(ctx, next);
}

int
pepsi_reroute(struct pepsi_ctx *ctx, const char *stage, json_t *merge)
{
	pepsi_merge_state(ctx, merge);
	return pepsi_advance_to(ctx, stage);
}

int
pepsi_pause(struct pepsi_ctx *ctx, json_t *merge, double seconds)
{
	if (!(seconds >= 0))
		return pepsi_error(ctx, "%s paused for a negative time", ctx->stage->program);
	pepsi_merge_state(ctx, merge);
	if (stage_terminal(ctx, TERMINAL_PAUSE) != 0)
		return -1;
	ctx->retry_seconds = seconds;
	return 0;
}

int
pepsi_hold(struct pepsi_ctx *ctx, json_t *merge)
{
	return pepsi_pause(ctx, merge, INFINITY);
}

/* The fan-out and clone paths do not carry content rewrites: refuse rather than drop them. */
static int
stage_refuse_content(struct pepsi_ctx *ctx, const char *what)
{
	if (ctx->touched != 0)
		return pepsi_error(ctx, "%s rewrote the message and then called %s, which cannot "
								"commit the rewrite",
						   ctx->stage->program, what);
	return 0;
}

int
pepsi_pause_with(struct pepsi_ctx *ctx, json_t *merge, double seconds, const int *keep_indices,
				 size_t nkeep, json_t *clones)
{
	if (stage_refuse_content(ctx, "pause_with") != 0)
		return -1;
	if (pepsi_pause(ctx, merge, seconds) != 0)
		return -1;
	ctx->terminal = TERMINAL_PAUSE_WITH;
	if (keep_indices && nkeep > 0)
	{
		ctx->keep = xcalloc(nkeep, sizeof(int));
		memcpy(ctx->keep, keep_indices, nkeep * sizeof(int));
		ctx->nkeep = nkeep;
	}
	ctx->clones = clones ? json_incref(clones) : NULL;
	return 0;
}

int
pepsi_fail(struct pepsi_ctx *ctx, json_t *merge)
{
	pepsi_merge_state(ctx, merge);
	return stage_terminal(ctx, TERMINAL_FAIL);
}

json_t *
pepsi_hold_args(struct pepsi_ctx *ctx)
{
	const char *at_stage = strcmp(ctx->stage_name, ctx->db_stage) != 0 ? ctx->stage_name : NULL;

	if (ctx->error || ctx->terminals != 0 || ctx->touched != 0 || ctx->mail_log || ctx->split_done)
		return NULL;
	return json_pack("{s:s,s:s?,s:s?,s:O}", "expected_stage", ctx->db_stage, "at_stage", at_stage,
					 "claim_token", stage_claim_token(ctx), "merge", ctx->merge);
}

int
pepsi_held_by_call(struct pepsi_ctx *ctx)
{
	if (ctx->touched != 0 || ctx->mail_log || ctx->split_done)
		return pepsi_error(ctx, "%s changed row %lld after its hold was committed", ctx->stage->program,
						   ctx->id);
	return stage_terminal(ctx, TERMINAL_HELD_BY_CALL);
}

bool
pepsi_batch_begin(struct pepsi_ctx *ctx, char *err, size_t errlen)
{
	PGresult *res = PQexec(ctx->worker->conn, "BEGIN");
	bool	  ok = PQresultStatus(res) == PGRES_COMMAND_OK;

	if (!ok)
		snprintf(err, errlen, "BEGIN: %s", db_error(res, ctx->worker->conn));
	PQclear(res);
	return ok;
}

bool
pepsi_batch_end(struct pepsi_ctx *ctx, bool commit, char *err, size_t errlen)
{
	PGresult *res = PQexec(ctx->worker->conn, commit ? "COMMIT" : "ROLLBACK");
	/* COMMIT of a transaction an error aborted answers ROLLBACK, with no error. */
	bool ok = PQresultStatus(res) == PGRES_COMMAND_OK && strcmp(PQcmdStatus(res), commit ? "COMMIT" : "ROLLBACK") == 0;

	if (!ok)
		snprintf(err, errlen, "%s: %s", commit ? "COMMIT" : "ROLLBACK",
				 PQresultStatus(res) == PGRES_COMMAND_OK ? "the transaction was rolled back" : db_error(res, ctx->worker->conn));
	PQclear(res);
	return ok;
}

bool
pepsi_write_with_outcome(struct pepsi_ctx *ctx, char *err, size_t errlen)
{
	PGconn	 *conn = ctx->worker->conn;
	PGresult *res;
	bool	  ok;

	if (ctx->own_transaction)
		return true;
	if (PQtransactionStatus(conn) != PQTRANS_IDLE)
	{
		snprintf(err, errlen, "the session is not idle: another transaction is open");
		return false;
	}
	res = PQexec(conn, "BEGIN");
	ok = PQresultStatus(res) == PGRES_COMMAND_OK;
	if (!ok)
		snprintf(err, errlen, "BEGIN: %s", db_error(res, conn));
	PQclear(res);
	ctx->own_transaction = ok;
	return ok;
}

int
pepsi_finish(struct pepsi_ctx *ctx)
{
	return stage_terminal(ctx, TERMINAL_FINISH);
}

int
pepsi_finish_with(struct pepsi_ctx *ctx, json_t *clones)
{
	if (stage_terminal(ctx, TERMINAL_FINISH_WITH) != 0)
		return -1;
	ctx->clones = clones ? json_incref(clones) : json_array();
	return 0;
}

int
pepsi_advance_or_finish(struct pepsi_ctx *ctx)
{
	return pepsi_option(ctx, "NEXT_STAGE") ? pepsi_advance(ctx) : pepsi_finish(ctx);
}

/*
 * After a successful delivery: when the stage originates success DSNs
 * (ORIGINATE_SUCCESS_DSN) and a recipient asked for one (NOTIFY=SUCCESS),
 * reroute to BOUNCE_STAGE with state.bounce.kind = success; otherwise
 * advance or finish.
 */
int
pepsi_complete_success(struct pepsi_ctx *ctx)
{
	bool		originate = pepsi_option_bool(ctx, "ORIGINATE_SUCCESS_DSN");
	const char *bounce_stage = pepsi_option(ctx, "BOUNCE_STAGE");
	json_t	   *rcpts = json_object_get(json_object_get(stage_state(ctx), "dsn"), "rcpt");
	bool		wanted = false;
	size_t		i;
	json_t	   *r;

	if (originate)
		json_array_foreach (rcpts, i, r)
		{
			const char *notify = json_string_value(json_object_get(r, "notify"));

			if (notify && strcasestr(notify, "SUCCESS"))
				wanted = true;
		}
	if (wanted && bounce_stage)
	{
		json_t *merge = json_pack("{s:{s:s}}", "bounce", "kind", "success");
		int		rc = pepsi_reroute(ctx, bounce_stage, merge);

		json_decref(merge);
		return rc;
	}
	return pepsi_advance_or_finish(ctx);
}

int
pepsi_rewrite_recipients(struct pepsi_ctx *ctx, const char *const *rcpt, size_t count,
						 json_t *state)
{
	if (count == 0)
		return pepsi_error(ctx, "%s rewrote the recipients to none", ctx->stage->program);
	pepsi_set_rcpt_to(ctx, rcpt, count);
	if (state)
		pepsi_set_state(ctx, state);
	return pepsi_advance(ctx);
}

/* ---------------------------------------------------------------------------
 * Fan-out helpers: immediate extension calls
 * ------------------------------------------------------------------------- */

/* Re-read the row's recipients and state after a split (merges stay applied). */
static int
stage_reload_recipients(struct pepsi_ctx *ctx)
{
	char		 id[32];
	const char	*values[1] = {id};
	PGresult	*res;
	json_t		*rcpt;
	json_t		*state;
	json_error_t jerr;
	size_t		 i;
	json_t		*value;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	res = db_exec(ctx->worker->conn, "SELECT array_to_json(rcpt_to)::text, state::text"
									 " FROM pepsi.workqueue WHERE id = $1",
				  1, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
	{
		pepsi_error(ctx, "cannot re-read row %lld after a split: %s", ctx->id,
					db_error(res, ctx->worker->conn));
		PQclear(res);
		return -1;
	}
	rcpt = json_loads(PQgetvalue(res, 0, 0), 0, &jerr);
	state = json_loads(PQgetvalue(res, 0, 1), 0, &jerr);
	PQclear(res);
	for (size_t k = 0; k < ctx->nrcpt; k++)
		free(ctx->rcpt[k]);
	free(ctx->rcpt);
	ctx->nrcpt = json_array_size(rcpt);
	ctx->rcpt = xcalloc(ctx->nrcpt + 1, sizeof(char *));
	json_array_foreach (rcpt, i, value)
		ctx->rcpt[i] = xstrdup(json_string_value(value));
	json_decref(rcpt);
	json_decref(ctx->state);
	ctx->state = state ? state : json_object();
	json_object_update(ctx->state, ctx->merge);
	return 0;
}

static int
stage_fan_out_call(struct pepsi_ctx *ctx, const char *sql, int nparams, const char *const *values,
				   const char *what)
{
	PGresult *res;
	int		  created;

	if (stage_refuse_content(ctx, what) != 0)
		return -1;
	if (strcmp(ctx->stage_name, ctx->db_stage) != 0)
		return pepsi_error(ctx, "%s called %s in a fused pass; its can_fuse must refuse rows "
								"it may split",
						   ctx->stage->program, what);
	res = db_exec(ctx->worker->conn, sql, nparams, values);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
	{
		pepsi_error(ctx, "%s of row %lld failed: %s", what, ctx->id, db_error(res, ctx->worker->conn));
		PQclear(res);
		return -1;
	}
	created = atoi(PQgetvalue(res, 0, 0));
	PQclear(res);
	ctx->split_done = true;
	return stage_reload_recipients(ctx) == 0 ? created : -1;
}

void
stage_int_array(struct buf *b, const int *values, size_t count)
{
	buf_append_char(b, '{');
	for (size_t i = 0; i < count; i++)
		buf_printf(b, "%s%d", i ? "," : "", values[i]);
	buf_append_char(b, '}');
}

int
pepsi_split_off_recipients(struct pepsi_ctx *ctx, const int *indices, size_t count,
						   const char *target_stage)
{
	struct buf	array = BUF_INIT;
	char		id[32];
	const char *values[5];
	int			rc;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	stage_int_array(&array, indices, count);
	values[0] = id;
	values[1] = ctx->db_stage;
	values[2] = array.data;
	values[3] = target_stage;
	values[4] = stage_claim_token(ctx);
	rc = stage_fan_out_call(ctx, "SELECT 1 FROM pepsi.workqueue_split_off($1, $2, $3, $4, $5::uuid)",
							5, values, "split_off_recipients");
	buf_free(&array);
	return rc;
}

int
pepsi_split_to_one_per_row(struct pepsi_ctx *ctx)
{
	char		id[32];
	const char *values[3] = {id, ctx->db_stage, stage_claim_token(ctx)};

	snprintf(id, sizeof(id), "%lld", ctx->id);
	return stage_fan_out_call(ctx,
							  "SELECT coalesce(cardinality(pepsi.workqueue_split_one_per_row($1, $2, $3::uuid)), 0)",
							  3, values, "split_to_one_per_row");
}

int
pepsi_fan_out(struct pepsi_ctx *ctx, const int *keep, size_t nkeep, json_t *groups)
{
	struct buf	array = BUF_INIT;
	char		id[32];
	char	   *groups_text = stage_json_text(groups);
	const char *values[5];
	int			rc;

	snprintf(id, sizeof(id), "%lld", ctx->id);
	stage_int_array(&array, keep, nkeep);
	values[0] = id;
	values[1] = ctx->db_stage;
	values[2] = array.data;
	values[3] = groups_text;
	values[4] = stage_claim_token(ctx);
	rc = stage_fan_out_call(ctx, "SELECT coalesce(cardinality(pepsi.workqueue_split($1, $2, $3, $4, $5::uuid)), 0)",
							5, values, "fan_out");
	free(groups_text);
	buf_free(&array);
	return rc;
}

/*
 * workqueue_inject through sql, whose $1..$7 are its arguments and $8..
 * the extra ones; the id of its one row, 0 for none or NULL, -1 on error.
 */
static long long
stage_inject(struct pepsi_ctx *ctx, const char *sql, const char *stage, const char *mail_from,
			 const char *const *rcpt, size_t nrcpt, const char *headers, size_t hlen,
			 const char *body, size_t blen, json_t *state, const char *token,
			 const char *const *extra, int nextra)
{
	struct buf	array = BUF_INIT;
	json_t	   *with_id = state ? json_copy(state) : json_object();
	char		queue_id[QUEUE_ID_LEN + 1];
	char	   *state_text;
	const char *values[9];
	int			lengths[9] = {0};
	int			formats[9] = {0};
	PGresult   *res;
	long long	id = 0;

	/* A new message: a queue id of its own, unless the caller gave one. */
	if (json_string_value(json_object_get(with_id, "queue_id")) == NULL)
	{
		pepsi_new_queue_id(ctx, queue_id);
		json_object_set_new(with_id, "queue_id", json_string(queue_id));
	}
	else
		snprintf(queue_id, sizeof(queue_id), "%s", json_string_value(json_object_get(with_id, "queue_id")));
	state_text = stage_json_text(with_id);
	json_decref(with_id);
	buf_append_char(&array, '{');
	for (size_t i = 0; i < nrcpt; i++)
		db_array_append(&array, rcpt[i]);
	buf_append_char(&array, '}');
	values[0] = stage;
	values[1] = mail_from;
	values[2] = array.data;
	values[3] = headers;
	lengths[3] = (int) hlen;
	formats[3] = 1;
	values[4] = body;
	lengths[4] = (int) blen;
	formats[4] = 1;
	values[5] = state_text;
	values[6] = token;
	for (int i = 0; i < nextra && i < 2; i++)
		values[7 + i] = extra[i];
	res = PQexecParams(ctx->worker->conn, sql, 7 + nextra, NULL, values, lengths, formats, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		pepsi_error(ctx, "enqueue_new at stage %s failed: %s", stage, db_error(res, ctx->worker->conn));
	else if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0))
	{
		id = atoll(PQgetvalue(res, 0, 0));
		maillog_queued(queue_id, mail_from, hlen + blen + 2, nrcpt, id);
	}
	PQclear(res);
	free(state_text);
	buf_free(&array);
	return ctx->error ? -1 : id;
}

json_t *
pepsi_call_json(struct pepsi_ctx *ctx, const char *sql, int nparams, const char *const *values)
{
	PGresult	*res = db_exec(ctx->worker->conn, sql, nparams, values);
	json_t		*answer = NULL;
	json_error_t jerr;

	ctx->queued_unknown = true; /* any function: it may have queued rows (stage_queued_at) */

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 || PQnfields(res) != 1)
		pepsi_error(ctx, "%s failed: %s", sql, db_error(res, ctx->worker->conn));
	else if (PQgetisnull(res, 0, 0))
		answer = json_null();
	else if ((answer = json_loads(PQgetvalue(res, 0, 0), JSON_DECODE_ANY, &jerr)) == NULL)
		pepsi_error(ctx, "%s: the answer is not JSON: %s", sql, jerr.text);
	PQclear(res);
	return answer;
}

json_t *
pepsi_read_json(struct pepsi_ctx *ctx, const char *sql, int nparams, const char *const *values, char *err,
				size_t errlen)
{
	PGresult	*res = db_exec(ctx->worker->conn, sql, nparams, values);
	json_t		*answer = NULL;
	json_error_t jerr;

	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 || PQnfields(res) != 1)
		snprintf(err, errlen, "%s", db_error(res, ctx->worker->conn));
	else if (PQgetisnull(res, 0, 0))
		answer = json_null();
	else if ((answer = json_loads(PQgetvalue(res, 0, 0), JSON_DECODE_ANY, &jerr)) == NULL)
		snprintf(err, errlen, "the answer is not JSON: %s", jerr.text);
	PQclear(res);
	return answer;
}

long long
pepsi_enqueue_new(struct pepsi_ctx *ctx, const char *stage, const char *mail_from,
				  const char *const *rcpt, size_t nrcpt, const char *headers, size_t hlen,
				  const char *body, size_t blen, json_t *state, const char *token)
{
	return stage_inject(ctx, "SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, $6, $7)", stage,
						mail_from, rcpt, nrcpt, headers, hlen, body, blen, state, token, NULL, 0);
}

long long
pepsi_enqueue_autoreply(struct pepsi_ctx *ctx, const char *responder, double interval,
						const char *stage, const char *mail_from, const char *recipient,
						const char *headers, size_t hlen, const char *body, size_t blen,
						json_t *state, const char *token)
{
	char		seconds[64];
	const char *extra[2] = {responder, seconds};

	snprintf(seconds, sizeof(seconds), "%.3f", interval);
	return stage_inject(ctx,
						"SELECT pepsi.workqueue_inject($1, $2, $3, $4, $5, $6, $7)"
						" FROM pepsi.autoreply_due($8, ($3::text[])[1], $9 * interval '1 second') AS d (due)"
						" WHERE d.due",
						stage, mail_from, &recipient, 1, headers, hlen, body, blen, state, token, extra, 2);
}
