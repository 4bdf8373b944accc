/*
 * spi_support.c: SPI plumbing shared by the queue functions.
 *
 * Plans are prepared once per backend and kept (the dispatcher and the
 * workers hold long-lived connections, so planning is paid once).  The
 * row-state check is the one every transition makes: the caller claims the
 * row is running at a stage, and anything else is a clear error.
 */
#include "pepsi.h"

#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/uuid.h"

static SPIPlanPtr
queue_plan_with_options(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes, int cursor_options)
{
	if (*slot == NULL)
	{
		SPIPlanPtr plan = SPI_prepare_cursor(sql, nargs, (Oid *) argtypes, cursor_options);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed (%s) for: %s",
				 SPI_result_code_string(SPI_result), sql);
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*slot = plan;
	}
	return *slot;
}

SPIPlanPtr
queue_plan(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes)
{
	return queue_plan_with_options(slot, sql, nargs, argtypes, 0);
}

/*
 * queue_plan for a statement over arrays it unnests, whose plan's shape
 * does not depend on their length (queue_plan_pending_generic says why
 * the plan cache would otherwise plan it afresh at every execution).
 */
SPIPlanPtr
queue_plan_generic(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes)
{
	return queue_plan_with_options(slot, sql, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
}

/* Two syscache lookups a call: the schema can change under a live backend. */
static SPIPlanPtr
queue_plan_pending_with_options(SPIPlanPtr slots[2], const char *sql, const char *sql_0_1, int nargs,
								const Oid *argtypes, int cursor_options)
{
	Oid queue = get_relname_relid("workqueue", get_namespace_oid("pepsi", false));

	if (OidIsValid(queue) && get_attnum(queue, "index_status") != InvalidAttrNumber)
		return queue_plan_with_options(&slots[0], sql, nargs, argtypes, cursor_options);
	return queue_plan_with_options(&slots[1], sql_0_1, nargs, argtypes, cursor_options);
}

SPIPlanPtr
queue_plan_pending(SPIPlanPtr slots[2], const char *sql, const char *sql_0_1, int nargs,
				   const Oid *argtypes)
{
	return queue_plan_pending_with_options(slots, sql, sql_0_1, nargs, argtypes, 0);
}

/*
 * queue_plan_pending for a statement whose parameters are arrays it
 * unnests: the plan for the arrays given (their length known) always looks
 * cheaper than the generic one (costed for arrays of unknown length), so
 * the plan cache would plan the statement afresh at every execution, for
 * good (the claim's check of which stages have pending rows: three times
 * as long planning as executing, bench/list).  Where the plan's shape does
 * not depend on the arrays' length, the generic plan is kept from the
 * first execution.
 */
SPIPlanPtr
queue_plan_pending_generic(SPIPlanPtr slots[2], const char *sql, const char *sql_0_1, int nargs,
						   const Oid *argtypes)
{
	return queue_plan_pending_with_options(slots, sql, sql_0_1, nargs, argtypes, CURSOR_OPT_GENERIC_PLAN);
}

int
queue_exec(SPIPlanPtr plan, Datum *values, const char *nulls, bool read_only, long count)
{
	int rc = SPI_execute_plan(plan, values, nulls, read_only, count);

	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return rc;
}

/* The int8 in column col (1-based) of result row row; NULL is an internal error. */
int64
queue_result_int64(int row, int col)
{
	bool  isnull;
	Datum d = SPI_getbinval(SPI_tuptable->vals[row], SPI_tuptable->tupdesc, col, &isnull);

	if (isnull)
		elog(ERROR, "unexpected NULL in column %d", col);
	return DatumGetInt64(d);
}

/*
 * Does the installed schema have workqueue.claim_digest (0.4 on)?  Two
 * syscache lookups a call, as queue_plan_pending: the schema can change
 * under a live backend, and this library still serves 0.1 to 0.3, whose
 * rows have no claim token and whose statements must not name one.
 */
bool
queue_has_claim_digest(void)
{
	Oid queue = get_relname_relid("workqueue", get_namespace_oid("pepsi", false));

	return OidIsValid(queue) && get_attnum(queue, "claim_digest") != InvalidAttrNumber;
}

/*
 * The claim token argument argno of a transition: NULL when the caller
 * gave none (the overloads without one, or a worker handed a bare id).
 * The statements compare "claim_digest IS NOT DISTINCT FROM" the token's
 * digest (queue_token_digest: NULL for none), so no token matches only a
 * row claimed without one.
 */
pg_uuid_t *
arg_claim_token(FunctionCallInfo fcinfo, int argno)
{
	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return NULL;
	return PG_GETARG_UUID_P(argno);
}

/*
 * Raise the error that says why row id is not running at expected_stage
 * under claim token (NULL: none).  Called after a guarded UPDATE or DELETE
 * touched nothing, so the cost of the diagnosis is paid only on the error
 * path.  The row's digest is compared here, never shown.
 */
void
queue_report_row_state(int64 id, const char *expected_stage, pg_uuid_t *token)
{
	static SPIPlanPtr plans[2];
	static const Oid  argtypes[] = {INT8OID, BYTEAOID};
	Datum			  values[2] = {Int64GetDatum(id), (Datum) 0};
	char			  nulls[2] = "  ";
	bool			  tokens = queue_has_claim_digest();
	bool			  isnull;
	char			 *status;
	char			 *stage;

	values[1] = queue_token_digest_arg(token, nulls, 1);
	queue_exec(tokens ? queue_plan(&plans[0],
								   "SELECT status::text, stage,"
								   " claim_digest IS NOT DISTINCT FROM $2,"
								   " claim_digest IS NULL"
								   " FROM pepsi.workqueue WHERE id = $1",
								   2, argtypes)
					  : queue_plan(&plans[1],
								   "SELECT status::text, stage, true, true FROM pepsi.workqueue"
								   " WHERE id = $1 AND $2 IS NULL",
								   2, argtypes),
			   values, nulls, true, 1);
	if (SPI_processed == 0 && !tokens && token != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("claim token for workqueue row %lld does not match", (long long) id),
				 errdetail("This schema issues no claim tokens; nothing was changed."),
				 errhint("Run ALTER EXTENSION pepsi UPDATE.")));
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_NO_DATA_FOUND),
				 errmsg("workqueue row %lld does not exist", (long long) id),
				 errhint("It may have been finished already, or deleted by an operator.")));

	status = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	stage = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	if (strcmp(status, "running") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("workqueue row %lld is %s, not running", (long long) id, status),
				 errdetail("Only a row the dispatcher has claimed can be committed, paused, split or finished."),
				 errhint("Resume it with pepsi.workqueue_resume() if it should be processed again.")));
	if (strcmp(stage, expected_stage) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("workqueue row %lld is at stage \"%s\", not \"%s\"",
						(long long) id, stage, expected_stage),
				 errdetail("The caller's view of the row is stale: another stage owns it now.")));
	if (!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull)))
	{
		if (token == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
					 errmsg("workqueue row %lld needs its claim token", (long long) id),
					 errdetail("Its claim returned a token, and only the worker it was handed to may change the row; nothing was changed."),
					 errhint("Pass the token the dispatcher wrote after the id (the claim_token argument).")));
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("claim token for workqueue row %lld does not match", (long long) id),
				 errdetail(DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4, &isnull))
							   ? "The row was claimed without a token; nothing was changed."
							   : "The row was claimed again since this token was issued, or the token is not the one its claim returned; nothing was changed.")));
	}
	elog(ERROR, "workqueue row %lld is running at stage \"%s\" but was not updated",
		 (long long) id, stage);
}

