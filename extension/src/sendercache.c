/*
 * sendercache.c: which senders have pending rows at a stage, kept in the
 * backend's memory across claims.
 *
 * The fair-share claim must know the waiting senders without enumerating
 * them on every call (a skip scan over 10,000 senders costs tens of
 * milliseconds; reading a claim's worth of rows costs a fraction of one).
 * The dispatcher claims through one long-lived connection, so this backend
 * keeps, per stage, the set of senders seen waiting and a watermark on
 * pending_seq, which every row draws afresh when it becomes pending:
 *
 *   - Each claim reads the rows that became pending since the watermark,
 *     oldest first, through the (stage, pending_seq) index, and adds their
 *     senders: a sender that appears between two claims is served from
 *     the very next claim.  The cost is proportional to the arrivals since
 *     the last claim, i.e. amortised O(1) per row.  The claim has read the
 *     stage's oldest rows already (its window, claim.c), and this read
 *     starts past them: when few rows wait, the window holds them all and
 *     nothing is read twice.
 *   - A sender whose rows run out is found so when the claim asks it for
 *     rows and gets fewer; it is dropped then, at the cost of one index
 *     probe it was due anyway.
 *   - A row draws its pending_seq before its transaction commits, so a
 *     slow transaction can make a row visible below the watermark, missed
 *     by the incremental reads.  At every claim when that reads back
 *     little (SENDER_CACHE_RESCAN_EVERY_CLAIM_ROWS), and at least once
 *     every SENDER_CACHE_RESCAN_MS, the
 *     refresh re-reads from far enough back to catch every such row
 *     committed since: each claim records a mark, the watermark it read
 *     from and its snapshot's xmax.  A transaction whose xid is at or past
 *     a mark's xmax got it after that claim, and drew its pending_seq then
 *     too (a row draws it in the statement that writes it, so first), so
 *     above the mark's watermark.  The rows the previous rescan could not
 *     see belong to transactions at or past its snapshot's xmin, so the
 *     rescan reads from the latest mark whose xmax is not past that xmin
 *     (one mark earlier, for the microseconds between a row's draw and its
 *     transaction's xid).  However long a transaction stays open, its rows
 *     are found within SENDER_CACHE_RESCAN_MS of its commit.
 *   - Every SENDER_CACHE_REBUILD_SECONDS (or when more than
 *     SENDER_CACHE_REFRESH_LIMIT rows arrived at once) the set is rebuilt
 *     with one skip scan over the (stage, sender_key, pending_seq) index.
 *
 * The cache is only a guide to the fair picks: the claim gives the slots
 * they cannot fill to the oldest pending rows (claim.c), so a stage with
 * pending rows never idles whatever the cache knows.  But a sender the
 * cache misses is served only in arrival order, behind every older row, so
 * the cache must notice soon that it can no longer be trusted, and it is
 * rebuilt at the next claim when:
 *   - pepsi.pending_seq was re-created, or went back below the watermark
 *     (TRUNCATE ... RESTART IDENTITY, a restore, a setval): rows arriving
 *     now draw values the incremental read has already passed;
 *   - a claim met, among the oldest pending rows, a row below the
 *     watermark from a sender the cache did not hold (sender_cache_found):
 *     rows were missed, so others may have been.  That sender is added at
 *     once; the rebuild comes at most once per SENDER_CACHE_RESCAN_MS.
 *
 * After a server restart, or in a new connection, the cache starts empty
 * and the first claim at each stage pays for one rebuild.
 *
 * The floor: every read of pending rows starts at a pending_seq below
 * which no pending row of the stage can be.  The index entries below it
 * are those of rows that left the stage (claimed, moved on, deleted).
 * Normally each scan marks them dead in the index as it passes, and the
 * next scan skips them; but while any session holds a snapshot older than
 * their deletion (an idle transaction, a long report, a backup), they
 * cannot be marked, and every read from the head of the stage would visit
 * the heap for each of them again: under a burst of 20,000 messages a
 * claim went from 3 to 34 ms (to 140 ms with a snapshot held for a
 * minute), the backlog grew, and with it the entries to walk.  The floor
 * is the lower of the oldest row a claim found pending (rows that become
 * pending later draw higher values) and the lowest value a row its
 * snapshot could not see may hold (the marks, as for the rescan: a
 * transaction still open then drew its value after the mark one before
 * the latest whose xmax is not past the snapshot's xmin).  A read-only
 * snapshot holds no xid, so it does not hold the floor back; only a
 * transaction that wrote and stays open does (and then the marks keep
 * its rows in reach, as before).  A reset sequence, a truncated table and
 * the periodic rebuild start it from 0 again, and so does one claim every
 * SENDER_CACHE_FLOOR_RECHECK_MS (sender_cache_floor): a row below it (a
 * pending_seq set by hand, or drawn long before its transaction got an
 * xid) waits at most that long.  The other rebuilds keep it, and their
 * skip scan passes the entries below it inside the index, without
 * visiting the table.
 */
