/*
 * destination.c: pepsi.destination_begin, the one call a relay-to-internet
 * worker makes per delivery: may it deliver to this domain now (a
 * concurrency slot, a session advisory lock held until destination_end),
 * or how long to wait and why (backing off, at its concurrency or rate
 * limit).  It also answers what the worker would otherwise ask apart (the
 * domain's MX addresses and cached MTA-STS policy) and ends the worker's
 * previous delivery.  The SQL script says what each part means; here the
 * statements run from plans kept for the worker's connection, and the
 * slots are tried with the lock manager directly, not one interpreted
 * statement per slot.
 */
#include "pepsi.h"

#include <math.h>

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/resowner.h"

PG_FUNCTION_INFO_V1(destination_begin);

/* destination_begin's arguments, in order. */
enum
{
	ARG_DOMAIN,
	ARG_DEFAULT_CONCURRENCY,
	ARG_HOSTS,
	ARG_PREVIOUS_DOMAIN,
	ARG_PREVIOUS_SLOT,
	ARG_PREVIOUS_HOST,
	ARG_PREVIOUS_ADDRESS,
	ARG_PREVIOUS_SECONDS,
	ARG_SLOW_SECONDS,
	ARG_SLOW_LIMIT,
	ARG_HANDOFF_SECONDS,
	ARG_STAGE
};

/* Its OUT columns, in order. */
enum
{
	OUT_SLOT,
	OUT_WAIT_SECONDS,
	OUT_REASON,
	OUT_CONTENDED,
	OUT_ADDRESSES,
	OUT_STS_POLICY_ID,
	OUT_STS_POLICY,
	OUT_TLS_POLICY,
	OUT_TLS_OUTCOME,
	OUT_PER_MESSAGE,
	OUT_COLUMNS
};

/* What destination_begin read of the destination's row. */
typedef struct DestinationRow
{
	bool   found;
	bool   has_concurrency_limit;
	int32  concurrency_limit;
	bool   has_window_limit;
	int32  window_limit;
	bool   has_messages_per_minute;
	int32  messages_per_minute;
	int32  failures;
	char  *last_error; /* NULL when none */
	bool   contended;
	bool   backing_off;
	double backoff_seconds;
	bool   slow;
	char  *tls_policy; /* the TLS result last recorded (NULL: none) */
	char  *tls_outcome;
} DestinationRow;

static text *
destination_lower(text *domain)
{
	return DatumGetTextPP(DirectFunctionCall1Coll(lower, DEFAULT_COLLATION_OID, PointerGetDatum(domain)));
}

/*
 * The advisory-lock keys of pepsi.destination_slot_key and
 * pepsi.destination_waiter_key: the domain's hash (of its lower-case form,
 * with " waiting" for a waiter ticket) in the high half, n in the low.
 */
static int64
destination_key(text *domain, bool waiter, int32 n)
{
	text *name = destination_lower(domain);
	int32 hash;

	if (waiter)
		name = cstring_to_text(psprintf("%s waiting", text_to_cstring(name)));
	hash = DatumGetInt32(DirectFunctionCall1Coll(hashtext, DEFAULT_COLLATION_OID, PointerGetDatum(name)));
	return (int64) (((uint64) (int64) hash << 32) | (uint64) (int64) n);
}

static bool
destination_try_lock(int64 key)
{
	return DatumGetBool(DirectFunctionCall1(pg_try_advisory_lock_int8, Int64GetDatum(key)));
}

static void
destination_unlock(int64 key)
{
	(void) DirectFunctionCall1(pg_advisory_unlock_int8, Int64GetDatum(key));
}

static Datum
destination_column(int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col, isnull);
}

/*
 * The previous delivery, which reached its destination and kept its slot:
 * recorded by destination_end's 'connected' when its destination or
 * address has news (at most once a minute when healthy), otherwise only
 * its slot freed, unless it carries over to this delivery (carried).
 */