void
queue_lock_running_row_column(SPIPlanPtr plans[2], const char *column, int64 id, Datum expected_stage,
							  pg_uuid_t *token)
{
	static const Oid argtypes[] = {INT8OID, TEXTOID, BYTEAOID};
	Datum			 values[3] = {Int64GetDatum(id), expected_stage, (Datum) 0};
	char			 nulls[3] = "   ";
	bool			 digest = queue_has_claim_digest();
	SPIPlanPtr		*slot = &plans[digest ? 0 : 1];

	values[2] = queue_token_digest_arg(token, nulls, 2);

	if (*slot == NULL)
	{
		char *sql = digest ? psprintf("SELECT %s FROM pepsi.workqueue"
									  " WHERE id = $1 AND status = 'running' AND stage = $2"
									  " AND claim_digest IS NOT DISTINCT FROM $3 FOR UPDATE",
									  column)
						   : psprintf("SELECT %s FROM pepsi.workqueue"
									  " WHERE id = $1 AND status = 'running' AND stage = $2 AND $3 IS NULL FOR UPDATE",
									  column);

		queue_plan(slot, sql, 3, argtypes);
		pfree(sql);
	}
	queue_exec(*slot, values, nulls, false, 1);
	if (SPI_processed == 0)
		queue_report_row_state(id, TextDatumGetCString(expected_stage), token);
}

