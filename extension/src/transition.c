/*
 * transition.c: every change of a row's status after admission.
 *
 * A stage's outcome is one statement (workqueue_commit) that writes exactly
 * the columns the stage touched together with its transition, guarded by
 * "the row is running at the stage I think": a stale caller gets an error
 * and writes nothing.  The arrayed form serves batched body-free stages; the
 * operator and maintenance transitions (resume, requeue, orphan reset) are
 * here too, as is the trigger that sends a row that becomes pending to the
 * back of its stage's queue.
 *
 * Every statement here that makes a row pending draws its pending_seq
 * itself (PENDING_SEQ_NEXT): the trigger then has nothing to do, and being
 * an AFTER trigger (see workqueue_pending_seq_trigger) it costs the UPDATEs
 * that do not need it nothing but its WHEN.
 */
#include "pepsi.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include <math.h>

#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "../../schema/touched.h"

PG_FUNCTION_INFO_V1(workqueue_commit);
PG_FUNCTION_INFO_V1(workqueue_commit_many);
PG_FUNCTION_INFO_V1(workqueue_pause);
PG_FUNCTION_INFO_V1(workqueue_finish_with_clones);
PG_FUNCTION_INFO_V1(workqueue_resume);
PG_FUNCTION_INFO_V1(workqueue_requeue_due);
PG_FUNCTION_INFO_V1(workqueue_reset_orphans);
PG_FUNCTION_INFO_V1(workqueue_pending_seq_trigger);

/* The outcome shapes: advance_to and reroute commit like advance. */
typedef enum TransitionKind
{
	TRANSITION_ADVANCE,
	TRANSITION_PAUSE,
	TRANSITION_FAIL,
	TRANSITION_FINISH,
	TRANSITION_KINDS
} TransitionKind;

/* Columns a stage may have touched (bits shared with the stage runtime) key the plan cache. */

/*
 * The SET item that sends a row to the back of its stage's pending queue,
 * for every statement that makes a row pending (see the file comment).
 */
#define PENDING_SEQ_NEXT "pending_seq = nextval('pepsi.pending_seq')"

static TransitionKind
transition_kind(Datum transition, const char **label)
{
	*label = DatumGetCString(DirectFunctionCall1(enum_out, transition));
	if (strcmp(*label, "advance") == 0 || strcmp(*label, "advance_to") == 0
		|| strcmp(*label, "reroute") == 0)
		return TRANSITION_ADVANCE;
	if (strcmp(*label, "pause") == 0)
		return TRANSITION_PAUSE;
	if (strcmp(*label, "fail") == 0)
		return TRANSITION_FAIL;
	if (strcmp(*label, "finish") == 0)
		return TRANSITION_FINISH;
	elog(ERROR, "unknown transition \"%s\"", *label);
}

static TransitionKind
transition_arg(FunctionCallInfo fcinfo, int argno, const char **label)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("transition must not be null"),
				 errhint("One of advance, advance_to, reroute, pause, fail, finish.")));
	return transition_kind(PG_GETARG_DATUM(argno), label);
}

/* The target and retry arguments are required by one transition and meaningless to the others. */
static void
transition_check_extras(TransitionKind kind, const char *label, bool has_target, bool has_retry)
{
	if (kind == TRANSITION_ADVANCE && !has_target)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s needs a target stage", label),
				 errhint("Pass the section name of the next stage (NEXT_STAGE, or BOUNCE_STAGE for a reroute).")));
	if (kind != TRANSITION_ADVANCE && has_target)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a target stage is meaningless for %s", label),
				 errdetail("Only advance, advance_to and reroute move a row to another stage.")));
	if (kind != TRANSITION_PAUSE && has_retry)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a retry time is meaningless for %s", label),
				 errdetail("Only pause sets a time for the row to be retried.")));
}

