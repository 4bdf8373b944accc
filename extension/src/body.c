/*
 * body.c: message bodies shared between rows.
 *
 * A body row is shared by every workqueue row split or cloned off the same
 * message, so a message to N recipients is stored once.  It is released when
 * the last referencing row goes: by the statement trigger on DELETE, and by
 * a stage's copy-on-write in workqueue_commit.  Releases of one body take
 * turns on a row lock, so the last one always frees it (see
 * body_release_unreferenced); workqueue_body_gc() sweeps what anything
 * else leaves (a row deleted by a session in REPEATABLE READ, say).  The opposite
 * error, freeing a body a row still references, cannot pass silently: the
 * foreign key from workqueue.body_id forbids it, and a new reference can
 * only be made by copying one from a row that exists (see spawn_rows).
 */
#include "pepsi.h"

#include "catalog/pg_type.h"
#include "commands/trigger.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

PG_FUNCTION_INFO_V1(workqueue_body_release_trigger);
PG_FUNCTION_INFO_V1(workqueue_body_gc);

/*
 * Free body_id if no row references it any more.  A release that finds a
 * referencing row nobody has locked (not being deleted or changed by
 * another transaction) locks it FOR SHARE and is done: that row can go
 * only after this transaction commits, and its own release then sees this
 * one's delete.  So the releases of one body shared by many rows (a list's
 * post delivered by many workers) go on side by side.  A release that
 * finds none may be the last: releases take turns on the body's row lock,
 * so the second one's reference check, a new statement with a new snapshot
 * under READ COMMITTED, sees the first one's delete and frees the body.
 * Without the lock each would still see the other's row and neither would
 * free it.  The lock is FOR NO KEY UPDATE, which does not conflict with
 * the KEY SHARE lock a clone's foreign key check takes on the same body: a
 * transaction that inserts clones and then finishes their source
 * (finish_with_clones) already holds that lock, and FOR UPDATE would make
 * two of them deadlock.  The sweep skips locked bodies.
 *
 * The referencing row is looked for (SKIP LOCKED: never waiting) among
 * the body's rows stored last: away from the oldest pending ones the
 * dispatcher claims next (its claim's UPDATE would wait for this
 * transaction on a share-locked row) and from the ones finished first (deleted, or locked by their deleting
 * transaction: each a heap visit to pass over).  That is a backward scan
 * of workqueue_body_ref (EXPLAIN: Index Scan Backward): equal keys are
 * kept in heap TID order, so it starts at the highest TIDs, the rows
 * inserted last in a table that mostly appends.  (Within a deduplicated
 * posting list, a few hundred TIDs, PostgreSQL 15 still returns them in
 * ascending order: the row found is among the newest, not the newest.)
 * The body_id is a range of one value on purpose: given "body_id = $1"
 * the planner takes the column for a constant, drops ORDER BY body_id
 * DESC as redundant and scans forwards, from the oldest row.
 */
static void
body_release_one(Datum body_id)
{
	static SPIPlanPtr kept_plan;
	static SPIPlanPtr lock_plan;
	static SPIPlanPtr release_plan;
	static const Oid  argtypes[] = {INT8OID};
	Datum			  values[1] = {body_id};

	queue_exec(queue_plan(&kept_plan,
						  "SELECT 1 FROM pepsi.workqueue w WHERE w.body_id >= $1 AND w.body_id <= $1"
						  " ORDER BY w.body_id DESC LIMIT 1 FOR SHARE SKIP LOCKED",
						  1, argtypes),
			   values, NULL, false, 0);
	if (SPI_processed > 0)
		return;
	queue_exec(queue_plan(&lock_plan, "SELECT id FROM pepsi.workqueue_body WHERE id = $1 FOR NO KEY UPDATE", 1,
						  argtypes),
			   values, NULL, false, 0);
	queue_exec(queue_plan(&release_plan,
						  "DELETE FROM pepsi.workqueue_body b WHERE b.id = $1"
						  " AND NOT EXISTS (SELECT 1 FROM pepsi.workqueue w WHERE w.body_id = b.id)",
						  1, argtypes),
			   values, NULL, false, 0);
}

/*
 * Delete the bodies among ids (ascending, distinct) that no row
 * references: one as above; several (a statement that deleted many
 * messages' rows) all taken in turn, in id order (which keeps releasers
 * from deadlocking), two statements whatever their number.
 */
