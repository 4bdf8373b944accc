/*
 * reply_limits.c: the caps on mail Pepsi sends of its own accord.
 *
 * pepsi.dsn_rate_take counts the DSNs sent to one address per clock hour
 * (the bounce stage drops a DSN past the limit); pepsi.autoreply_due lets
 * an automatic responder (a vacation notice) answer one sender once per
 * interval (RFC 3834).  Each is one statement on a row per address, called
 * for every report or reply a stage sends: in C with the plans kept for the
 * backend's life, not re-entered through PL/pgSQL's interpreter per call.
 */
#include "pepsi.h"

#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(dsn_rate_take);
PG_FUNCTION_INFO_V1(autoreply_due);

/* One call in this many sweeps the rows of past hours from pepsi.dsn_rate. */
#define REPLY_LIMITS_DSN_SWEEP_CHANCE 0.01

/*
 * dsn_rate_take(sender, per_hour): count one DSN to sender this hour;
 * false, and an event_log entry, once past per_hour.
 */
Datum
dsn_rate_take(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr take_plan;
	static SPIPlanPtr sweep_plan;
	static SPIPlanPtr log_plan;
	static const Oid  take_types[] = {TEXTOID};
	static const Oid  log_types[] = {TEXTOID, INT4OID, INT4OID};
	Datum			  values[3];
	bool			  isnull;
	int32			  per_hour;
	int32			  counted;

	if (PG_ARGISNULL(0) || VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(0)) == 0 || PG_ARGISNULL(1)
		|| PG_GETARG_INT32(1) < 1)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("dsn_rate_take needs a sender and a limit of at least 1")));
	per_hour = PG_GETARG_INT32(1);

	SPI_connect();
	values[0] = PointerGetDatum(PG_GETARG_TEXT_PP(0));
	queue_exec(queue_plan(&take_plan,
						  "INSERT INTO pepsi.dsn_rate AS r (sender, hour, sent)"
						  " VALUES (lower($1), date_trunc('hour', now()), 1)"
						  " ON CONFLICT ON CONSTRAINT dsn_rate_pkey DO UPDATE"
						  " SET hour = excluded.hour,"
						  "     sent = CASE WHEN r.hour = excluded.hour THEN r.sent + 1 ELSE 1 END"
						  " RETURNING r.sent",
						  1, take_types),
			   values, NULL, false, 0);
	if (SPI_processed != 1)
		elog(ERROR, "the dsn_rate upsert returned %llu rows", (unsigned long long) SPI_processed);
	counted = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));

	/* The table keeps one row per address that got a DSN this hour. */
	if (pg_prng_double(&pg_global_prng_state) < REPLY_LIMITS_DSN_SWEEP_CHANCE)
		queue_exec(queue_plan(&sweep_plan, "DELETE FROM pepsi.dsn_rate r WHERE r.hour < date_trunc('hour', now())",
							  0, NULL),
				   NULL, NULL, false, 0);

	if (counted > per_hour)
	{
		values[1] = Int32GetDatum(per_hour);
		values[2] = Int32GetDatum(counted);
		queue_exec(queue_plan(&log_plan,
							  "SELECT pepsi.event_log_write('dsn_rate_limited',"
							  " jsonb_build_object('sender', lower($1), 'limit', $2, 'this_hour', $3))",
							  3, log_types),
				   values, NULL, false, 0);
	}
	SPI_finish();
	PG_RETURN_BOOL(counted <= per_hour);
}

/*
 * autoreply_due(responder, recipient, every): is a reply from responder to
 * recipient due (none within every)?  If so it is recorded as sent now; of
 * concurrent callers for one pair, one wins.
 */
Datum
autoreply_due(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	static const Oid  types[] = {TEXTOID, TEXTOID, INTERVALOID};
	Datum			  values[3];
	bool			  due;

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR, (errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						errmsg("responder, recipient and every must not be null")));
	values[0] = PointerGetDatum(PG_GETARG_TEXT_PP(0));
	values[1] = PointerGetDatum(PG_GETARG_TEXT_PP(1));
	values[2] = PG_GETARG_DATUM(2);

	SPI_connect();
	queue_exec(queue_plan(&plan,
						  "INSERT INTO pepsi.autoreply_sent AS s (responder, recipient, sent_at, keep_until)"
						  " VALUES (lower($1), lower($2), now(), now() + $3)"
						  " ON CONFLICT ON CONSTRAINT autoreply_sent_pkey DO UPDATE"
						  " SET sent_at = now(), keep_until = now() + $3"
						  " WHERE s.sent_at <= now() - $3",
						  3, types),
			   values, NULL, false, 0);
	due = SPI_processed > 0;
	SPI_finish();
	PG_RETURN_BOOL(due);
}