/* Build the guarded single-row statement for one outcome and column set. */
static char *
transition_commit_sql(TransitionKind kind, int touched, bool tokens)
{
	StringInfoData sql;

	initStringInfo(&sql);
	if (kind == TRANSITION_FINISH)
	{
		appendStringInfoString(&sql, "DELETE FROM pepsi.workqueue");
	}
	else
	{
		appendStringInfoString(&sql, "UPDATE pepsi.workqueue SET ");
		if (kind == TRANSITION_ADVANCE)
			appendStringInfoString(&sql, "stage = $3, status = 'pending', " PENDING_SEQ_NEXT);
		else if (kind == TRANSITION_PAUSE)
			appendStringInfoString(&sql, "status = 'paused', timeout = CASE WHEN $5 = 'Infinity'::float8"
										 " THEN 'infinity'::timestamptz ELSE now() + $5 * interval '1 second' END");
		else
			appendStringInfoString(&sql, "status = 'failed'");

		if ((touched & TOUCHED_SET_STATE) && (touched & TOUCHED_MERGE_STATE))
			appendStringInfoString(&sql, ", state = $10 || $4");
		else if (touched & TOUCHED_SET_STATE)
			appendStringInfoString(&sql, ", state = $10");
		else if (touched & TOUCHED_MERGE_STATE)
			appendStringInfoString(&sql, ", state = state || $4");
		if (touched & TOUCHED_HEADERS)
			appendStringInfoString(&sql, ", headers = $6");
		if (touched & TOUCHED_BODY)
			appendStringInfoString(&sql, ", body_id = $7");
		if (touched & TOUCHED_MAIL_FROM)
			appendStringInfoString(&sql, ", mail_from = $8");
		if (touched & TOUCHED_RCPT_TO)
			appendStringInfoString(&sql, ", rcpt_to = $9");
		if (touched & TOUCHED_AT_STAGE)
			appendStringInfoString(&sql, ", stage = $11");
	}
	appendStringInfoString(&sql, " WHERE id = $1 AND status = 'running' AND stage = $2");
	if (tokens)
		appendStringInfoString(&sql, " AND claim_digest IS NOT DISTINCT FROM $12");
	return sql.data;
}

/* For a body rewrite: lock the row (checking it) and return its current body. */
static int64
transition_lock_for_body_rewrite(Datum id, Datum expected_stage, pg_uuid_t *token)
{
	static SPIPlanPtr plans[2];

	queue_lock_running_row_column(plans, "body_id", DatumGetInt64(id), expected_stage, token);
	return queue_result_int64(0, 1);
}

/*
 * workqueue_commit(id, expected_stage, transition, target_stage,
 *                  merge_state, retry_seconds, set_headers, set_body,
 *                  set_mail_from, set_rcpt_to, set_state, at_stage
 *                  [, claim_token])
 *
 * Content arguments left NULL are not written.  at_stage is for a pause or
 * fail decided by a successor stage fused into the pass: the row stays
 * where that stage is, so its retry runs that stage again.  A pause with
 * retry_seconds 'Infinity' puts the row on hold (timeout 'infinity', as
 * pepsi.queue_hold does) until pepsi.queue_release.  A body rewrite stores a new
 * body for this row alone (copy-on-write: siblings keep the old one) and
 * releases the old body if this row was its last reference.  With finish
 * the row is deleted, so content arguments are moot and ignored.
 * claim_token is the token the claim returned with the row (the overload
 * without it, and a NULL token, match only a row claimed without one).
 */
Datum
workqueue_commit(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plans[2][TRANSITION_KINDS][TOUCHED_COMBINATIONS];
	static const Oid  argtypes[] = {INT8OID, TEXTOID, TEXTOID, JSONBOID, FLOAT8OID, BYTEAOID,
									INT8OID, TEXTOID, TEXTARRAYOID, JSONBOID, TEXTOID, BYTEAOID};
	Datum			  values[12];
	char			  nulls[12] = "            ";
	pg_uuid_t		 *token = arg_claim_token(fcinfo, 12);
	bool			  tokens = queue_has_claim_digest();
	SPIPlanPtr		 *plan;
	const char		 *label;
	TransitionKind	  kind;
	int				  touched = 0;
	int64			  id = arg_int64(fcinfo, 0, "id");
	text			 *expected_stage = arg_stage(fcinfo, 1, "expected_stage");
	int64			  old_body_id = 0;

	kind = transition_arg(fcinfo, 2, &label);
	transition_check_extras(kind, label, !PG_ARGISNULL(3), !PG_ARGISNULL(5));

	memset(values, 0, sizeof(values));
	values[0] = Int64GetDatum(id);
	values[1] = PointerGetDatum(expected_stage);
	nulls[2] = nulls[3] = nulls[4] = nulls[5] = nulls[6] = nulls[7] = nulls[8] = nulls[9] = 'n';
	nulls[10] = 'n';
	values[11] = queue_token_digest_arg(token, nulls, 11);
	if (!PG_ARGISNULL(11))
	{
		if (kind != TRANSITION_PAUSE && kind != TRANSITION_FAIL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("at_stage is meaningless for %s", label),
					 errdetail("Only a pause or a failure stays at a stage; an advance names its target_stage.")));
		values[10] = PointerGetDatum(arg_stage(fcinfo, 11, "at_stage"));
		nulls[10] = ' ';
		touched |= TOUCHED_AT_STAGE;
	}
	if (kind == TRANSITION_ADVANCE)
	{
		values[2] = PointerGetDatum(arg_stage(fcinfo, 3, "target_stage"));
		nulls[2] = ' ';
	}
	if (kind == TRANSITION_PAUSE)
	{
		values[4] = Float8GetDatum(arg_seconds_or_hold(fcinfo, 5, "retry_seconds"));
		nulls[4] = ' ';
	}
	if (kind != TRANSITION_FINISH)
	{
		if (!PG_ARGISNULL(4))
		{
			values[3] = PointerGetDatum(arg_json_object_or_null(fcinfo, 4, "merge_state"));
			nulls[3] = ' ';
			touched |= TOUCHED_MERGE_STATE;
		}
		if (!PG_ARGISNULL(6))
		{
			values[5] = PG_GETARG_DATUM(6);
			nulls[5] = ' ';
			touched |= TOUCHED_HEADERS;
		}
		if (!PG_ARGISNULL(7))
			touched |= TOUCHED_BODY;
		if (!PG_ARGISNULL(8))
		{
			values[7] = PointerGetDatum(arg_address(fcinfo, 8, "set_mail_from"));
			nulls[7] = ' ';
			touched |= TOUCHED_MAIL_FROM;
		}
		if (!PG_ARGISNULL(9))
		{
			values[8] = PointerGetDatum(arg_recipients(fcinfo, 9, "set_rcpt_to"));
			nulls[8] = ' ';
			touched |= TOUCHED_RCPT_TO;
		}
		if (!PG_ARGISNULL(10))
		{
			values[9] = PointerGetDatum(arg_json_object_or_null(fcinfo, 10, "set_state"));
			nulls[9] = ' ';
			touched |= TOUCHED_SET_STATE;
		}
	}

	SPI_connect();
	if (touched & TOUCHED_BODY)
	{
		old_body_id = transition_lock_for_body_rewrite(values[0], values[1], token);
		values[6] = Int64GetDatum(body_store(PG_GETARG_BYTEA_PP(7)));
		nulls[6] = ' ';
	}
	plan = &plans[tokens ? 0 : 1][kind][touched];
	if (*plan == NULL)
		queue_plan(plan, transition_commit_sql(kind, touched, tokens), 12, argtypes);
	if (!tokens && token != NULL)
		queue_report_row_state(id, text_to_cstring(expected_stage), token);
	queue_exec(*plan, values, nulls, false, 0);
	if (SPI_processed == 0)
		queue_report_row_state(id, text_to_cstring(expected_stage), token);
	if (touched & TOUCHED_BODY)
		body_release_if_unreferenced(old_body_id);
	SPI_finish();
	PG_RETURN_VOID();
}