#include "claim.h"

#include "access/transam.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#define SENDER_CACHE_REFRESH_LIMIT 20000
#define SENDER_CACHE_RESCAN_MS 1000
/*
 * A rescan that reads back no more than this many values of pending_seq
 * is done at every claim, not once per SENDER_CACHE_RESCAN_MS: under a
 * burst, ingress commits batches out of pending_seq order all the time,
 * and a light sender's row drawn in one batch and committed after the
 * next waited up to the whole interval (half a second on average, while
 * the claims between served the burst).  With short transactions the
 * read back is the rows of the last claim or two: tens of index entries.
 * Only an open writing transaction makes it long, and then it is read at
 * the interval again.
 */
#define SENDER_CACHE_RESCAN_EVERY_CLAIM_ROWS 2000
#define SENDER_CACHE_REBUILD_SECONDS 30
#define SENDER_CACHE_MARKS 1024
#define SENDER_CACHE_FLOOR_RECHECK_MS 5000

/* Rows of transactions with an xid at or past xmax drew a pending_seq above watermark. */
typedef struct SenderCacheMark
{
	int64		  watermark;
	TransactionId xmax;
} SenderCacheMark;

struct SenderCache
{
	char		   *stage;
	MemoryContext	context; /* holds heads; reset on rebuild */
	HTAB		   *heads;	 /* uint64 hash -> SenderHead */
	bool			built;
	Oid				sequence;	   /* pepsi.pending_seq the watermark refers to */
	Oid				filenode;	   /* pepsi.workqueue's: a TRUNCATE or a restore changes it */
	int64			floor;		   /* no row of the stage is pending below this */
	TimestampTz		floor_read_at; /* when a claim last read from 0 */
	int64			watermark;	   /* rows pending with pending_seq <= this were read */
	bool			missed_rows;   /* a claim found a pending row the cache had missed */
	TransactionId	rescan_xmin;   /* the xmin of the last rescan's (or rebuild's) snapshot */
	TimestampTz		rescanned_at;
	SenderCacheMark marks[SENDER_CACHE_MARKS]; /* a ring, oldest at first_mark */
	int				first_mark;
	int				nmarks;
	TimestampTz		built_at;
	SenderCache	   *next;
};

static SenderCache	*sender_caches;
static MemoryContext sender_cache_context;