static void
destination_end_previous(FunctionCallInfo fcinfo, bool carried)
{
	static SPIPlanPtr news_plan;
	static SPIPlanPtr end_plan;
	static const Oid  news_types[] = {TEXTOID, TEXTOID, INETOID};
	static const Oid  end_types[] = {TEXTOID, INT4OID, TEXTOID, INETOID, FLOAT8OID};
	Datum			  values[5];
	char			  nulls[5];
	bool			  isnull;
	bool			  slot_null = carried || PG_ARGISNULL(ARG_PREVIOUS_SLOT);

	values[0] = PG_GETARG_DATUM(ARG_PREVIOUS_DOMAIN);
	nulls[0] = ' ';
	values[1] = PG_ARGISNULL(ARG_PREVIOUS_HOST) ? (Datum) 0 : PG_GETARG_DATUM(ARG_PREVIOUS_HOST);
	nulls[1] = PG_ARGISNULL(ARG_PREVIOUS_HOST) ? 'n' : ' ';
	values[2] = PG_ARGISNULL(ARG_PREVIOUS_ADDRESS) ? (Datum) 0 : PG_GETARG_DATUM(ARG_PREVIOUS_ADDRESS);
	nulls[2] = PG_ARGISNULL(ARG_PREVIOUS_ADDRESS) ? 'n' : ' ';
	queue_exec(queue_plan(&news_plan,
						  "SELECT EXISTS (SELECT 1 FROM pepsi.destination u"
						  "               WHERE u.domain = lower($1)"
						  "                 AND (u.failures > 0 OR u.window_limit IS NOT NULL"
						  "                      OR u.next_turn > now() - interval '1 minute'"
						  "                      OR u.last_success IS NULL"
						  "                      OR u.last_success < now() - interval '1 minute'))"
						  " OR EXISTS (SELECT 1 FROM pepsi.dns_address b"
						  "            WHERE b.host = $2 AND b.address = $3"
						  "              AND (b.failures > 0 OR b.last_success IS NULL"
						  "                   OR b.last_success < now() - interval '1 minute'))",
						  3, news_types),
			   values, nulls, false, 0);
	if (DatumGetBool(destination_column(1, &isnull)))
	{
		values[0] = PG_GETARG_DATUM(ARG_PREVIOUS_DOMAIN);
		nulls[0] = ' ';
		values[1] = slot_null ? (Datum) 0 : PG_GETARG_DATUM(ARG_PREVIOUS_SLOT);
		nulls[1] = slot_null ? 'n' : ' ';
		values[2] = PG_ARGISNULL(ARG_PREVIOUS_HOST) ? (Datum) 0 : PG_GETARG_DATUM(ARG_PREVIOUS_HOST);
		nulls[2] = PG_ARGISNULL(ARG_PREVIOUS_HOST) ? 'n' : ' ';
		values[3] = PG_ARGISNULL(ARG_PREVIOUS_ADDRESS) ? (Datum) 0 : PG_GETARG_DATUM(ARG_PREVIOUS_ADDRESS);
		nulls[3] = PG_ARGISNULL(ARG_PREVIOUS_ADDRESS) ? 'n' : ' ';
		values[4] = PG_ARGISNULL(ARG_PREVIOUS_SECONDS) ? (Datum) 0 : PG_GETARG_DATUM(ARG_PREVIOUS_SECONDS);
		nulls[4] = PG_ARGISNULL(ARG_PREVIOUS_SECONDS) ? 'n' : ' ';
		queue_exec(queue_plan(&end_plan,
							  "SELECT pepsi.destination_end($1, $2, 'connected', NULL, $3, $4, NULL, NULL,"
							  " 1, 1, 1, $5)",
							  5, end_types),
				   values, nulls, false, 0);
	}
	else if (!slot_null)
		destination_unlock(destination_key(PG_GETARG_TEXT_PP(ARG_PREVIOUS_DOMAIN), false,
										   PG_GETARG_INT32(ARG_PREVIOUS_SLOT)));
}

/* The current addresses of the MX hosts and the domain's cached MTA-STS policy, into out. */
static void
destination_read_routes(FunctionCallInfo fcinfo, text *domain, Datum *out, bool *out_null)
{
	static SPIPlanPtr plan;
	static const Oid  types[] = {TEXTARRAYOID, TEXTOID};
	Datum			  values[2] = {PG_GETARG_DATUM(ARG_HOSTS), PointerGetDatum(domain)};

	queue_exec(queue_plan(&plan,
						  "SELECT (SELECT jsonb_agg(jsonb_build_object('host', a.host, 'address', host(a.address),"
						  "            'failures', a.failures,"
						  "            'retry_in', greatest(0, coalesce(extract(epoch FROM a.next_retry - now()),"
						  "                                             0))::float8))"
						  "        FROM pepsi.dns_address a"
						  "        WHERE a.host = ANY ($1) AND a.expires_at > now()),"
						  "       p.policy_id, p.policy"
						  " FROM (SELECT 1) x LEFT JOIN pepsi.mta_sts_policy p"
						  "   ON p.domain = $2 AND p.expires_at > now()",
						  2, types),
			   values, NULL, false, 1);
	out[OUT_ADDRESSES] = destination_column(1, &out_null[OUT_ADDRESSES]);
	out[OUT_STS_POLICY_ID] = destination_column(2, &out_null[OUT_STS_POLICY_ID]);
	out[OUT_STS_POLICY] = destination_column(3, &out_null[OUT_STS_POLICY]);
}