/* Raise the error for the first id of a batch that was not committed. */
static void
transition_report_batch(Datum *ids, Datum *stages, pg_uuid_t **tokens, int count)
{
	int64 *committed = palloc(sizeof(int64) * (SPI_processed + 1));
	uint64 ncommitted = SPI_processed;

	for (uint64 i = 0; i < ncommitted; i++)
		committed[i] = queue_result_int64(i, 1);
	for (int i = 0; i < count; i++)
	{
		bool found = false;

		for (uint64 j = 0; j < ncommitted && !found; j++)
			found = committed[j] == DatumGetInt64(ids[i]);
		if (!found)
			queue_report_row_state(DatumGetInt64(ids[i]), TextDatumGetCString(stages[i]), tokens[i]);
	}
	elog(ERROR, "batch commit touched fewer rows than it was given");
}

static int
transition_compare_int64(const void *a, const void *b)
{
	int64 x = DatumGetInt64(*(const Datum *) a);
	int64 y = DatumGetInt64(*(const Datum *) b);

	return (x > y) - (x < y);
}

/*
 * ids[] of a batch: present, not empty, no NULL and no id twice.  caller
 * names the SQL function in the details (commit_many and resume share this).
 */
static Datum *
transition_batch_ids(ArrayType *array, int *count, const char *caller)
{
	Datum *ids;
	Datum *sorted;
	bool  *nulls;

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids must be a one-dimensional array")));
	deconstruct_array(array, INT8OID, 8, true, TYPALIGN_DOUBLE, &ids, &nulls, count);
	if (*count == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ids must not be empty"),
				 errdetail("%s needs at least one row.", caller)));
	for (int i = 0; i < *count; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("ids[%d] is null", i + 1)));
	sorted = palloc(sizeof(Datum) * *count);
	memcpy(sorted, ids, sizeof(Datum) * *count);
	qsort(sorted, *count, sizeof(Datum), transition_compare_int64);
	for (int i = 1; i < *count; i++)
		if (DatumGetInt64(sorted[i]) == DatumGetInt64(sorted[i - 1]))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("workqueue row %lld appears twice in ids",
							(long long) DatumGetInt64(sorted[i])),
					 errdetail("%s acts on each row once.", caller)));
	return ids;
}

/* A parallel array argument of a batch: NULL allowed or not, elements all present or not. */
static ArrayType *
transition_batch_array(FunctionCallInfo fcinfo, int argno, const char *name, int count,
					   bool required, bool elements_required)
{
	ArrayType *array;

	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not be null", name)));
		return NULL;
	}
	array = PG_GETARG_ARRAYTYPE_P(argno);
	check_same_length(array, count, name, "ids");
	if (elements_required && array_contains_nulls(array))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not contain nulls", name)));
	return array;
}

