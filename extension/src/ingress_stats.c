/*
 * ingress_stats.c: pepsi.ingress_report, each running pepsi-ingress's row
 * of pepsi.ingress_stats (its sessions and messages), written every few
 * seconds by every instance and removed when it stops.  The plans are kept
 * for the ingress connection's life.
 */
#include "pepsi.h"

#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(ingress_report);

/* What an instance name may be: a host:pid, printable, at most 255 characters. */
#define INGRESS_STATS_INSTANCE_PATTERN "^[[:print:]]{1,255}$"

/*
 * ingress_report(instance, sessions, sessions_total, messages, stopping):
 * the instance's row as of now; with stopping, the row goes.  Each report
 * also removes the rows of instances silent for a day.
 */
Datum
ingress_report(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr delete_plan;
	static SPIPlanPtr upsert_plan;
	static SPIPlanPtr prune_plan;
	static const Oid  upsert_types[] = {TEXTOID, INT4OID, INT8OID, INT8OID};
	Datum			  values[4];
	char			  nulls[4];

	if (PG_ARGISNULL(0)
		|| !DatumGetBool(DirectFunctionCall2Coll(textregexeq, DEFAULT_COLLATION_OID, PG_GETARG_DATUM(0),
												 CStringGetTextDatum(INGRESS_STATS_INSTANCE_PATTERN))))
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("instance must be 1 to 255 printable characters")));
	/* A NULL counter is not negative: the NOT NULL columns refuse it below. */
	if ((!PG_ARGISNULL(1) && PG_GETARG_INT32(1) < 0) || (!PG_ARGISNULL(2) && PG_GETARG_INT64(2) < 0)
		|| (!PG_ARGISNULL(3) && PG_GETARG_INT64(3) < 0))
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE), errmsg("ingress counters cannot be negative")));
	for (int i = 0; i < 4; i++)
	{
		values[i] = PG_ARGISNULL(i) ? (Datum) 0 : PG_GETARG_DATUM(i);
		nulls[i] = PG_ARGISNULL(i) ? 'n' : ' ';
	}

	SPI_connect();
	if (!PG_ARGISNULL(4) && PG_GETARG_BOOL(4))
	{
		queue_exec(queue_plan(&delete_plan, "DELETE FROM pepsi.ingress_stats s WHERE s.instance = $1", 1,
							  upsert_types),
				   values, nulls, false, 0);
		SPI_finish();
		PG_RETURN_VOID();
	}
	queue_exec(queue_plan(&upsert_plan,
						  "INSERT INTO pepsi.ingress_stats AS s (instance, sessions, sessions_total, messages)"
						  " VALUES ($1, $2, $3, $4)"
						  " ON CONFLICT ON CONSTRAINT ingress_stats_pkey DO UPDATE"
						  " SET sessions = EXCLUDED.sessions, sessions_total = EXCLUDED.sessions_total,"
						  "     messages = EXCLUDED.messages, updated_at = now()",
						  4, upsert_types),
			   values, nulls, false, 0);
	queue_exec(queue_plan(&prune_plan, "DELETE FROM pepsi.ingress_stats s WHERE s.updated_at < now() - interval '1 day'",
						  0, NULL),
			   NULL, NULL, false, 0);
	SPI_finish();
	PG_RETURN_VOID();
}