static void
destination_read_row(text *domain, FunctionCallInfo fcinfo, DestinationRow *d)
{
	static SPIPlanPtr plan;
	static const Oid  types[] = {TEXTOID, FLOAT8OID};
	Datum			  values[2];
	char			  nulls[2];
	bool			  isnull;
	Datum			  v;

	values[0] = PointerGetDatum(domain);
	nulls[0] = ' ';
	values[1] = PG_ARGISNULL(ARG_SLOW_SECONDS) ? (Datum) 0 : PG_GETARG_DATUM(ARG_SLOW_SECONDS);
	nulls[1] = PG_ARGISNULL(ARG_SLOW_SECONDS) ? 'n' : ' ';
	queue_exec(queue_plan(&plan,
						  "SELECT t.concurrency_limit, t.window_limit, t.messages_per_minute, t.failures,"
						  "       t.last_error,"
						  "       coalesce(t.window_limit IS NOT NULL"
						  "                OR t.next_turn > now() - interval '10 seconds', false),"
						  "       coalesce(t.backoff_until > now(), false),"
						  "       extract(epoch FROM t.backoff_until - now())::float8,"
						  "       $2 IS NOT NULL AND coalesce(t.service_seconds >= $2, false),"
						  "       t.tls_policy, t.tls_outcome"
						  " FROM pepsi.destination t WHERE t.domain = $1",
						  2, types),
			   values, nulls, false, 1);
	memset(d, 0, sizeof(*d));
	if (SPI_processed == 0)
		return;
	d->found = true;
	v = destination_column(1, &isnull);
	d->has_concurrency_limit = !isnull;
	d->concurrency_limit = isnull ? 0 : DatumGetInt32(v);
	v = destination_column(2, &isnull);
	d->has_window_limit = !isnull;
	d->window_limit = isnull ? 0 : DatumGetInt32(v);
	v = destination_column(3, &isnull);
	d->has_messages_per_minute = !isnull;
	d->messages_per_minute = isnull ? 0 : DatumGetInt32(v);
	d->failures = DatumGetInt32(destination_column(4, &isnull));
	v = destination_column(5, &isnull);
	d->last_error = isnull ? NULL : TextDatumGetCString(v);
	d->contended = DatumGetBool(destination_column(6, &isnull));
	d->backing_off = DatumGetBool(destination_column(7, &isnull));
	v = destination_column(8, &isnull);
	d->backoff_seconds = isnull ? 0 : DatumGetFloat8(v);
	d->slow = DatumGetBool(destination_column(9, &isnull));
	v = destination_column(10, &isnull);
	d->tls_policy = isnull ? NULL : TextDatumGetCString(v);
	v = destination_column(11, &isnull);
	d->tls_outcome = isnull ? NULL : TextDatumGetCString(v);
}

/*
 * A slow destination is capped at slow_limit only while other mail waits:
 * another destination holds a slot or a waiter ticket (the bigint advisory
 * keys), or among the first rows of the stage not yet done is one for
 * another domain.
 */