/* A workqueue_commit_many argument array for $(i + 1), or NULL. */
static void
commit_many_set(Datum *values, char *nulls, int i, ArrayType *array)
{
	values[i] = array ? PointerGetDatum(array) : (Datum) 0;
	nulls[i] = array ? ' ' : 'n';
}

/* target_stages, for an advance: each a stage name. */
static ArrayType *
commit_many_targets(FunctionCallInfo fcinfo, int count)
{
	ArrayType *array = transition_batch_array(fcinfo, 3, "target_stages", count, true, true);
	Datum	  *targets;
	int		   ntargets;

	/* Whatever its lower bound, element i of the array goes with ids[i]. */
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &targets, NULL, &ntargets);
	for (int i = 0; i < ntargets; i++)
		check_stage_name(DatumGetTextPP(targets[i]), psprintf("target_stages[%d]", i + 1));
	return array;
}

/* merge_states: each a JSON object or NULL; NULL when not given. */
static ArrayType *
commit_many_merges(FunctionCallInfo fcinfo, int count)
{
	ArrayType *array = transition_batch_array(fcinfo, 4, "merge_states", count, false, false);
	Datum	  *merges;
	bool	  *merge_nulls;
	int		   n;

	if (array == NULL)
		return NULL;
	deconstruct_array(array, JSONBOID, -1, false, TYPALIGN_INT, &merges, &merge_nulls, &n);
	for (int i = 0; i < n; i++)
		if (!merge_nulls[i] && !JB_ROOT_IS_OBJECT(DatumGetJsonbP(merges[i])))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("merge_states[%d] must be a JSON object", i + 1)));
	return array;
}

/* retry_seconds, for a pause: each within 0 to PEPSI_MAX_RETRY_SECONDS, or +Infinity (a hold). */
static ArrayType *
commit_many_retries(FunctionCallInfo fcinfo, int count)
{
	ArrayType *array = transition_batch_array(fcinfo, 5, "retry_seconds", count, true, true);
	Datum	  *retries;
	int		   n;

	deconstruct_array(array, FLOAT8OID, 8, true, TYPALIGN_DOUBLE, &retries, NULL, &n);
	for (int i = 0; i < n; i++)
	{
		double seconds = DatumGetFloat8(retries[i]);

		if (isinf(seconds) && seconds > 0)
			continue;
		if (isnan(seconds) || isinf(seconds) || seconds < 0 || seconds > PEPSI_MAX_RETRY_SECONDS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("retry_seconds[%d] must be between 0 and %d seconds, not %g",
							i + 1, PEPSI_MAX_RETRY_SECONDS, seconds)));
	}
	return array;
}

/*
 * claim_tokens (the 0.4 signature), each in tokens[i]; returns their
 * digests (queue_token_digest, NULL for a NULL token) as the bytea array
 * the guard compares, or NULL when not given.
 */
static ArrayType *
commit_many_tokens(FunctionCallInfo fcinfo, int count, pg_uuid_t **tokens)
{
	ArrayType *array;
	Datum	  *elements;
	bool	  *element_nulls;
	int		   n;

	if (PG_NARGS() <= 6
		|| (array = transition_batch_array(fcinfo, 6, "claim_tokens", count, false, false)) == NULL)
		return NULL;
	deconstruct_array(array, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR, &elements, &element_nulls, &n);
	for (int i = 0; i < n; i++)
	{
		tokens[i] = element_nulls[i] ? NULL : DatumGetUUIDP(elements[i]);
		elements[i] = PointerGetDatum(queue_token_digest(tokens[i]));
	}
	return construct_md_array(elements, element_nulls, 1, &n, (int[]){1}, BYTEAOID, -1, false,
							  TYPALIGN_INT);
}

/*
 * workqueue_commit_many(ids, expected_stages, transition, target_stages,
 *                       merge_states, retry_seconds [, claim_tokens])
 *
 * One statement for the whole batch; per-row targets, merges and retry
 * times ride in parallel arrays, so divergent branches of the same outcome
 * still share it.  The row guard is written "(...) IS TRUE" on
 * purpose: as plain conditions the planner matched them to the
 * (stage, status) index, whose statistics see almost no running rows, and
 * rescanned the unnest once per indexed row (92 ms instead of 7 for 256
 * rows); hidden in an expression, the rows are reached by primary key.
 * Its plan is the generic one (a nested loop over the unnest, each row
 * by primary key, whatever the batch's length): with the arrays' length
 * known the plan cache found every custom plan cheaper and planned the
 * statement afresh at each call, 4% of the server's CPU in bench/list's
 * VERP fan-out, more than executing it.  All or nothing: if any row is not running at its
 * expected stage under its claim token (claim_tokens, parallel to ids) the
 * call fails and no row changes.
 */