static void
body_release_unreferenced(const int64 *ids, int count)
{
	static SPIPlanPtr lock_plan;
	static SPIPlanPtr release_plan;
	static const Oid  argtypes[] = {INT8ARRAYOID};
	Datum			 *datums;
	Datum			  values[1];

	if (count == 1)
	{
		body_release_one(Int64GetDatum(ids[0]));
		return;
	}
	datums = palloc(sizeof(Datum) * count);
	for (int i = 0; i < count; i++)
		datums[i] = Int64GetDatum(ids[i]);
	values[0] = PointerGetDatum(construct_array(datums, count, INT8OID, 8, true, TYPALIGN_DOUBLE));
	queue_exec(queue_plan(&lock_plan,
						  "SELECT id FROM pepsi.workqueue_body WHERE id = ANY ($1)"
						  " ORDER BY id FOR NO KEY UPDATE",
						  1, argtypes),
			   values, NULL, false, 0);
	queue_exec(queue_plan(&release_plan,
						  "DELETE FROM pepsi.workqueue_body b WHERE b.id = ANY ($1)"
						  " AND NOT EXISTS (SELECT 1 FROM pepsi.workqueue w WHERE w.body_id = b.id)",
						  1, argtypes),
			   values, NULL, false, 0);
}

void
body_release_if_unreferenced(int64 body_id)
{
	body_release_unreferenced(&body_id, 1);
}

/* Store a new body and return its id (the caller is connected to SPI). */
int64
body_store(bytea *body)
{
	static SPIPlanPtr plan;
	static const Oid  argtypes[] = {BYTEAOID};
	Datum			  values[1] = {PointerGetDatum(body)};

	queue_exec(queue_plan(&plan,
						  "INSERT INTO pepsi.workqueue_body (body) VALUES ($1) RETURNING id",
						  1, argtypes),
			   values, NULL, false, 0);
	return queue_result_int64(0, 1);
}

static int
body_compare_ids(const void *a, const void *b)
{
	int64 x = *(const int64 *) a;
	int64 y = *(const int64 *) b;

	return (x > y) - (x < y);
}

/*
 * AFTER DELETE ... FOR EACH STATEMENT on pepsi.workqueue: collect the
 * distinct body ids of the deleted rows from the transition table and
 * release those nothing references any more, in one prepared statement.
 */
Datum
workqueue_body_release_trigger(PG_FUNCTION_ARGS)
{
	TriggerData	   *trigdata = (TriggerData *) fcinfo->context;
	TupleDesc		tupdesc;
	TupleTableSlot *slot;
	int				body_attnum;
	int64		   *ids;
	int				capacity = 64;
	int				count = 0;
	int				distinct = 0;

	if (!CALLED_AS_TRIGGER(fcinfo) || !TRIGGER_FIRED_BY_DELETE(trigdata->tg_event)
		|| trigdata->tg_oldtable == NULL)
		elog(ERROR, "workqueue_body_release_trigger must fire AFTER DELETE with an OLD TABLE");

	tupdesc = RelationGetDescr(trigdata->tg_relation);
	body_attnum = SPI_fnumber(tupdesc, "body_id");
	if (body_attnum <= 0)
		elog(ERROR, "pepsi.workqueue has no body_id column");

	ids = palloc(sizeof(int64) * capacity);
	slot = MakeSingleTupleTableSlot(tupdesc, &TTSOpsMinimalTuple);
	tuplestore_rescan(trigdata->tg_oldtable);
	while (tuplestore_gettupleslot(trigdata->tg_oldtable, true, false, slot))
	{
		bool  isnull;
		Datum d = slot_getattr(slot, body_attnum, &isnull);

		if (isnull)
			continue;
		if (count == capacity)
		{
			capacity *= 2;
			ids = repalloc(ids, sizeof(int64) * capacity);
		}
		ids[count++] = DatumGetInt64(d);
	}
	ExecDropSingleTupleTableSlot(slot);
	if (count == 0)
		return PointerGetDatum(NULL);

	qsort(ids, count, sizeof(int64), body_compare_ids);
	for (int i = 0; i < count; i++)
		if (i == 0 || ids[i] != ids[i - 1])
			ids[distinct++] = ids[i];

	SPI_connect();
	body_release_unreferenced(ids, distinct);
	SPI_finish();
	return PointerGetDatum(NULL);
}

/*
 * Sweep every body no row references; returns how many were freed.  Bodies
 * another transaction has locked (a release in flight) are skipped, so the
 * sweep never waits on, or deadlocks with, the pipeline.
 */
Datum
workqueue_body_gc(PG_FUNCTION_ARGS)
{
	static SPIPlanPtr plan;
	uint64			  freed;

	SPI_connect();
	queue_exec(queue_plan(&plan,
						  "DELETE FROM pepsi.workqueue_body WHERE id IN"
						  " (SELECT b.id FROM pepsi.workqueue_body b WHERE NOT EXISTS"
						  "   (SELECT 1 FROM pepsi.workqueue w WHERE w.body_id = b.id)"
						  "  FOR UPDATE SKIP LOCKED)",
						  0, NULL),
			   NULL, NULL, false, 0);
	freed = SPI_processed;
	SPI_finish();
	PG_RETURN_INT32((int32) freed);
}