static bool
destination_other_mail_waits(text *domain, FunctionCallInfo fcinfo)
{
	static SPIPlanPtr plan;
	static const Oid  types[] = {TEXTOID, TEXTOID};
	Datum			  values[2];
	char			  nulls[2];
	bool			  isnull;

	values[0] = PointerGetDatum(domain);
	nulls[0] = ' ';
	values[1] = PG_ARGISNULL(ARG_STAGE) ? (Datum) 0 : PG_GETARG_DATUM(ARG_STAGE);
	nulls[1] = PG_ARGISNULL(ARG_STAGE) ? 'n' : ' ';
	queue_exec(queue_plan(&plan,
						  "SELECT EXISTS (SELECT 1 FROM pg_locks l"
						  "    WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted"
						  "      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
						  "      AND l.classid <> ((pepsi.destination_slot_key($1, 0) >> 32) & 4294967295)::oid"
						  "      AND l.classid <> ((pepsi.destination_waiter_key($1, 0) >> 32) & 4294967295)::oid)"
						  " OR EXISTS (SELECT 1 FROM (SELECT w.rcpt_to[1] AS rcpt FROM pepsi.workqueue w"
						  "                           WHERE w.stage = $2 AND w.index_status = 'pending'"
						  "                             AND w.status = 'pending'"
						  "                           LIMIT 64) p"
						  "            WHERE lower(split_part(p.rcpt, '@', 2)) <> $1)"
						  " OR EXISTS (SELECT 1 FROM (SELECT w.rcpt_to[1] AS rcpt FROM pepsi.workqueue w"
						  "                           WHERE w.stage = $2 AND w.index_status = 'pending'"
						  "                             AND w.status = 'running'"
						  "                           LIMIT 64) r"
						  "            WHERE lower(split_part(r.rcpt, '@', 2)) <> $1)",
						  2, types),
			   values, nulls, false, 0);
	return DatumGetBool(destination_column(1, &isnull));
}

/*
 * A turn in the destination's virtual queue, spaced by how long a
 * delivery there takes per slot.  Returns the seconds until it (at most 300).
 */
static double
destination_take_turn(text *domain, int32 lim)
{
	static SPIPlanPtr plan;
	static const Oid  types[] = {TEXTOID, INT4OID};
	Datum			  values[2] = {PointerGetDatum(domain), Int32GetDatum(lim)};
	bool			  isnull;
	Datum			  v;

	queue_exec(queue_plan(&plan,
						  "INSERT INTO pepsi.destination AS t (domain, next_turn)"
						  " VALUES ($1, now() + interval '1 second')"
						  " ON CONFLICT ON CONSTRAINT destination_pkey DO UPDATE"
						  " SET next_turn = greatest(t.next_turn, now())"
						  "                 + make_interval(secs => least(coalesce(t.service_seconds, 1), 60) / $2)"
						  " RETURNING least(extract(epoch FROM t.next_turn - now()), 300)::float8",
						  2, types),
			   values, NULL, false, 0);
	v = destination_column(1, &isnull);
	return isnull ? NAN : DatumGetFloat8(v);
}

/*
 * Wait up to handoff_seconds for the slot key, as a statement-level
 * lock_timeout allows: true if it was taken, false if the wait timed out.
 * The wait runs in a subtransaction, as PL/pgSQL's EXCEPTION block did:
 * the timeout's error is caught there, any other error goes on.
 */
static bool
destination_wait_for_slot(int64 key, double handoff_seconds)
{
	MemoryContext oldcontext = CurrentMemoryContext;
	ResourceOwner oldowner = CurrentResourceOwner;
	char		 *saved = pstrdup(GetConfigOption("lock_timeout", false, false));
	double		  ms = ceil(handoff_seconds * 1000);
	bool		  taken = false;

	if (!(ms >= (double) PG_INT64_MIN && ms < -(double) PG_INT64_MIN))
		ereport(ERROR, (errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE), errmsg("bigint out of range")));
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(oldcontext);
	PG_TRY();
	{
		(void) set_config_option("lock_timeout", psprintf(INT64_FORMAT "ms", (int64) ms), PGC_USERSET,
								 PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0, false);
		(void) DirectFunctionCall1(pg_advisory_lock_int8, Int64GetDatum(key));
		taken = true;
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
	}
	PG_CATCH();
	{
		ErrorData *edata;

		MemoryContextSwitchTo(oldcontext);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(oldcontext);
		CurrentResourceOwner = oldowner;
		if (edata->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE)
			ReThrowError(edata);
		FreeErrorData(edata);
		taken = false;
	}
	PG_END_TRY();
	(void) set_config_option("lock_timeout", saved, PGC_USERSET, PGC_S_SESSION, GUC_ACTION_LOCAL, true, 0,
							 false);
	return taken;
}

/*
 * The destination's token bucket (a second's worth, at least one message):
 * returns the tokens it held, one taken if there was one.
 */