static void
sender_cache_reset(SenderCache *cache)
{
	HASHCTL ctl;

	MemoryContextReset(cache->context);
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(SenderHead);
	ctl.hcxt = cache->context;
	cache->heads = hash_create("pepsi sender heads", 1024, &ctl,
							   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	cache->built = false;
}

SenderCache *
sender_cache_for_stage(const char *stage)
{
	SenderCache *cache;

	for (cache = sender_caches; cache != NULL; cache = cache->next)
		if (strcmp(cache->stage, stage) == 0)
			return cache;

	if (sender_cache_context == NULL)
		sender_cache_context = AllocSetContextCreate(TopMemoryContext, "pepsi sender caches",
													 ALLOCSET_DEFAULT_SIZES);
	cache = MemoryContextAllocZero(sender_cache_context, sizeof(SenderCache));
	cache->stage = MemoryContextStrdup(sender_cache_context, stage);
	cache->context = AllocSetContextCreate(sender_cache_context, "pepsi sender heads",
										   ALLOCSET_DEFAULT_SIZES);
	sender_cache_reset(cache);
	cache->next = sender_caches;
	sender_caches = cache;
	return cache;
}

HTAB *
sender_cache_heads(SenderCache *cache)
{
	return cache->heads;
}

SenderHead *
sender_cache_lookup(SenderCache *cache, const char *sender)
{
	uint64 hash = sender_key_hash(sender, strlen(sender));

	return hash_search(cache->heads, &hash, HASH_FIND, NULL);
}

/* Record that sender has a pending row at seq (adding the sender if new). */
SenderHead *
sender_cache_note(SenderCache *cache, const char *sender, int64 seq)
{
	uint64		hash = sender_key_hash(sender, strlen(sender));
	bool		found;
	SenderHead *head = hash_search(cache->heads, &hash, HASH_ENTER, &found);

	if (!found)
	{
		head->sender = MemoryContextStrdup(cache->context, sender);
		head->head_seq = seq;
		head->candidate = -1;
	}
	else if (seq < head->head_seq)
		head->head_seq = seq;
	return head;
}

void
sender_cache_forget(SenderCache *cache, SenderHead *head)
{
	char *sender = head->sender;

	hash_search(cache->heads, &head->hash, HASH_REMOVE, NULL);
	pfree(sender);
}

/*
 * A claim read this pending row among the stage's oldest rows, outside the
 * fair picks.  A sender the cache does not hold, with a row at or below
 * the watermark, was missed: it is added, and the cache is rebuilt soon
 * (see the file comment).  Returns the sender's head.
 */
SenderHead *
sender_cache_found(SenderCache *cache, const char *sender, int64 seq)
{
	SenderHead *head = sender_cache_lookup(cache, sender);

	if (head != NULL)
		return head;
	if (seq <= cache->watermark)
		cache->missed_rows = true;
	return sender_cache_note(cache, sender, seq);
}

/*
 * The state of pepsi.pending_seq and pepsi.workqueue a cache is checked
 * against (sender_cache_validate): the sequence's OID, the last value drawn
 * from it (not transactional: a bound; 0 when none has been drawn since it
 * was created or reset), and the table's file node.  Read once per claim,
 * for all its stages: a claim names every stage with room, and reading it
 * per stage was most of what a stage with nothing pending cost.  Read
 * before any stage's rows, the value is a lower bound for all of them.
 */
void
sender_cache_read_sequence(SenderCacheSequence *state)
{
	static SPIPlanPtr plan;
	bool			  isnull;
	Datum			  node;

	queue_exec(queue_plan(&plan,
						  "SELECT CASE WHEN is_called THEN last_value ELSE 0 END,"
						  " pg_relation_filenode(to_regclass('pepsi.workqueue'))"
						  " FROM pepsi.pending_seq",
						  0, NULL),
			   NULL, NULL, true, 1);
	node = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	state->filenode = isnull ? InvalidOid : DatumGetObjectId(node);
	state->high = queue_result_int64(0, 1);
	state->sequence = get_relname_relid("pending_seq", get_namespace_oid("pepsi", false));
}

static SenderCacheMark *
sender_cache_mark(SenderCache *cache, int i)
{
	return &cache->marks[(cache->first_mark + i) % SENDER_CACHE_MARKS];
}

/*
 * Record a mark.  When the ring is full the newest mark is replaced: fewer
 * marks only make a rescan start further back.
 */
static void
sender_cache_push_mark(SenderCache *cache, int64 watermark, TransactionId xmax)
{
	SenderCacheMark *mark;

	if (cache->nmarks == SENDER_CACHE_MARKS)
		cache->nmarks--;
	mark = sender_cache_mark(cache, cache->nmarks++);
	mark->watermark = watermark;
	mark->xmax = xmax;
}

/* The mark a rescan reads from (see the file comment): one before the latest not past rescan_xmin. */
static int
sender_cache_rescan_mark(SenderCache *cache)
{
	int latest = -1;

	for (int i = 0; i < cache->nmarks; i++)
		if (TransactionIdPrecedesOrEquals(sender_cache_mark(cache, i)->xmax, cache->rescan_xmin))
			latest = i;
	return Max(latest - 1, 0);
}

/*
 * Where the rescan must read from, dropping the marks no later rescan
 * will need: later rescans look for the latest mark under a later xmin.
 */
static int64
sender_cache_rescan_from(SenderCache *cache)
{
	int from = sender_cache_rescan_mark(cache);

	cache->first_mark = (cache->first_mark + from) % SENDER_CACHE_MARKS;
	cache->nmarks -= from;
	return sender_cache_mark(cache, 0)->watermark;
}

/*
 * Every waiting sender of the stage, by skip scan: O(senders) index probes.
 * high is the sequence's value read before the scan.  When the sequence
 * was reset (or this is the first build) the marks no longer describe it:
 * the next rescan then reads every pending row.
 */
static void
sender_cache_rebuild(SenderCache *cache, Oid sequence, Oid filenode, int64 high,
					 bool sequence_reset, bool floor_reset)
{
	Snapshot		  snapshot = GetActiveSnapshot();
	static SPIPlanPtr plans[2];
	static const Oid  argtypes[] = {TEXTOID, INT8OID};
	Datum			  values[2];

	sender_cache_reset(cache);
	if (floor_reset)
		cache->floor = 0;
	values[0] = CStringGetTextDatum(cache->stage);
	values[1] = Int64GetDatum(cache->floor);
#define SENDER_CACHE_SENDERS_SQL(pending)                                           \
	"WITH RECURSIVE senders AS ("                                                   \
	"  (SELECT sender_key, pending_seq FROM pepsi.workqueue"                        \
	"   WHERE stage = $1 AND " pending " AND pending_seq >= $2"                     \
	"   ORDER BY sender_key, pending_seq LIMIT 1)"                                  \
	"  UNION ALL"                                                                   \
	"  SELECT n.sender_key, n.pending_seq FROM senders s CROSS JOIN LATERAL"        \
	"  (SELECT sender_key, pending_seq FROM pepsi.workqueue"                        \
	"   WHERE stage = $1 AND " pending " AND pending_seq >= $2"                     \
	"   AND sender_key > s.sender_key ORDER BY sender_key, pending_seq LIMIT 1) n)" \
	" SELECT sender_key, pending_seq FROM senders"
	queue_exec(queue_plan_pending(plans, SENDER_CACHE_SENDERS_SQL(QUEUE_PENDING),
								  SENDER_CACHE_SENDERS_SQL(QUEUE_PENDING_0_1), 2, argtypes),
			   values, NULL, true, 0);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char *sender = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);

		sender_cache_note(cache, sender, queue_result_int64(i, 2));
	}
	cache->built = true;
	cache->missed_rows = false;
	cache->sequence = sequence;
	cache->filenode = filenode;
	cache->watermark = high;
	if (sequence_reset)
	{
		cache->nmarks = 0;
		sender_cache_push_mark(cache, 0, snapshot->xmin);
	}
	cache->rescan_xmin = snapshot->xmin;
	cache->built_at = cache->rescanned_at = GetCurrentTimestamp();
}

