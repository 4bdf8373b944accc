/*
 * crash.c: what happens to a row whose worker died on it.
 *
 * When a stage worker crashes, is killed for MAX_RUNTIME or breaks the
 * status-line protocol, the dispatcher cannot know whether the message or
 * the moment was to blame.  Like Postfix with a delivery agent that died,
 * it retries: the row is paused with a backoff that doubles per attempt,
 * and the attempt is counted in state.crash.  A message that kills its
 * worker crash_limit times at the same stage is a poison message: it is
 * isolated (failed, or timeout for MAX_RUNTIME), recorded in event_log and
 * counted in dispatch_stats, so that the stage keeps serving everything
 * else and the operator is told.
 */
#include "pepsi.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(workqueue_crashed);

/*
 * workqueue_crashed(id, expected_stage, reason, crash_limit, retry_seconds,
 * final_status [, claim_token]): returns the row's new status ('paused', or final_status
 * once the limit is reached), or NULL when the row is no longer running at
 * expected_stage (under claim_token, when given): the worker committed it
 * before it died, and that outcome stands, or the row was claimed again
 * since.
 */
Datum
workqueue_crashed(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr update_plans[2];
	static SPIPlanPtr isolate_plan;
	static SPIPlanPtr retry_plan;
	static const Oid  update_types[] = {INT8OID, TEXTOID, TEXTOID, INT4OID, FLOAT8OID, TEXTOID, BYTEAOID};
	static const Oid  isolate_types[] = {INT8OID, TEXTOID, INT4OID, TEXTOID, TEXTOID};
	int64			  id = arg_int64(fcinfo, 0, "id");
	text			 *expected_stage = arg_stage(fcinfo, 1, "expected_stage");
	text			 *reason = arg_text(fcinfo, 2, "reason");
	int32			  crash_limit;
	double			  retry_seconds = arg_seconds(fcinfo, 4, "retry_seconds");
	text			 *final_status = arg_text(fcinfo, 5, "final_status");
	char			 *final = text_to_cstring(final_status);
	pg_uuid_t		 *token = arg_claim_token(fcinfo, 6);
	Datum			  values[7];
	char			  nulls[7] = "       ";
	bool			  paused;
	int32			  attempts;
	bool			  isnull;

	if (VARSIZE_ANY_EXHDR(reason) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("reason must not be empty"),
				 errdetail("The reason is recorded in the row's state for the operator.")));
	if (PG_ARGISNULL(3) || (crash_limit = PG_GETARG_INT32(3)) < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("crash_limit must be a positive number of attempts"),
				 errhint("CRASH_LIMIT in [dispatch] is at least 1.")));
	if (strcmp(final, "failed") != 0 && strcmp(final, "timeout") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("final_status must be failed or timeout, not \"%s\"", final),
				 errdetail("A row that keeps killing its worker is isolated in one of those two.")));

	queue_check_dispatcher("workqueue_crashed");
	values[0] = Int64GetDatum(id);
	values[1] = PointerGetDatum(expected_stage);
	values[2] = PointerGetDatum(reason);
	values[3] = Int32GetDatum(crash_limit);
	values[4] = Float8GetDatum(retry_seconds);
	values[5] = PointerGetDatum(final_status);
	values[6] = queue_token_digest_arg(token, nulls, 6);
	if (token != NULL && !queue_has_claim_digest())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("this schema has no claim tokens"),
				 errhint("Run ALTER EXTENSION pepsi UPDATE.")));

	SPI_connect();

	/*
	 * One statement counts the attempt and decides: attempts count per
	 * stage (a crash at an earlier stage says nothing about this one), and
	 * the backoff doubles with each, capped like any retry delay.
	 */
#define CRASHED_SQL(token_guard)                                                                        \
	"WITH r AS ("                                                                                       \
	"  SELECT w.id, 1 + CASE WHEN w.state->'crash'->>'stage' = $2"                                      \
	"    THEN coalesce((w.state->'crash'->>'attempts')::int, 0) ELSE 0 END"                             \
	"    AS attempts"                                                                                   \
	"  FROM pepsi.workqueue w"                                                                          \
	"  WHERE w.id = $1 AND w.stage = $2 AND w.status = 'running'" token_guard " FOR UPDATE)"            \
	" UPDATE pepsi.workqueue w SET"                                                                     \
	"  status = CASE WHEN r.attempts >= $4 THEN $6::pepsi.status"                                       \
	"    ELSE 'paused' END,"                                                                            \
	"  timeout = CASE WHEN r.attempts >= $4 THEN NULL"                                                  \
	"    ELSE now() + least($5 * 2 ^ least(r.attempts - 1, 60), " CppAsString2(                         \
		PEPSI_MAX_RETRY_SECONDS) ") * interval '1 second' END,"                                         \
								 "  state = w.state || jsonb_build_object('crash', jsonb_build_object(" \
								 "    'stage', $2, 'attempts', r.attempts, 'limit', $4, 'reason', $3,"  \
								 "    'at', now()))"                                                    \
								 "    || CASE WHEN r.attempts >= $4"                                    \
								 "       THEN jsonb_build_object('dispatch_error', $3) ELSE '{}' END"   \
								 " FROM r WHERE w.id = r.id"                                            \
								 " RETURNING w.status::text, r.attempts"
	/* With a claim token, only the claim the dispatcher handed out: not the row claimed again since. */
	if (token != NULL)
		queue_exec(queue_plan(&update_plans[0],
							  CRASHED_SQL(" AND w.claim_digest IS NOT DISTINCT FROM $7"), 7, update_types),
				   values, nulls, false, 0);
	else
		queue_exec(queue_plan(&update_plans[1], CRASHED_SQL(""), 7, update_types), values, nulls, false,
				   0);
	if (SPI_processed == 0)
	{
		SPI_finish();
		PG_RETURN_NULL();
	}
	paused = strcmp(SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1), "paused") == 0;
	attempts = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
										   &isnull));

	if (paused)
		queue_exec(queue_plan(&retry_plan,
							  "UPDATE pepsi.dispatch_stats SET crash_retries = crash_retries + 1,"
							  " updated_at = now()",
							  0, NULL),
				   NULL, NULL, false, 0);
	else
	{
		Datum isolate[5];

		isolate[0] = Int64GetDatum(id);
		isolate[1] = PointerGetDatum(expected_stage);
		isolate[2] = Int32GetDatum(attempts);
		isolate[3] = PointerGetDatum(reason);
		isolate[4] = PointerGetDatum(final_status);
		queue_exec(queue_plan(&isolate_plan,
							  "WITH logged AS ("
							  "  INSERT INTO pepsi.event_log (action, detail)"
							  "  VALUES ('crash_limit', jsonb_build_object('id', $1, 'stage', $2,"
							  "    'attempts', $3, 'reason', $4, 'status', $5)))"
							  " UPDATE pepsi.dispatch_stats SET crash_failures = crash_failures + 1,"
							  "  last_crash_failure_at = now(), updated_at = now()",
							  5, isolate_types),
				   isolate, NULL, false, 0);
	}
	SPI_finish();
	PG_RETURN_TEXT_P(cstring_to_text(paused ? "paused" : final));
}