static double
destination_take_token(text *domain, bool *isnull)
{
	static SPIPlanPtr read_plan;
	static SPIPlanPtr write_plan;
	static const Oid  read_types[] = {TEXTOID};
	static const Oid  write_types[] = {TEXTOID, FLOAT8OID};
	Datum			  values[2] = {PointerGetDatum(domain), (Datum) 0};
	char			  nulls[2] = {' ', ' '};
	double			  tokens = 0;
	Datum			  v;

	queue_exec(queue_plan(&read_plan,
						  "SELECT least(greatest(t.messages_per_minute / 60.0, 1),"
						  "             coalesce(t.rate_tokens, 1)"
						  "             + extract(epoch FROM now() - coalesce(t.rate_updated, now()))"
						  "               * t.messages_per_minute / 60.0)::float8"
						  " FROM pepsi.destination t WHERE t.domain = $1 FOR UPDATE",
						  1, read_types),
			   values, NULL, false, 1);
	*isnull = true;
	if (SPI_processed > 0)
	{
		v = destination_column(1, isnull);
		if (!*isnull)
			tokens = DatumGetFloat8(v);
	}
	if (*isnull)
		nulls[1] = 'n';
	else
		values[1] = Float8GetDatum(tokens < 1 ? tokens : tokens - 1);
	queue_exec(queue_plan(&write_plan,
						  "UPDATE pepsi.destination t SET rate_tokens = $2, rate_updated = now()"
						  " WHERE t.domain = $1",
						  2, write_types),
			   values, nulls, false, 0);
	return tokens;
}