/*
 * Add the senders of rows that became pending after from.  Returns false,
 * having read nothing, when more than SENDER_CACHE_REFRESH_LIMIT rows did:
 * a rebuild is then cheaper.
 */
static bool
sender_cache_read_arrivals(SenderCache *cache, int64 from)
{
	static SPIPlanPtr plans[2];
	static const Oid  argtypes[] = {TEXTOID, INT8OID, INT4OID};
	Datum			  values[3] = {CStringGetTextDatum(cache->stage), Int64GetDatum(from),
								   Int32GetDatum(SENDER_CACHE_REFRESH_LIMIT + 1)};
	int64			  rows = 0;
	int64			  high = cache->watermark;

#define SENDER_CACHE_ARRIVALS_SQL(pending)                                 \
	"SELECT sender_key, min(pending_seq), max(pending_seq), count(*) FROM" \
	" (SELECT sender_key, pending_seq FROM pepsi.workqueue"                \
	"  WHERE stage = $1 AND " pending " AND pending_seq > $2"              \
	"  ORDER BY pending_seq LIMIT $3) arrivals"                            \
	" GROUP BY sender_key"
	queue_exec(queue_plan_pending(plans, SENDER_CACHE_ARRIVALS_SQL(QUEUE_PENDING),
								  SENDER_CACHE_ARRIVALS_SQL(QUEUE_PENDING_0_1), 3, argtypes),
			   values, NULL, true, 0);
	for (uint64 i = 0; i < SPI_processed; i++)
		rows += queue_result_int64(i, 4);
	if (rows > SENDER_CACHE_REFRESH_LIMIT)
		return false;
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		char *sender = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1);
		int64 newest = queue_result_int64(i, 3);

		sender_cache_note(cache, sender, queue_result_int64(i, 2));
		if (newest > high)
			high = newest;
	}
	cache->watermark = high;
	return true;
}

