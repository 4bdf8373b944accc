/*
 * gauges.c: the snapshot of the queue's counts that /metrics reads.
 *
 * pepsi.queue_gauge holds the counts by stage and status as of the last
 * refresh; pepsi.queue_gauge_refresh recounts when the snapshot is older
 * than its period (twenty times the last count's cost, at least
 * min_period), or always when forced.  The maintenance worker asks at
 * every pass, so the question "is it due?" is the one asked most: one
 * saved plan here.
 */
#include "pepsi.h"

#include "catalog/pg_type.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

PG_FUNCTION_INFO_V1(queue_gauge_refresh);

/* ('PEPS', 3): the advisory lock of the gauge refresh (see the SQL script). */
#define GAUGES_LOCK_KEY1 1346720851
#define GAUGES_LOCK_KEY2 3

/*
 * queue_gauge_refresh(force, min_period): recount unless the snapshot is
 * fresh (and not force) or another session is recounting.  Returns whether
 * it counted.
 */
Datum
queue_gauge_refresh(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr fresh_plan;
	static SPIPlanPtr clear_plan;
	static SPIPlanPtr count_plan;
	static SPIPlanPtr record_plan;
	static const Oid  fresh_types[] = {BOOLOID, INTERVALOID};
	static const Oid  record_types[] = {TIMESTAMPTZOID};
	TimestampTz		  started = GetCurrentTimestamp();
	Datum			  values[2];
	char			  nulls[2];
	bool			  fresh = false;

	SPI_connect();
	/* NULL arguments mean what they meant to the PL/pgSQL original: not fresh. */
	values[0] = PG_ARGISNULL(0) ? (Datum) 0 : PG_GETARG_DATUM(0);
	values[1] = PG_ARGISNULL(1) ? (Datum) 0 : PG_GETARG_DATUM(1);
	nulls[0] = PG_ARGISNULL(0) ? 'n' : ' ';
	nulls[1] = PG_ARGISNULL(1) ? 'n' : ' ';
	queue_exec(queue_plan(&fresh_plan,
						  "SELECT coalesce(NOT $1 AND r.refreshed_at IS NOT NULL"
						  " AND clock_timestamp() - r.refreshed_at < greatest($2, r.duration * 20), false)"
						  " FROM pepsi.queue_gauge_refresh r",
						  2, fresh_types),
			   values, nulls, false, 0);
	if (SPI_processed > 0)
	{
		bool isnull;

		fresh = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	}
	if (fresh
		|| !DatumGetBool(DirectFunctionCall2(pg_try_advisory_xact_lock_int4, Int32GetDatum(GAUGES_LOCK_KEY1),
											 Int32GetDatum(GAUGES_LOCK_KEY2))))
	{
		SPI_finish();
		PG_RETURN_BOOL(false);
	}
	queue_exec(queue_plan(&clear_plan, "DELETE FROM pepsi.queue_gauge", 0, NULL), NULL, NULL, false, 0);
	queue_exec(queue_plan(&count_plan,
						  "INSERT INTO pepsi.queue_gauge"
						  " SELECT c.stage, c.status, c.messages, c.held, c.oldest_received_at"
						  " FROM pepsi.queue_counts() c",
						  0, NULL),
			   NULL, NULL, false, 0);
	values[0] = TimestampTzGetDatum(started);
	queue_exec(queue_plan(&record_plan,
						  "UPDATE pepsi.queue_gauge_refresh"
						  " SET refreshed_at = clock_timestamp(), duration = clock_timestamp() - $1,"
						  "     counted = (SELECT coalesce(sum(g.messages), 0) FROM pepsi.queue_gauge g)",
						  1, record_types),
			   values, NULL, false, 0);
	SPI_finish();
	PG_RETURN_BOOL(true);
}
