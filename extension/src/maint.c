/*
 * maint.c: the "pepsi maintenance" background worker.
 *
 * It puts paused rows back to pending when their retry time comes (and
 * wakes the dispatcher), sweeps bodies a release race left unreferenced,
 * prunes pepsi.mail_log past its retention and pepsi.autoreply_sent
 * past each row's interval, and keeps the web page's history of the last
 * day, a row a minute (pepsi.stats_minute).  It is also the project's one
 * timer: the rows of pepsi.schedule that are due (pepsi--0.16.sql, "One
 * timer") run in its pass, and it wakes for the earliest.  Like contrib's
 * autoprewarm it is registered at start-up when the library is preloaded
 * and started on demand by pepsi.start_maintenance() otherwise.  Each pass
 * is one short transaction; between passes it holds none, and it sleeps
 * until the earliest paused row is due or pepsi.maintenance_interval.
 *
 * It also tells the operator about the one thing outside Pepsi that makes
 * the queue degrade: a transaction that holds back the xmin horizon (an
 * idle session left in a transaction, a long report, a replication slot's
 * standby).  While it lasts no dead version of a queue row can be removed:
 * the table and its indexes grow by every row version the pipeline
 * writes, and any read that has to pass them slows down (the claim's reads
 * start past them, sendercache.c; a transaction that wrote holds even that
 * floor back).  After pepsi.snapshot_warning the worker logs a warning
 * naming its pid, once per transaction.
 */
#include "pepsi.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "commands/extension.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"

#define MAINT_WORKER_TYPE "pepsi maintenance"
/* Advisory lock keys ('PEPS', 1): one maintenance worker per database. */
#define MAINT_LOCK_KEY1 0x50455053
#define MAINT_LOCK_KEY2 1
/* Rows requeued or log rows pruned per transaction. */
#define MAINT_BATCH 10000
/* How often a worker on a standby looks whether it was promoted. */
#define MAINT_STANDBY_POLL_MS 1000L
/* Schedules run per pass (each is a call or an inject). */
#define MAINT_SCHEDULE_BATCH 100

PG_FUNCTION_INFO_V1(start_maintenance);
PG_FUNCTION_INFO_V1(maintenance_pid);
PGDLLEXPORT void pepsi_maintenance_main(Datum main_arg);

static void
maint_fill_worker(BackgroundWorker *worker)
{
	memset(worker, 0, sizeof(*worker));
	worker->bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker->bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker->bgw_restart_time = 10;
	strlcpy(worker->bgw_library_name, "pepsi", BGW_MAXLEN);
	strlcpy(worker->bgw_function_name, "pepsi_maintenance_main", BGW_MAXLEN);
	strlcpy(worker->bgw_name, MAINT_WORKER_TYPE, BGW_MAXLEN);
	strlcpy(worker->bgw_type, MAINT_WORKER_TYPE, BGW_MAXLEN);
}

/* Under shared_preload_libraries: one worker for pepsi.database. */
void
maint_register_static_worker(void)
{
	BackgroundWorker worker;

	maint_fill_worker(&worker);
	worker.bgw_main_arg = ObjectIdGetDatum(InvalidOid);
	RegisterBackgroundWorker(&worker);
}

/* Run one statement that returns a single numeric value (or none). */
static double
maint_scalar(const char *sql, double if_null)
{
	bool  isnull;
	Datum value;

	if (SPI_execute(sql, false, 1) < 0)
		elog(ERROR, "pepsi maintenance: could not run: %s", sql);
	if (SPI_processed == 0)
		return if_null;
	value = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull)
		return if_null;
	return DatumGetFloat8(value);
}

static bool
maint_take_singleton_lock(void)
{
	bool locked;

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	locked = maint_scalar(psprintf("SELECT pg_try_advisory_lock(%d, %d)::int::float8",
								   MAINT_LOCK_KEY1, MAINT_LOCK_KEY2),
						  0)
			 != 0;
	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	return locked;
}