Datum
workqueue_commit_many(PG_FUNCTION_ARGS)
{
	/*
	 * [0]: with the claim token guard (0.4 on), u.digest the digests of
	 * the tokens, from $6; [1]: the schema before claim tokens.
	 */
#define COMMIT_MANY_GUARD_TOKEN                                             \
	" WHERE w.id = u.id AND (w.status = 'running' AND w.stage = u.expected" \
	" AND w.claim_digest IS NOT DISTINCT FROM u.digest) IS TRUE"            \
	" RETURNING w.id"
#define COMMIT_MANY_GUARD \
	" WHERE w.id = u.id AND (w.status = 'running' AND w.stage = u.expected) IS TRUE RETURNING w.id"
#define COMMIT_MANY_SQL(guard, token_arg, token_col)                                                          \
	{                                                                                                         \
		[TRANSITION_ADVANCE] =                                                                                \
			"UPDATE pepsi.workqueue w SET stage = u.target, status = 'pending', " PENDING_SEQ_NEXT ","        \
			" state = CASE WHEN u.merge IS NULL THEN w.state ELSE w.state || u.merge END"                     \
			" FROM unnest($1, $2, $3, $4" token_arg ") AS u(id, expected, target, merge" token_col ")" guard, \
		[TRANSITION_PAUSE] =                                                                                  \
			"UPDATE pepsi.workqueue w SET status = 'paused',"                                                 \
			" timeout = CASE WHEN u.retry = 'Infinity'::float8 THEN 'infinity'::timestamptz"                  \
			" ELSE now() + u.retry * interval '1 second' END,"                                                \
			" state = CASE WHEN u.merge IS NULL THEN w.state ELSE w.state || u.merge END"                     \
			" FROM unnest($1, $2, $4, $5" token_arg ") AS u(id, expected, merge, retry" token_col ")" guard,  \
		[TRANSITION_FAIL] =                                                                                   \
			"UPDATE pepsi.workqueue w SET status = 'failed',"                                                 \
			" state = CASE WHEN u.merge IS NULL THEN w.state ELSE w.state || u.merge END"                     \
			" FROM unnest($1, $2, $4" token_arg ") AS u(id, expected, merge" token_col ")" guard,             \
		[TRANSITION_FINISH] = "DELETE FROM pepsi.workqueue w USING unnest($1, $2" token_arg                   \
							  ") AS u(id, expected" token_col ")" guard,                                      \
	}
	static SPIPlanPtr		 plans[2][TRANSITION_KINDS];
	static const char *const sql[2][TRANSITION_KINDS] = {
		COMMIT_MANY_SQL(COMMIT_MANY_GUARD_TOKEN, ", $6", ", digest"),
		COMMIT_MANY_SQL(COMMIT_MANY_GUARD, "", ""),
	};
	static const Oid argtypes[] = {INT8ARRAYOID, TEXTARRAYOID, TEXTARRAYOID,
								   JSONBARRAYOID, FLOAT8ARRAYOID, BYTEAARRAYOID};
	Datum			 values[6];
	char			 nulls[6] = "      ";
	pg_uuid_t	   **tokens;
	bool			 has_digest = queue_has_claim_digest();
	const char		*label;
	TransitionKind	 kind;
	Datum			*ids;
	Datum			*stages;
	int				 count;
	int				 nstages;
	ArrayType		*array;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not be null")));
	ids = transition_batch_ids(PG_GETARG_ARRAYTYPE_P(0), &count, "workqueue_commit_many");
	array = transition_batch_array(fcinfo, 1, "expected_stages", count, true, true);
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &stages, NULL, &nstages);
	kind = transition_arg(fcinfo, 2, &label);
	transition_check_extras(kind, label, !PG_ARGISNULL(3), !PG_ARGISNULL(5));

	values[0] = PG_GETARG_DATUM(0);
	values[1] = PointerGetDatum(array);
	commit_many_set(values, nulls, 2,
					kind == TRANSITION_ADVANCE ? commit_many_targets(fcinfo, count) : NULL);
	commit_many_set(values, nulls, 3, commit_many_merges(fcinfo, count));
	commit_many_set(values, nulls, 4, kind == TRANSITION_PAUSE ? commit_many_retries(fcinfo, count) : NULL);
	tokens = palloc0(sizeof(pg_uuid_t *) * count);
	commit_many_set(values, nulls, 5, commit_many_tokens(fcinfo, count, tokens));

	SPI_connect();
	if (!has_digest && nulls[5] == ' ')
		for (int i = 0; i < count; i++)
			if (tokens[i] != NULL)
				queue_report_row_state(DatumGetInt64(ids[i]), TextDatumGetCString(stages[i]), tokens[i]);
	queue_exec(queue_plan_generic(&plans[has_digest ? 0 : 1][kind], sql[has_digest ? 0 : 1][kind], 6,
								  argtypes),
			   values, nulls, false, 0);
	if (SPI_processed != (uint64) count)
		transition_report_batch(ids, stages, tokens, count);
	SPI_finish();
	PG_RETURN_INT32(count);
}