/*
 * Lock row id, check it is running at expected_stage under claim token
 * (NULL: none), and return how many recipients it has.  For the functions
 * that make several statements' worth of change to one row (pause with
 * clones, splits).
 */
int
queue_lock_running_row(int64 id, const char *expected_stage, pg_uuid_t *token)
{
	static SPIPlanPtr plans[2];
	bool			  isnull;

	queue_lock_running_row_column(plans, "cardinality(rcpt_to)", id, CStringGetTextDatum(expected_stage), token);
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * The recovery of running rows (workqueue_crashed, workqueue_recover,
 * workqueue_reset_orphans) is the dispatcher's: it alone knows which
 * worker died on which row.  A stage worker, a member of the same role,
 * must not put another worker's row back to be claimed again, so these
 * refuse a session that does not hold the one-dispatcher advisory lock
 * (pg_try_advisory_lock(PEPSI_LOCK_CLASS, PEPSI_LOCK_DISPATCH), common/runtime/db.h,
 * which pepsi-dispatch takes before anything else; in its shared mode
 * when the dispatcher serves a set of stages, [dispatch] STAGES, and
 * several such dispatchers share the queue).  A superuser (the
 * caller outside the SECURITY DEFINER function) may: a DBA recovering by
 * hand.
 */
void
queue_check_dispatcher(const char *what)
{
	LOCKTAG tag;

	if (superuser_arg(GetOuterUserId()))
		return;
	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, PEPSI_LOCK_CLASS_ID, PEPSI_LOCK_DISPATCH_ID, 2);
	if (!LockHeldByMe(&tag, ExclusiveLock) && !LockHeldByMe(&tag, ShareLock))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s is for the dispatcher's session only", what),
				 errdetail("It changes rows other workers hold; this session does not hold the"
						   " dispatcher's lock (pg_try_advisory_lock(%u, %u))."
						   " A stage worker changes only the rows it was handed, with their claim tokens.",
						   PEPSI_LOCK_CLASS_ID, PEPSI_LOCK_DISPATCH_ID)));
}

PG_FUNCTION_INFO_V1(dispatcher_check);

/* dispatcher_check(what): queue_check_dispatcher for the PL/pgSQL functions. */
Datum
dispatcher_check(PG_FUNCTION_ARGS)
{
	queue_check_dispatcher(PG_ARGISNULL(0) ? "this function" : text_to_cstring(PG_GETARG_TEXT_PP(0)));
	PG_RETURN_VOID();
}

/* Wake the dispatcher; delivered at commit, and only once per transaction. */
void
queue_notify_workqueue(void)
{
	Async_Notify(PEPSI_WORKQUEUE_CHANNEL, "");
}