/*
 * The oldest transaction of this database (or a walsender's) that has held
 * back the xmin horizon, or a transaction id, for pepsi.snapshot_warning or
 * longer (see the file comment): runs the query and returns whether it
 * found one, in SPI_tuptable's first row (in the caller's SPI connection).
 * Its columns: pid, xact_start, program, state, seconds held, user,
 * client, and last statement, its whitespace collapsed and cut to
 * MAINT_STATEMENT_CHARS characters (the warning's; held_horizon() does not
 * return it).
 */
#define MAINT_STATEMENT_CHARS 200
static bool
maint_held_horizon(void)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {INT4OID};
	Datum			  values[1] = {Int32GetDatum(pepsi_snapshot_warning_s)};

	if (pepsi_snapshot_warning_s <= 0)
		return false;
	if (plan == NULL)
	{
		plan = SPI_prepare("SELECT a.pid, a.xact_start,"
						   " coalesce(nullif(a.application_name, ''), a.backend_type),"
						   " coalesce(a.state, ''),"
						   " extract(epoch FROM clock_timestamp() - a.xact_start)::int4,"
						   " coalesce(a.usename::text, ''), coalesce(host(a.client_addr), 'local'),"
						   " left(regexp_replace(coalesce(a.query, ''), '\\s+', ' ', 'g'), " CppAsString2(MAINT_STATEMENT_CHARS) ")"
																																 " FROM pg_stat_activity a"
																																 " WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)"
																																 " AND a.pid <> pg_backend_pid()"
																																 " AND (a.datname = current_database() OR a.backend_type = 'walsender')"
																																 " AND a.xact_start < clock_timestamp() - make_interval(secs => $1)"
																																 " ORDER BY a.xact_start LIMIT 1",
						   1, (Oid *) argtypes);
		if (plan == NULL)
			elog(ERROR, "pepsi: could not prepare the held-horizon check");
		SPI_keepplan(plan);
	}
	if (SPI_execute_plan(plan, values, NULL, true, 1) < 0)
		elog(ERROR, "pepsi: could not run the held-horizon check");
	return SPI_processed > 0;
}

/* Warn once per transaction about the one maint_held_horizon finds. */
static void
maint_warn_held_horizon(void)
{
	static int		   warned_pid;
	static TimestampTz warned_xact_start;
	bool			   isnull;
	int				   pid;
	TimestampTz		   xact_start;

	if (!maint_held_horizon())
		return;
	pid = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	xact_start = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2,
												   &isnull));
	if (pid == warned_pid && xact_start == warned_xact_start)
		return;
	warned_pid = pid;
	warned_xact_start = xact_start;
	ereport(WARNING,
			(errmsg("pepsi maintenance: pid %d (%s, %s, user %s from %s) has held back the xmin horizon"
					" for %s s: the queue's dead row versions cannot be removed while it lasts",
					pid, SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3),
					SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 4),
					SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 6),
					SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 7),
					SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 5)),
			 errdetail("Its last statement: %s", SPI_getvalue(SPI_tuptable->vals[0],
															  SPI_tuptable->tupdesc, 8)),
			 errhint("End that transaction (SELECT pg_terminate_backend(%d) if it was left open);"
					 " meanwhile pepsi.workqueue and its indexes grow with every message.",
					 pid)));
}

PG_FUNCTION_INFO_V1(held_horizon);

/*
 * pepsi.held_horizon(): the transaction the worker would warn about, for
 * pepsi-status: who (pid, program, state, user, client), since when, for
 * how many seconds; no row when none (or pepsi.snapshot_warning is 0).
 * Not its statement, which may be another role's and hold what that role
 * alone may read: that goes only to the server log, as PostgreSQL's own
 * statement logging does.
 */
Datum
held_horizon(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);
	SPI_connect();
	if (maint_held_horizon())
	{
		HeapTuple	  row = SPI_tuptable->vals[0];
		TupleDesc	  desc = SPI_tuptable->tupdesc;
		Datum		  values[7];
		bool		  nulls[7];
		const int	  columns[7] = {1, 3, 4, 6, 7, 2, 5};
		MemoryContext caller = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);

		for (int i = 0; i < 7; i++)
			values[i] = SPI_getbinval(row, desc, columns[i], &nulls[i]);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		MemoryContextSwitchTo(caller);
	}
	SPI_finish();
	return (Datum) 0;
}