/* Clones argument: a JSON array, or NULL where allowed. */
static Jsonb *
transition_arg_clones(FunctionCallInfo fcinfo, int argno, bool required)
{
	Jsonb *clones;

	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("clones must not be null"),
					 errhint("Pass '[]' to finish without clones, or call workqueue_commit with finish.")));
		return NULL;
	}
	clones = PG_GETARG_JSONB_P(argno);
	if (!JB_ROOT_IS_ARRAY(clones) || JB_ROOT_IS_SCALAR(clones))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("clones must be a JSON array"),
				 errdetail("Each element describes one side message, e.g. {\"token\": \"dsn-delay-42\", \"stage\": \"bounce\"}.")));
	return clones;
}

/*
 * workqueue_pause(id, expected_stage, retry_seconds, merge_state,
 *                 keep_indices, clones, at_stage [, claim_token]) returns
 *                 the ids of the clones made.
 *
 * Clones are spawned from the row as it was (their rcpt_indices count in
 * the full recipient list), then the row is reduced to keep_indices and
 * paused (at at_stage, when a fused successor paused it).
 */
Datum
workqueue_pause(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT8OID, FLOAT8OID, JSONBOID, TEXTOID};
	int64			  id = arg_int64(fcinfo, 0, "id");
	text			 *expected_stage = arg_stage(fcinfo, 1, "expected_stage");
	double			  retry_seconds = arg_seconds(fcinfo, 2, "retry_seconds");
	Jsonb			 *merge_state = arg_json_object_or_null(fcinfo, 3, "merge_state");
	ArrayType		 *keep = PG_ARGISNULL(4) ? NULL : PG_GETARG_ARRAYTYPE_P(4);
	Jsonb			 *clones = transition_arg_clones(fcinfo, 5, false);
	text			 *at_stage = PG_ARGISNULL(6) ? NULL : arg_stage(fcinfo, 6, "at_stage");
	pg_uuid_t		 *token = arg_claim_token(fcinfo, 7);
	Datum			  values[4];
	char			  nulls[4] = "    ";
	ArrayType		 *clone_ids;
	int				  nrcpt;

	SPI_connect();
	nrcpt = queue_lock_running_row(id, text_to_cstring(expected_stage), token);
	if (keep != NULL)
	{
		bool *taken = palloc0(sizeof(bool) * (nrcpt + 1));
		int	  nkeep;
		int	 *indices = array_to_ints(keep, "keep_indices", &nkeep);

		if (nkeep == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("keep_indices must name at least one recipient"),
					 errhint("Pass NULL to keep every recipient.")));
		check_indices(indices, nkeep, nrcpt, "keep_indices", taken);
	}
	if (clones != NULL)
		spawn_validate(clones, SPAWN_CLONES, nrcpt, NULL, "clones");

	clone_ids = clones ? spawn_rows(id, clones, SPAWN_CLONES) : construct_empty_array(INT8OID);
	if (keep != NULL)
		split_reduce_recipients(id, keep);

	values[0] = Int64GetDatum(id);
	values[1] = Float8GetDatum(retry_seconds);
	values[2] = PointerGetDatum(merge_state);
	nulls[2] = merge_state ? ' ' : 'n';
	values[3] = PointerGetDatum(at_stage);
	nulls[3] = at_stage ? ' ' : 'n';
	queue_exec(queue_plan(&plan,
						  "UPDATE pepsi.workqueue SET status = 'paused',"
						  " timeout = now() + $2 * interval '1 second',"
						  " state = CASE WHEN $3 IS NULL THEN state ELSE state || $3 END,"
						  " stage = coalesce($4, stage)"
						  " WHERE id = $1",
						  4, argtypes),
			   values, nulls, false, 0);
	clone_ids = (ArrayType *) SPI_datumTransfer(PointerGetDatum(clone_ids), false, -1);
	SPI_finish();
	PG_RETURN_ARRAYTYPE_P(clone_ids);
}

/*
 * workqueue_finish_with_clones(id, expected_stage, clones [, claim_token]): the clones are
 * inserted before the row is deleted, so the row's body is still referenced
 * when the release trigger looks at it.
 */