/* Why the cache must be rebuilt before this claim, or NULL if it need not. */
static const char *
sender_cache_rebuild_reason(SenderCache *cache, Oid sequence, Oid filenode, int64 high,
							TimestampTz now)
{
	if (!cache->built)
		return "first claim";
	if (cache->sequence != sequence)
		return "pepsi.pending_seq was re-created";
	if (high < cache->watermark)
		return "pepsi.pending_seq went back below the rows already read";
	if (cache->filenode != filenode)
		return "pepsi.workqueue was truncated or replaced";
	if (cache->missed_rows
		&& TimestampDifferenceExceeds(cache->built_at, now, SENDER_CACHE_RESCAN_MS))
		return "a claim found pending rows from a sender it had missed";
	if (TimestampDifferenceExceeds(cache->built_at, now, SENDER_CACHE_REBUILD_SECONDS * 1000))
		return "periodic rebuild";
	return NULL;
}

/*
 * Whether the queue's rows were renumbered under the cache: the cache was
 * never built, pepsi.pending_seq was re-created or went back below the
 * watermark, or pepsi.workqueue was truncated.  The watermark, the marks
 * and the floor then describe a numbering the new rows do not follow.
 */
static bool
sender_cache_sequence_reset(const SenderCache *cache, const SenderCacheSequence *state)
{
	return !cache->built || cache->sequence != state->sequence || state->high < cache->watermark
		   || cache->filenode != state->filenode;
}

/*
 * Before a claim: rebuild the cache if it can no longer be trusted (see
 * the file comment).  Returns whether it did; if not, the claim reads its
 * window of oldest rows and then calls sender_cache_catch_up.
 */
bool
sender_cache_validate(SenderCache *cache, const SenderCacheSequence *state)
{
	const char *reason = sender_cache_rebuild_reason(cache, state->sequence, state->filenode,
													 state->high, GetCurrentTimestamp());
	bool		sequence_reset;

	if (reason == NULL)
		return false;
	elog(DEBUG1, "pepsi: rebuilding the sender cache of stage \"%s\": %s", cache->stage, reason);
	sequence_reset = sender_cache_sequence_reset(cache, state);
	sender_cache_rebuild(cache, state->sequence, state->filenode, state->high, sequence_reset,
						 sequence_reset
							 || TimestampDifferenceExceeds(cache->built_at, GetCurrentTimestamp(),
														   SENDER_CACHE_REBUILD_SECONDS * 1000));
	return true;
}