/*
 * Is the extension installed, and held so that it stays so until this
 * pass's transaction ends?  Without the lock, a DROP EXTENSION committed
 * between the look and the first call would make the call fail and the
 * worker exit.  DROP takes the extension's object lock exclusively
 * (AcquireDeletionLock), so a shared one waits for it or holds it off;
 * once granted, the look is made again, with the invalidations that the
 * lock's acquisition read.
 */
static bool
maint_extension_held(void)
{
	Oid extension = get_extension_oid("pepsi", true);

	if (!OidIsValid(extension))
		return false;
	LockDatabaseObject(ExtensionRelationId, extension, 0, AccessShareLock);
	return get_extension_oid("pepsi", true) == extension;
}

/*
 * Once a minute, the row of pepsi.stats_minute that the web page's charts
 * read (pepsi--0.3--0.4.sql): the first pass of each minute stores it.  A
 * database before 0.4 has no such function.
 */
static void
maint_roll_stats(TimestampTz now)
{
	static TimestampTz rolled_minute = -1;
	TimestampTz		   minute = now - now % USECS_PER_MINUTE;

	if (minute == rolled_minute)
		return;
	if (maint_scalar("SELECT (to_regprocedure('pepsi.stats_minute_roll()') IS NOT NULL)::int::float8", 0) > 0)
		maint_scalar("SELECT pepsi.stats_minute_roll()::int::float8", 0);
	rolled_minute = minute;
}

/*
 * The schedules that are due (pepsi.schedule_run_due: each in a
 * subtransaction, so one that fails is recorded and the rest run); returns
 * how many milliseconds until the next one is due, or if_none.  As for
 * paused rows, one that was due when the pass began and is still due is
 * one another session holds locked: it waits for the next pass.  A
 * database before 0.5 has no schedule.
 */
static double
maint_run_schedules(double if_none)
{
	double ran;

	if (maint_scalar("SELECT (to_regprocedure('pepsi.schedule_run_due(integer)') IS NOT NULL)::int::float8", 0)
		<= 0)
		return if_none;
	ran = maint_scalar(psprintf("SELECT pepsi.schedule_run_due(%d)::float8", MAINT_SCHEDULE_BATCH), 0);
	if (ran > 0)
		elog(DEBUG1, "pepsi maintenance: ran %.0f schedules", ran);
	if (ran >= MAINT_SCHEDULE_BATCH)
		return 0;
	return maint_scalar("SELECT extract(epoch FROM min(next_run) - clock_timestamp())::float8 * 1000"
						" FROM pepsi.schedule WHERE next_run > now() AND next_run < 'infinity'",
						if_none);
}

/*
 * One maintenance pass in its own transaction.  Returns how long to sleep
 * before the next one, in milliseconds.
 */