Datum
workqueue_finish_with_clones(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT8OID};
	int64			  id = arg_int64(fcinfo, 0, "id");
	text			 *expected_stage = arg_stage(fcinfo, 1, "expected_stage");
	Jsonb			 *clones = transition_arg_clones(fcinfo, 2, true);
	pg_uuid_t		 *token = arg_claim_token(fcinfo, 3);
	Datum			  values[1] = {Int64GetDatum(id)};
	ArrayType		 *clone_ids;
	int				  nrcpt;

	SPI_connect();
	nrcpt = queue_lock_running_row(id, text_to_cstring(expected_stage), token);
	spawn_validate(clones, SPAWN_CLONES, nrcpt, NULL, "clones");
	clone_ids = spawn_rows(id, clones, SPAWN_CLONES);
	queue_exec(queue_plan(&plan, "DELETE FROM pepsi.workqueue WHERE id = $1", 1, argtypes),
			   values, NULL, false, 0);
	clone_ids = (ArrayType *) SPI_datumTransfer(PointerGetDatum(clone_ids), false, -1);
	SPI_finish();
	PG_RETURN_ARRAYTYPE_P(clone_ids);
}

/*
 * workqueue_resume(ids): paused, failed and timed-out rows go back to
 * pending at their stage.  All or nothing: an unknown id, or a row a worker
 * holds (running), is an error and nothing changes.  Rows already pending
 * are left as they are.  Returns how many rows were resumed.
 */
Datum
workqueue_resume(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr check_plan;
	static SPIPlanPtr resume_plan;
	static const Oid  argtypes[] = {INT8ARRAYOID};
	Datum			  values[1];
	int				  count;
	uint64			  resumed;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ids must not be null")));
	transition_batch_ids(PG_GETARG_ARRAYTYPE_P(0), &count, "workqueue_resume");
	values[0] = PG_GETARG_DATUM(0);

	SPI_connect();
	queue_exec(queue_plan(&check_plan,
						  "SELECT u.id, w.status::text FROM unnest($1) AS u(id)"
						  " LEFT JOIN pepsi.workqueue w ON w.id = u.id"
						  " WHERE w.id IS NULL OR w.status = 'running' ORDER BY u.id LIMIT 1",
						  1, argtypes),
			   values, NULL, true, 1);
	if (SPI_processed > 0)
	{
		int64 bad = queue_result_int64(0, 1);
		char *status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);

		if (status == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_NO_DATA_FOUND),
					 errmsg("workqueue row %lld does not exist", (long long) bad),
					 errdetail("No row was resumed.")));
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("workqueue row %lld is running and cannot be resumed", (long long) bad),
				 errdetail("A worker holds it; no row was resumed."),
				 errhint("Wait for the stage to finish with it, or stop the dispatcher first.")));
	}
	queue_exec(queue_plan(&resume_plan,
						  "UPDATE pepsi.workqueue SET status = 'pending', timeout = NULL, " PENDING_SEQ_NEXT
						  " WHERE id = ANY ($1) AND status IN ('paused', 'failed', 'timeout')",
						  1, argtypes),
			   values, NULL, false, 0);
	resumed = SPI_processed;
	if (resumed > 0)
		queue_notify_workqueue();
	SPI_finish();
	PG_RETURN_INT32((int32) resumed);
}

/*
 * workqueue_requeue_due(max_rows): paused rows whose retry time has come go
 * back to pending, oldest due first.  Rows another session has locked are
 * skipped (they are being resumed or deleted), so this never waits.
 * "timeout < 'infinity'" is the predicate of workqueue_paused_due (a row
 * held without a time has no entry there): said outright, since the
 * planner cannot infer it from "timeout <= now()", now() being no constant.
 */
Datum
workqueue_requeue_due(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT4OID};
	int32			  max_rows = PG_GETARG_INT32(0);
	Datum			  values[1] = {Int32GetDatum(max_rows)};
	uint64			  requeued;

	if (max_rows <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be positive, not %d", max_rows)));
	SPI_connect();
	queue_exec(queue_plan(&plan,
						  "UPDATE pepsi.workqueue w SET status = 'pending', timeout = NULL, " PENDING_SEQ_NEXT
						  " FROM (SELECT id FROM pepsi.workqueue"
						  "       WHERE status = 'paused' AND timeout <= now() AND timeout < 'infinity'"
						  "       ORDER BY timeout LIMIT $1 FOR UPDATE SKIP LOCKED) due"
						  " WHERE w.id = due.id",
						  1, argtypes),
			   values, NULL, false, 0);
	requeued = SPI_processed;
	if (requeued > 0)
		queue_notify_workqueue();
	SPI_finish();
	PG_RETURN_INT32((int32) requeued);
}

/*
 * workqueue_reset_orphans(except_ids [, stages]): running rows go back to
 * pending, except those listed (the ones a reconnecting dispatcher still
 * has in flight).  At start-up a dispatcher passes none: every running row
 * was left by its predecessor.  A dispatcher that serves a set of stages
 * ([dispatch] STAGES) passes them, and only its own stages' rows are reset:
 * the rows another dispatcher's workers hold are not orphans.
 */