Datum
destination_begin(PG_FUNCTION_ARGS)
{
	TupleDesc		tupdesc;
	Datum			out[OUT_COLUMNS];
	bool			out_null[OUT_COLUMNS];
	text		   *domain;
	const char	   *name;
	DestinationRow	d;
	bool			has_carried = false;
	int32			carried = 0;
	bool			has_slot = false;
	int32			slot = 0;
	int32			lim;
	HeapTupleHeader result;

	if (PG_ARGISNULL(ARG_DOMAIN) || VARSIZE_ANY_EXHDR(PG_GETARG_TEXT_PP(ARG_DOMAIN)) == 0
		|| PG_ARGISNULL(ARG_DEFAULT_CONCURRENCY) || PG_GETARG_INT32(ARG_DEFAULT_CONCURRENCY) < 1)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("destination_begin needs a domain and a concurrency of at least 1")));
	if (!PG_ARGISNULL(ARG_SLOW_LIMIT) && PG_GETARG_INT32(ARG_SLOW_LIMIT) < 1)
		ereport(ERROR, (errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						errmsg("slow_limit must be at least 1, not %d", PG_GETARG_INT32(ARG_SLOW_LIMIT))));
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "destination_begin must return a row");
	tupdesc = BlessTupleDesc(tupdesc);
	domain = destination_lower(PG_GETARG_TEXT_PP(ARG_DOMAIN));
	name = text_to_cstring(domain);
	for (int i = 0; i < OUT_COLUMNS; i++)
	{
		out[i] = (Datum) 0;
		out_null[i] = true;
	}

	SPI_connect();
	if (!PG_ARGISNULL(ARG_PREVIOUS_DOMAIN))
	{
		/* To the same domain the slot carries over (recorded, not freed); to another it is freed first. */
		if (!PG_ARGISNULL(ARG_PREVIOUS_SLOT)
			&& strcmp(text_to_cstring(destination_lower(PG_GETARG_TEXT_PP(ARG_PREVIOUS_DOMAIN))), name) == 0)
		{
			has_carried = true;
			carried = PG_GETARG_INT32(ARG_PREVIOUS_SLOT);
		}
		destination_end_previous(fcinfo, has_carried);
	}
	if (!PG_ARGISNULL(ARG_HOSTS))
		destination_read_routes(fcinfo, domain, out, out_null);

	destination_read_row(domain, fcinfo, &d);
	out[OUT_CONTENDED] = BoolGetDatum(d.found && d.contended);
	out_null[OUT_CONTENDED] = false;
	/* What is recorded of its TLS: a worker that got the same need not write it again. */
	if (d.tls_policy)
	{
		out[OUT_TLS_POLICY] = CStringGetTextDatum(d.tls_policy);
		out_null[OUT_TLS_POLICY] = false;
	}
	if (d.tls_outcome)
	{
		out[OUT_TLS_OUTCOME] = CStringGetTextDatum(d.tls_outcome);
		out_null[OUT_TLS_OUTCOME] = false;
	}
	if (d.found && d.backing_off)
	{
		if (has_carried)
			destination_unlock(destination_key(domain, false, carried));
		out[OUT_WAIT_SECONDS] = Float8GetDatum(d.backoff_seconds);
		out_null[OUT_WAIT_SECONDS] = false;
		out[OUT_REASON] = CStringGetTextDatum(psprintf("%s is backing off after %d failed connection attempts (%s)",
													   name, d.failures,
													   d.last_error ? d.last_error : "no connection"));
		out_null[OUT_REASON] = false;
		goto done;
	}

	lim = d.has_concurrency_limit ? d.concurrency_limit : PG_GETARG_INT32(ARG_DEFAULT_CONCURRENCY);
	if (d.has_window_limit && d.window_limit < lim)
		lim = d.window_limit;
	if (d.slow && !PG_ARGISNULL(ARG_SLOW_LIMIT) && PG_GETARG_INT32(ARG_SLOW_LIMIT) < lim
		&& destination_other_mail_waits(domain, fcinfo))
		lim = PG_GETARG_INT32(ARG_SLOW_LIMIT);

	if (has_carried && carried < lim)
	{
		has_slot = true;
		slot = carried;
	}
	else
	{
		/* (A carried slot: the destination's limit came down below it.) */
		if (has_carried)
			destination_unlock(destination_key(domain, false, carried));
		for (int32 i = 0; i < lim; i++)
		{
			CHECK_FOR_INTERRUPTS();
			if (destination_try_lock(destination_key(domain, false, i)))
			{
				has_slot = true;
				slot = i;
				break;
			}
		}
	}
	if (!has_slot)
	{
		double wait = destination_take_turn(domain, lim);
		double handoff = PG_ARGISNULL(ARG_HANDOFF_SECONDS) ? 0 : PG_GETARG_FLOAT8(ARG_HANDOFF_SECONDS);

		out[OUT_WAIT_SECONDS] = Float8GetDatum(wait);
		out_null[OUT_WAIT_SECONDS] = isnan(wait);
		if (handoff > 0 && !isnan(wait) && wait <= handoff && !d.slow)
		{
			/* Its turn is near: wait here for slot k, holding waiter ticket k. */
			for (int32 k = 0; k < lim; k++)
			{
				CHECK_FOR_INTERRUPTS();
				if (destination_try_lock(destination_key(domain, true, k)))
				{
					if (destination_wait_for_slot(destination_key(domain, false, k), handoff))
					{
						has_slot = true;
						slot = k;
					}
					destination_unlock(destination_key(domain, true, k));
					break;
				}
			}
		}
		out[OUT_CONTENDED] = BoolGetDatum(true);
		if (!has_slot)
		{
			out[OUT_REASON] = CStringGetTextDatum(psprintf("%s is at its concurrency limit of %d", name, lim));
			out_null[OUT_REASON] = false;
			goto done;
		}
		out_null[OUT_WAIT_SECONDS] = true;
	}
	if (d.has_messages_per_minute)
	{
		bool   tokens_null;
		double tokens = destination_take_token(domain, &tokens_null);

		if (!tokens_null && tokens < 1)
		{
			destination_unlock(destination_key(domain, false, slot));
			has_slot = false;
			out[OUT_WAIT_SECONDS] = Float8GetDatum((1 - tokens) * 60.0 / d.messages_per_minute);
			out_null[OUT_WAIT_SECONDS] = false;
			out[OUT_REASON] = CStringGetTextDatum(
				psprintf("%s is at its rate limit of %d messages a minute", name, d.messages_per_minute));
			out_null[OUT_REASON] = false;
			goto done;
		}
	}

done:
	/* A rate limit counts each message, a slow destination's share each delivery's slot. */
	out[OUT_PER_MESSAGE] = BoolGetDatum(d.found && (d.has_messages_per_minute || d.slow));
	out_null[OUT_PER_MESSAGE] = false;
	out[OUT_SLOT] = Int32GetDatum(slot);
	out_null[OUT_SLOT] = !has_slot;
	result = SPI_returntuple(heap_form_tuple(tupdesc, out, out_null), tupdesc);
	SPI_finish();
	PG_RETURN_DATUM(PointerGetDatum(result));
}