static long
maint_run_pass(TimestampTz *last_sweep)
{
	long		sleep_ms = pepsi_maintenance_interval_ms;
	TimestampTz now = GetCurrentTimestamp();

	SetCurrentStatementStartTimestamp();
	StartTransactionCommand();
	SPI_connect();
	PushActiveSnapshot(GetTransactionSnapshot());
	pgstat_report_activity(STATE_RUNNING, MAINT_WORKER_TYPE);

	if (maint_extension_held())
	{
		double requeued;
		double due_in_ms;
		double schedule_in_ms;

		requeued = maint_scalar(psprintf("SELECT pepsi.workqueue_requeue_due(%d)::float8",
										 MAINT_BATCH),
								0);
		if (requeued > 0)
			elog(DEBUG1, "pepsi maintenance: %.0f paused rows are due again", requeued);

		if (TimestampDifferenceExceeds(*last_sweep, now, pepsi_body_gc_interval_s * 1000))
		{
			double bodies = maint_scalar("SELECT pepsi.workqueue_body_gc()::float8", 0);
			double pruned = maint_scalar(psprintf("WITH old AS (DELETE FROM pepsi.mail_log"
												  " WHERE id IN (SELECT id FROM pepsi.mail_log"
												  " WHERE at < now() - interval '%d seconds' LIMIT %d)"
												  " RETURNING 1) SELECT count(*)::float8 FROM old",
												  pepsi_mail_log_retention_s, MAINT_BATCH),
										 0);

			if (bodies > 0)
				elog(LOG, "pepsi maintenance: swept %.0f unreferenced message bodies", bodies);
			if (pruned > 0)
				elog(DEBUG1, "pepsi maintenance: pruned %.0f mail_log rows", pruned);
			/* Vacation's memory of whom it answered, past each interval (not in 0.1). */
			if (maint_scalar("SELECT (to_regprocedure('pepsi.autoreply_prune(integer)')"
							 " IS NOT NULL)::int::float8",
							 0)
				> 0)
			{
				pruned = maint_scalar(psprintf("SELECT pepsi.autoreply_prune(%d)::float8", MAINT_BATCH), 0);
				if (pruned > 0)
					elog(DEBUG1, "pepsi maintenance: pruned %.0f autoreply_sent rows", pruned);
			}
			*last_sweep = now;
		}

		/*
		 * The queue gauges of /metrics (pepsi--0.1--0.2.sql): the function
		 * recounts only when its snapshot has aged past its period.  A
		 * database still at 0.1 has no such function.
		 */
		if (maint_scalar("SELECT (to_regprocedure('pepsi.queue_gauge_refresh(boolean,interval)')"
						 " IS NOT NULL)::int::float8",
						 0)
			> 0)
			maint_scalar("SELECT pepsi.queue_gauge_refresh()::int::float8", 0);

		maint_roll_stats(now);
		maint_warn_held_horizon();
		schedule_in_ms = maint_run_schedules((double) pepsi_maintenance_interval_ms);

		/*
		 * The next wake-up is the earliest row not yet due when this pass
		 * began.  A row that was due then and is still paused is one the
		 * requeue skipped because another session holds it locked; counting
		 * it would make the worker spin until that session lets go, so it
		 * waits for the next pass at pepsi.maintenance_interval instead.  A
		 * row on hold (timeout 'infinity', pepsi.queue_hold) is never due,
		 * and an infinite timestamp cannot be subtracted from.
		 */
		due_in_ms = maint_scalar("SELECT extract(epoch FROM min(timeout) - clock_timestamp())"
								 "::float8 * 1000 FROM pepsi.workqueue"
								 " WHERE status = 'paused' AND timeout > now()"
								 " AND timeout < 'infinity'",
								 (double) pepsi_maintenance_interval_ms);
		if (requeued >= MAINT_BATCH)
			due_in_ms = 0;
		if (schedule_in_ms < due_in_ms)
			due_in_ms = schedule_in_ms;
		if (due_in_ms < sleep_ms)
			sleep_ms = due_in_ms < 1 ? 1 : (long) due_in_ms + 1;
	}

	SPI_finish();
	PopActiveSnapshot();
	CommitTransactionCommand();
	pgstat_report_stat(false);
	pgstat_report_activity(STATE_IDLE, NULL);
	return sleep_ms;
}

/*
 * On a standby (hot standby under Patroni, where the library is preloaded
 * on every node) the worker has nothing to do: every pass writes.  It
 * waits, idle, until the server is promoted, and then serves as on any
 * primary.  The start condition (BgWorkerStart_RecoveryFinished) already
 * keeps the postmaster from starting it during recovery; this covers a
 * worker registered while the server was a primary that is now in
 * recovery again, and says so in the log.
 */