/*
 * Add the senders of the rows that became pending since the last claim
 * (or, once every SENDER_CACHE_RESCAN_MS, since the rescan's mark), the
 * claim having read, in this snapshot, every pending row of the stage up
 * to pending_seq read_through (every one of them if read_all) and noted
 * their senders: the read starts past that.  Returns whether the cache
 * had to be rebuilt instead (its heads are then new).
 */
bool
sender_cache_catch_up(SenderCache *cache, int64 read_through, bool read_all)
{
	Snapshot	snapshot = GetActiveSnapshot();
	TimestampTz now = GetCurrentTimestamp();
	int64		from = cache->watermark;

	sender_cache_push_mark(cache, cache->watermark, snapshot->xmax);
	/* A claim that read every pending row made a rescan's read itself. */
	if (read_all || TimestampDifferenceExceeds(cache->rescanned_at, now, SENDER_CACHE_RESCAN_MS)
		|| cache->watermark - sender_cache_mark(cache, sender_cache_rescan_mark(cache))->watermark
			   <= SENDER_CACHE_RESCAN_EVERY_CLAIM_ROWS)
	{
		from = sender_cache_rescan_from(cache);
		cache->rescan_xmin = snapshot->xmin;
		cache->rescanned_at = now;
	}
	if (read_through > cache->watermark)
		cache->watermark = read_through;
	if (read_all || sender_cache_read_arrivals(cache, Max(from, read_through)))
		return false;
	elog(DEBUG1, "pepsi: rebuilding the sender cache of stage \"%s\": too many arrivals",
		 cache->stage);
	{
		SenderCacheSequence state;

		sender_cache_read_sequence(&state);
		sender_cache_rebuild(cache, state.sequence, state.filenode, state.high, false, false);
	}
	return true;
}

/*
 * Where reads of the stage's pending rows start (see the file comment):
 * from 0 once every SENDER_CACHE_FLOOR_RECHECK_MS.  The marks assume a row
 * draws its pending_seq within a claim's interval of its transaction
 * getting an xid; a backend descheduled in between (on a machine loaded
 * far beyond its cores) can commit a row below the floor, and that read
 * finds it within seconds, at the cost of one walk over the stage's dead
 * entries in that many seconds instead of one per claim.
 */
int64
sender_cache_floor(SenderCache *cache)
{
	TimestampTz now = GetCurrentTimestamp();

	if (TimestampDifferenceExceeds(cache->floor_read_at, now, SENDER_CACHE_FLOOR_RECHECK_MS))
	{
		cache->floor = 0;
		cache->floor_read_at = now;
	}
	return cache->floor;
}

/*
 * Where a probe for any pending row of the stage starts, before the claim
 * has validated the cache (claim.c's claim_stages_pending): the floor, or
 * 0 when the rows were renumbered (sender_cache_sequence_reset).  After a
 * TRUNCATE ... RESTART IDENTITY the floor is a value of the old numbering,
 * above every new row: a probe from it would call the stage empty, its
 * claim would never run to rebuild the cache, and the stage would be
 * served only when the floor's periodic recheck came round.
 */
int64
sender_cache_probe_floor(SenderCache *cache, const SenderCacheSequence *state)
{
	if (sender_cache_sequence_reset(cache, state))
		return 0;
	return sender_cache_floor(cache);
}

/*
 * After a claim's reads: oldest_pending is the pending_seq of the oldest
 * row it found pending (PG_INT64_MAX if none), reading from the floor in
 * the active snapshot.  The new floor is the lower of that and the lowest
 * value a row the snapshot could not see may hold.
 */
void
sender_cache_set_floor(SenderCache *cache, int64 oldest_pending)
{
	TransactionId xmin = GetActiveSnapshot()->xmin;
	int			  latest = -1;
	int64		  unseen = 0;

	for (int i = 0; i < cache->nmarks; i++)
		if (TransactionIdPrecedesOrEquals(sender_cache_mark(cache, i)->xmax, xmin))
			latest = i;
	if (cache->nmarks > 0)
		unseen = sender_cache_mark(cache, Max(latest - 1, 0))->watermark;
	cache->floor = Min(oldest_pending, unseen);
}
