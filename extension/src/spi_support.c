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
#include "utils/builtins.h"
#include "utils/lsyscache.h"

SPIPlanPtr
queue_plan(SPIPlanPtr *slot, const char *sql, int nargs, const Oid *argtypes)
{
	if (*slot == NULL)
	{
		SPIPlanPtr plan = SPI_prepare(sql, nargs, (Oid *) argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed (%s) for: %s",
				 SPI_result_code_string(SPI_result), sql);
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		*slot = plan;
	}
	return *slot;
}

/* Two syscache lookups a call: the schema can change under a live backend. */
SPIPlanPtr
queue_plan_pending(SPIPlanPtr slots[2], const char *sql, const char *sql_0_1, int nargs,
				   const Oid *argtypes)
{
	Oid queue = get_relname_relid("workqueue", get_namespace_oid("pepsi", false));

	if (OidIsValid(queue) && get_attnum(queue, "index_status") != InvalidAttrNumber)
		return queue_plan(&slots[0], sql, nargs, argtypes);
	return queue_plan(&slots[1], sql_0_1, nargs, argtypes);
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
 * Raise the error that says why row id is not running at expected_stage.
 * Called after a guarded UPDATE or DELETE touched nothing, so the cost of
 * the diagnosis is paid only on the error path.
 */
void
queue_report_row_state(int64 id, const char *expected_stage)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT8OID};
	Datum			  values[1] = {Int64GetDatum(id)};
	char			 *status;
	char			 *stage;

	queue_exec(queue_plan(&plan,
						  "SELECT status::text, stage FROM pepsi.workqueue WHERE id = $1",
						  1, argtypes),
			   values, NULL, true, 1);
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
	elog(ERROR, "workqueue row %lld is running at stage \"%s\" but was not updated",
		 (long long) id, stage);
}

/*
 * Lock row id, check it is running at expected_stage, and return how many
 * recipients it has.  For the functions that make several statements' worth
 * of change to one row (pause with clones, splits).
 */
int
queue_lock_running_row(int64 id, const char *expected_stage)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT8OID, TEXTOID};
	Datum			  values[2] = {Int64GetDatum(id), CStringGetTextDatum(expected_stage)};
	bool			  isnull;

	queue_exec(queue_plan(&plan,
						  "SELECT cardinality(rcpt_to) FROM pepsi.workqueue"
						  " WHERE id = $1 AND status = 'running' AND stage = $2 FOR UPDATE",
						  2, argtypes),
			   values, NULL, false, 1);
	if (SPI_processed == 0)
		queue_report_row_state(id, expected_stage);
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* Wake the dispatcher; delivered at commit, and only once per transaction. */
void
queue_notify_workqueue(void)
{
	Async_Notify(PEPSI_WORKQUEUE_CHANNEL, "");
}