static void
maint_wait_for_primary(void)
{
	bool logged = false;

	while (!ShutdownRequestPending && RecoveryInProgress())
	{
		if (!logged)
			elog(LOG, "pepsi maintenance: the server is a standby (in recovery); idle until it is promoted");
		logged = true;
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 MAINT_STANDBY_POLL_MS, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

void
pepsi_maintenance_main(Datum main_arg)
{
	Oid			database = DatumGetObjectId(main_arg);
	TimestampTz last_sweep = 0;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, SignalHandlerForShutdownRequest);
	BackgroundWorkerUnblockSignals();

	if (OidIsValid(database))
		BackgroundWorkerInitializeConnectionByOid(database, InvalidOid, 0);
	else
		BackgroundWorkerInitializeConnection(pepsi_database, NULL, 0);

	maint_wait_for_primary();
	if (ShutdownRequestPending)
		proc_exit(0);
	if (!maint_take_singleton_lock())
	{
		elog(LOG, "pepsi maintenance: another worker already serves this database; exiting");
		proc_exit(0);
	}
	elog(LOG, "pepsi maintenance worker started");

	while (!ShutdownRequestPending)
	{
		long sleep_ms;

		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}
		/* A primary demoted in place (never under Patroni, which restarts it) stops writing. */
		sleep_ms = RecoveryInProgress() ? MAINT_STANDBY_POLL_MS : maint_run_pass(&last_sweep);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 sleep_ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
	elog(LOG, "pepsi maintenance worker shutting down");
	proc_exit(0);
}

/*
 * The pid of the worker serving this database, that is of the one holding
 * its singleton lock, or 0.  pg_locks is read live at every call, unlike
 * pg_stat_activity, which a transaction sees as of its first look.
 */
static pid_t
maint_serving_pid(void)
{
	double pid;

	SPI_connect();
	pid = maint_scalar(psprintf("SELECT pid::float8 FROM pg_locks"
								" WHERE locktype = 'advisory' AND database = %u"
								" AND classid = %u AND objid = %u AND objsubid = 2 AND granted",
								MyDatabaseId, MAINT_LOCK_KEY1, MAINT_LOCK_KEY2),
					   0);
	SPI_finish();
	return (pid_t) pid;
}

/*
 * pepsi.start_maintenance(): start the worker for the current database, or
 * return the pid of the one already running there.
 *
 * It returns once a worker serves the database: a worker that has started
 * but not yet taken the singleton lock may still bow out to one a
 * concurrent call started, so only the lock holder's pid is an answer.
 */
Datum
start_maintenance(PG_FUNCTION_ARGS)
{
	BackgroundWorker		worker;
	BackgroundWorkerHandle *handle;
	BgwHandleStatus			status;
	pid_t					pid;
	pid_t					serving;

	if ((serving = maint_serving_pid()) != 0)
		PG_RETURN_INT32((int32) serving);

	maint_fill_worker(&worker);
	worker.bgw_main_arg = ObjectIdGetDatum(MyDatabaseId);
	worker.bgw_notify_pid = MyProcPid;
	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
				 errmsg("could not register the pepsi maintenance worker"),
				 errhint("More background workers may be needed: raise max_worker_processes.")));
	status = WaitForBackgroundWorkerStartup(handle, &pid);
	for (;;)
	{
		if (status == BGWH_POSTMASTER_DIED)
			ereport(ERROR,
					(errcode(ERRCODE_ADMIN_SHUTDOWN),
					 errmsg("the postmaster died while starting the pepsi maintenance worker")));
		/* Ours, or the one ours found serving and left to it. */
		if ((serving = maint_serving_pid()) != 0)
			PG_RETURN_INT32((int32) serving);
		/* Stopped, or failed and waiting to be restarted. */
		if (status != BGWH_STARTED)
			ereport(ERROR,
					(errcode(ERRCODE_INSUFFICIENT_RESOURCES),
					 errmsg("the pepsi maintenance worker stopped as it started"),
					 errhint("The server log says why.")));
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 10L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
		status = GetBackgroundWorkerPid(handle, &pid);
	}
}

/*
 * pepsi.maintenance_pid(): the pid of the worker serving this database, or
 * 0.  For pepsi-dispatch, which must not leave paused rows waiting for ever
 * when no worker runs (no shared_preload_libraries, and a worker started
 * with start_maintenance() does not survive a PostgreSQL restart).
 */
Datum
maintenance_pid(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32((int32) maint_serving_pid());
}