Datum
workqueue_reset_orphans(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plans[2][2];
	static const Oid  argtypes[] = {INT8ARRAYOID, TEXTARRAYOID};
	Datum			  values[2];
	char			  nulls[2] = {' ', ' '};
	bool			  by_stage = PG_NARGS() > 1 && !PG_ARGISNULL(1);
	uint64			  reset;

	queue_check_dispatcher("workqueue_reset_orphans");
	values[0] = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	nulls[0] = PG_ARGISNULL(0) ? 'n' : ' ';
	values[1] = by_stage ? PG_GETARG_DATUM(1) : (Datum) 0;
	SPI_connect();
	/* The running rows, through the pending index that holds them from 0.2 on. */
#define RESET_ORPHANS_SQL(running)                                     \
	"UPDATE pepsi.workqueue SET status = 'pending', " PENDING_SEQ_NEXT \
	" WHERE " running " AND ($1 IS NULL OR id <> ALL ($1))"
#define RESET_ORPHANS_RUNNING_INDEXED "index_status = 'pending' AND status = 'running'"
#define RESET_ORPHANS_BY_STAGE " AND stage = ANY ($2)"
	if (by_stage)
		queue_exec(queue_plan_pending(plans[1],
									  RESET_ORPHANS_SQL(RESET_ORPHANS_RUNNING_INDEXED) RESET_ORPHANS_BY_STAGE,
									  RESET_ORPHANS_SQL("status = 'running'") RESET_ORPHANS_BY_STAGE, 2,
									  argtypes),
				   values, nulls, false, 0);
	else
		queue_exec(queue_plan_pending(plans[0], RESET_ORPHANS_SQL(RESET_ORPHANS_RUNNING_INDEXED),
									  RESET_ORPHANS_SQL("status = 'running'"), 1, argtypes),
				   values, nulls, false, 0);
	reset = SPI_processed;
	if (reset > 0)
		queue_notify_workqueue();
	SPI_finish();
	PG_RETURN_INT32((int32) reset);
}

/*
 * FOR EACH ROW on UPDATE, WHEN the row becomes pending (from another
 * status, or at another stage): give it a fresh pending_seq, so it queues
 * behind the rows already waiting at that stage and the claim's sender
 * cache sees it as a new arrival.
 *
 * 0.1 fires it BEFORE UPDATE, and it sets NEW.pending_seq.  But any BEFORE
 * ROW trigger on UPDATE makes PostgreSQL lock each row before updating it
 * (one more WAL record and buffer write per row), whatever the trigger's
 * WHEN says: every claim and every commit paid that.  From 0.2 the queue's
 * transitions draw pending_seq in the statement that makes a row pending,
 * and the trigger fires AFTER UPDATE only for a row that became pending
 * without a new pending_seq (a DBA's UPDATE, a function that does not draw
 * one), drawing it then in a second update of the row; that update leaves
 * the row pending at the same stage, so it does not fire the trigger again.
 */
Datum
workqueue_pending_seq_trigger(PG_FUNCTION_ARGS)
{
	TriggerData *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc	 tupdesc;
	int			 attnum;
	Oid			 sequence;
	Datum		 value;
	bool		 isnull = false;

	if (!CALLED_AS_TRIGGER(fcinfo) || TRIGGER_FIRED_INSTEAD(trigdata->tg_event)
		|| !TRIGGER_FIRED_FOR_ROW(trigdata->tg_event) || !TRIGGER_FIRED_BY_UPDATE(trigdata->tg_event))
		elog(ERROR, "workqueue_pending_seq_trigger must fire BEFORE or AFTER UPDATE FOR EACH ROW");

	tupdesc = RelationGetDescr(trigdata->tg_relation);
	attnum = SPI_fnumber(tupdesc, "pending_seq");
	if (attnum <= 0)
		elog(ERROR, "pepsi.workqueue has no pending_seq column");
	sequence = get_relname_relid("pending_seq", RelationGetNamespace(trigdata->tg_relation));
	if (!OidIsValid(sequence))
		elog(ERROR, "sequence pepsi.pending_seq does not exist");
	value = Int64GetDatum(nextval_internal(sequence, false));
	if (TRIGGER_FIRED_BEFORE(trigdata->tg_event))
		return PointerGetDatum(heap_modify_tuple_by_cols(trigdata->tg_newtuple, tupdesc, 1,
														 &attnum, &value, &isnull));
	{
		static SPIPlanPtr plan;
		static const Oid  argtypes[] = {INT8OID, INT8OID};
		Datum			  values[2];

		values[0] = SPI_getbinval(trigdata->tg_newtuple, tupdesc, SPI_fnumber(tupdesc, "id"), &isnull);
		if (isnull)
			elog(ERROR, "pepsi.workqueue row without an id");
		values[1] = value;
		SPI_connect();
		queue_exec(queue_plan(&plan, "UPDATE pepsi.workqueue SET pending_seq = $2 WHERE id = $1",
							  2, argtypes),
				   values, NULL, false, 0);
		SPI_finish();
	}
	return PointerGetDatum(NULL);
}
