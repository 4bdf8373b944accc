/*
 * claim.c: workqueue_claim, the dispatcher's one call per wake.
 *
 * For every stage with spare capacity it picks pending rows, sets them
 * running and returns (id, stage, sender_key).  Which rows fill a stage's
 * slots is decided like CPU time among processes (fairshare.c):
 * FAIR_FIFO_PERCENT of the slots go to the rows that have waited longest,
 * whoever sent them, so nothing starves; the rest go one at a time to the
 * sender with the least worker time used, oldest row first within a sender.
 * Slots the fair picks cannot fill go to the oldest rows left, so a stage
 * with pending rows never has idle capacity, whatever the sender cache
 * knows.
 *
 * Cost, per stage and claim of n rows from k distinct senders: one index
 * range read of the stage's n oldest pending rows (the window, which
 * serves the FIFO share, the slots left over, and the fair picks of every
 * sender whose next rows it holds), reading the rows that became pending
 * since the previous claim beyond the window (sendercache.c), an
 * in-memory pass over the waiting senders, one statement that reads the
 * oldest rows of the chosen senders the window did not serve through the
 * (stage, sender_key, pending_seq) index (a probe each), and one UPDATE
 * of n rows.  None of it scans the queue or enumerates its senders,
 * so a claim costs about the same with a thousand pending rows or a
 * million; the occasional rebuild of the sender set (a skip scan, once per
 * 30 s or after a restart) is the one cost that grows with the number of
 * senders, and it is amortised over every claim in between.
 *
 * The dispatcher is the sole writer of pending -> running, so no row lock
 * is taken while choosing.  If a second caller claims concurrently, the
 * final UPDATE re-checks each row is still pending (READ COMMITTED
 * re-evaluates the qualification on the latest version), so a row is
 * handed out at most once; the loser just returns fewer rows.
 *
 * workqueue_claim_tokens (0.4 on) is the same claim returning a fourth
 * column, each row's claim token: 16 random bytes that the row's
 * transitions must name (claim_token.c).  The row keeps only its SHA-256
 * digest, so a stage that reads rows learns no token.  The tokens of a
 * claim are drawn in one call of the strong random source and their
 * digests computed in C, passed to the UPDATE beside the ids; the tokens
 * are never stored.  (Before 0.13's library they were derived in the
 * UPDATE from one random secret and the id, the first 16 bytes of
 * SHA-256(secret || id), so that it needed no join: three sha256() calls
 * a row.)  workqueue_claim,
 * for the dispatchers before 0.4, claims without a token (a NULL digest),
 * and only the transitions without one match those rows.
 */
#include "claim.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

PG_FUNCTION_INFO_V1(workqueue_claim);

/* The rows chosen for one stage, in the order they are handed out. */
typedef struct ClaimChoice
{
	int64 *ids;
	int	   count;
	int	   capacity;
	HTAB  *chosen; /* int64 id set, to skip rows chosen twice */
} ClaimChoice;

static void
claim_choice_init(ClaimChoice *choice, int capacity)
{
	HASHCTL ctl;

	choice->ids = palloc(sizeof(int64) * (capacity + 1));
	choice->count = 0;
	choice->capacity = capacity;
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(int64);
	ctl.hcxt = CurrentMemoryContext;
	choice->chosen = hash_create("pepsi claimed ids", Max(capacity, 16), &ctl,
								 HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

/* Add id unless chosen already; returns whether it was added. */
static bool
claim_choice_add(ClaimChoice *choice, int64 id)
{
	bool found;

	if (choice->count >= choice->capacity)
		return false;
	hash_search(choice->chosen, &id, HASH_ENTER, &found);
	if (found)
		return false;
	choice->ids[choice->count++] = id;
	return true;
}

/*
 * The stage's oldest pending rows, as many as the claim has slots: read
 * once, before anything is chosen, they serve the FIFO share, the fair
 * picks of every sender whose next rows are among them, and the slots
 * left over, and they tell the sender cache every row it would otherwise
 * read again as an arrival (sendercache.c).  When the read comes back
 * short, the window holds every pending row of the stage: a sender with
 * fewer rows in it than it is asked for has no more.  The index it reads
 * holds the stage's running rows too (index_status folds running into
 * pending, so that claim_mark_running is a HOT update): status = 'pending'
 * skips them, the rows in flight at the head of the stage.  It starts at
 * the stage's floor (sendercache.c): the entries below it are of rows
 * that left the stage, which a snapshot held elsewhere can keep from
 * being marked dead, and then every claim would visit them all again.
 */
typedef struct ClaimWindow
{
	int64		*ids;
	int64		*seqs;
	char	   **senders;
	SenderHead **heads; /* each row's sender, in the sender cache */
	int			*next;	/* the next row of the same candidate, or -1 */
	int			*first; /* per candidate: its first row, or -1 */
	int			 count;
	bool		 complete; /* every pending row of the stage is here */
} ClaimWindow;

/* Each row's sender in the cache, which learns the senders it missed. */
static void
claim_window_find_senders(SenderCache *cache, ClaimWindow *window)
{
	for (int i = 0; i < window->count; i++)
		window->heads[i] = sender_cache_found(cache, window->senders[i], window->seqs[i]);
}

static void
claim_window_read(SenderCache *cache, const char *stage, int capacity, ClaimWindow *window)
{
	static SPIPlanPtr plans[2];
	static const Oid  argtypes[] = {TEXTOID, INT4OID, INT8OID};
	Datum			  values[3] = {CStringGetTextDatum(stage), Int32GetDatum(capacity),
								   Int64GetDatum(sender_cache_floor(cache))};

#define CLAIM_WINDOW_SQL(pending)                                                  \
	"SELECT id, sender_key, pending_seq FROM pepsi.workqueue"                      \
	" WHERE stage = $1 AND " pending " AND pending_seq >= $3 ORDER BY pending_seq" \
	" LIMIT $2"
	queue_exec(queue_plan_pending(plans, CLAIM_WINDOW_SQL(QUEUE_PENDING),
								  CLAIM_WINDOW_SQL(QUEUE_PENDING_0_1), 3, argtypes),
			   values, NULL, true, 0);
	window->count = (int) SPI_processed;
	window->complete = window->count < capacity;
	window->ids = palloc(sizeof(int64) * (window->count + 1));
	window->seqs = palloc(sizeof(int64) * (window->count + 1));
	window->senders = palloc(sizeof(char *) * (window->count + 1));
	window->heads = palloc(sizeof(SenderHead *) * (window->count + 1));
	window->next = palloc(sizeof(int) * (window->count + 1));
	window->first = NULL;
	for (int i = 0; i < window->count; i++)
	{
		window->ids[i] = queue_result_int64(i, 1);
		window->seqs[i] = queue_result_int64(i, 3);
		window->senders[i] = SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 2);
	}
	claim_window_find_senders(cache, window);
}

/* Link each candidate's rows of the window, oldest first. */
static void
claim_window_link(ClaimWindow *window, int ncandidates)
{
	window->first = palloc(sizeof(int) * (ncandidates + 1));
	for (int c = 0; c < ncandidates; c++)
		window->first[c] = -1;
	for (int i = window->count - 1; i >= 0; i--)
	{
		int c = window->heads[i]->candidate;

		window->next[i] = c >= 0 ? window->first[c] : -1;
		if (c >= 0)
			window->first[c] = i;
	}
}

/*
 * Up to max of candidate c's rows in the window not chosen yet, oldest
 * first, into rows; returns how many, and raises the sender's head_seq
 * past them.
 */
static int
claim_window_rows(ClaimWindow *window, ClaimCandidate *candidate, int c, ClaimChoice *choice,
				  int64 *rows, int max)
{
	int n = 0;

	for (int i = window->first[c]; i >= 0 && n < max; i = window->next[i])
	{
		bool chosen;

		hash_search(choice->chosen, &window->ids[i], HASH_FIND, &chosen);
		if (chosen)
			continue;
		rows[n++] = window->ids[i];
		if (window->seqs[i] >= candidate->head->head_seq)
			candidate->head->head_seq = window->seqs[i] + 1;
	}
	return n;
}

/*
 * Choose up to slots more of the window's rows, oldest first, charged to
 * their senders.  Used for the FIFO share, before the fair picks, and for
 * the slots the fair picks could not fill, after them.  The window always
 * has enough: it holds as many rows as the claim has slots, or all there
 * are.
 */
static void
claim_oldest_rows(ClaimCandidate *candidates, ClaimWindow *window, int slots, double row_cost,
				  ClaimChoice *choice)
{
	int wanted = Min(choice->count + slots, choice->capacity);

	for (int i = 0; i < window->count && choice->count < wanted; i++)
	{
		int c = window->heads[i]->candidate;

		if (!claim_choice_add(choice, window->ids[i]))
			continue;
		if (c >= 0)
		{
			candidates[c].vtime += row_cost;
			candidates[c].taken++;
		}
	}
}

/*
 * Read the oldest pending rows of the senders given (up to their limits,
 * counting the rows this claim chose already) into rows[i], those not
 * chosen yet, with fetched[i] counting all of them; asked_index maps the
 * n-th sender to its candidate.  From the stage's floor, as the window.
 *
 * Each sender's rows must be read through workqueue_pending_sender, where
 * they lie together in order.  Written as "sender_key = s.sender AND
 * pending_seq >= $4 ORDER BY pending_seq", the read could also be planned
 * through workqueue_pending_fifo, which has the same order once the sender
 * is fixed, with a filter on the sender; and it was, whenever the
 * statistics put few rows at the stage (a queue's statistics are always
 * behind it): both plans were then costed alike, and in bench/fairness
 * the fifo one walked every row of the stage from the floor, the burst's,
 * to find a light sender's one row (1,379 rows and 1,259 buffers for
 * one).  So the sender is bounded by two ranges that make no equality,
 * (sender_key, pending_seq) >= (s.sender, $4) and sender_key <= s.sender
 * (the same rows), and the rows are ordered by (sender_key, pending_seq):
 * only workqueue_pending_sender has that order, and through
 * workqueue_pending_fifo the read would need a sort, which the claim is
 * planned without (pepsi--0.1--0.2.sql).
 */
static void
claim_read_senders(ClaimCandidate *candidates, const char *stage, int64 read_from, Datum *senders,
				   Datum *limits, const int *asked_index, int nasked, ClaimChoice *choice,
				   int64 **rows, int *nrows, int *fetched)
{
	static SPIPlanPtr plans[2];
	static const Oid  argtypes[] = {TEXTOID, TEXTARRAYOID, INT4ARRAYOID, INT8OID};
	Datum			  values[4];

	values[0] = CStringGetTextDatum(stage);
	values[1] = PointerGetDatum(construct_array(senders, nasked, TEXTOID, -1, false, TYPALIGN_INT));
	values[2] = PointerGetDatum(construct_array(limits, nasked, INT4OID, 4, true, TYPALIGN_INT));
	values[3] = Int64GetDatum(read_from);
#define CLAIM_SENDERS_SQL(pending)                                     \
	"SELECT s.n::int4, w.id, w.pending_seq"                            \
	" FROM unnest($2, $3) WITH ORDINALITY AS s(sender, lim, n)"        \
	" CROSS JOIN LATERAL (SELECT id, pending_seq FROM pepsi.workqueue" \
	"   WHERE stage = $1 AND " pending                                 \
	"   AND (sender_key, pending_seq) >= (s.sender, $4)"               \
	"   AND sender_key <= s.sender"                                    \
	"   ORDER BY sender_key, pending_seq LIMIT s.lim) w"
	queue_exec(queue_plan_pending(plans, CLAIM_SENDERS_SQL(QUEUE_PENDING),
								  CLAIM_SENDERS_SQL(QUEUE_PENDING_0_1), 4, argtypes),
			   values, NULL, true, 0);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool  isnull;
		int	  n = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r],
											  SPI_tuptable->tupdesc, 1, &isnull));
		int	  i = asked_index[n - 1];
		int64 id = queue_result_int64(r, 2);
		int64 seq = queue_result_int64(r, 3);
		bool  already;

		fetched[i]++;
		hash_search(choice->chosen, &id, HASH_FIND, &already);
		if (!already)
			rows[i][nrows[i]++] = id;
		if (seq >= candidates[i].head->head_seq)
			candidates[i].head->head_seq = seq + 1;
	}
}

/*
 * One round of fair picks: find, for every candidate asked for slots, its
 * oldest pending rows not chosen yet, and choose them in pick order.  The
 * window has them for a sender with as many rows in it (or for every
 * sender, when it holds every pending row); the others' are read in one
 * statement (asked + taken of them, since the ones this claim already
 * took are its oldest).  A candidate found to have fewer rows than it was
 * asked for has nothing more waiting: it is exhausted.  Returns whether
 * the round made progress (chose a row or exhausted a candidate), so a
 * queue changing under the claim cannot make it loop.
 */
static bool
claim_fair_round(ClaimCandidate *candidates, int count, const int *pick_order, int picks,
				 const char *stage, int64 read_from, ClaimWindow *window, ClaimChoice *choice)
{
	Datum  *senders = palloc(sizeof(Datum) * (count + 1));
	Datum  *limits = palloc(sizeof(Datum) * (count + 1));
	int	   *asked_index = palloc(sizeof(int) * (count + 1));
	int64 **rows = palloc0(sizeof(int64 *) * (count + 1));
	int	   *nrows = palloc0(sizeof(int) * (count + 1));
	int	   *fetched = palloc0(sizeof(int) * (count + 1));
	int	   *limit = palloc0(sizeof(int) * (count + 1));
	int	   *used = palloc0(sizeof(int) * (count + 1));
	int		nasked = 0;
	int		chosen_before = choice->count;
	bool	exhausted_any = false;

	for (int i = 0; i < count; i++)
		if (candidates[i].asked > 0)
		{
			limit[i] = candidates[i].asked + candidates[i].taken;
			rows[i] = palloc(sizeof(int64) * limit[i]);
			nrows[i] = claim_window_rows(window, &candidates[i], i, choice, rows[i],
										 candidates[i].asked);
			if (nrows[i] == candidates[i].asked || window->complete)
			{
				/* As if read: a short count means the sender has no more. */
				fetched[i] = nrows[i] == candidates[i].asked ? limit[i] : nrows[i];
				continue;
			}
			nrows[i] = 0;
			senders[nasked] = CStringGetTextDatum(candidates[i].head->sender);
			limits[nasked] = Int32GetDatum(limit[i]);
			asked_index[nasked] = i;
			nasked++;
		}
	if (nasked > 0)
		claim_read_senders(candidates, stage, read_from, senders, limits, asked_index, nasked, choice,
						   rows, nrows, fetched);

	/* Hand the rows out in pick order, so equal senders interleave. */
	for (int p = 0; p < picks; p++)
	{
		int i = pick_order[p];

		if (used[i] < nrows[i])
		{
			if (claim_choice_add(choice, rows[i][used[i]]))
				candidates[i].taken++;
			used[i]++;
		}
	}
	for (int i = 0; i < count; i++)
		if (candidates[i].asked > 0 && fetched[i] < limit[i])
		{
			candidates[i].exhausted = true;
			exhausted_any = true;
		}
	return choice->count > chosen_before || exhausted_any;
}

/*
 * Set the chosen rows running; returns the ids and senders actually
 * claimed, with their tokens when outdesc has a fourth column.  The
 * re-check is one expression so that no index on (stage, status) is
 * matched to it: the rows are reached by primary key (see
 * workqueue_commit_many).  With tokens, each row's digest rides beside
 * its id in a parallel array ($3), so the UPDATE joins the two unnested.
 * Its plan is the generic one, as workqueue_commit_many's is: the custom
 * plan for the arrays given always looked cheaper, so it was planned at
 * every claim.
 */
static void
claim_mark_running(const char *stage, ClaimChoice *choice, Tuplestorestate *out,
				   TupleDesc outdesc)
{
	static SPIPlanPtr plans[3];
	static const Oid  argtypes[] = {INT8ARRAYOID, TEXTOID, BYTEAARRAYOID};
	Datum			 *ids = palloc(sizeof(Datum) * (choice->count + 1));
	Datum			  values[3];
	char			  nulls[3] = "  n";
	bool			  tokens = outdesc->natts >= 4;
	bool			  has_digest = queue_has_claim_digest();
	HASHCTL			  ctl;
	HTAB			 *claimed;
	typedef struct ClaimedRow
	{
		int64	   id;
		bool	   returned; /* by the UPDATE: the row was still pending */
		char	  *sender;
		pg_uuid_t *token;
	} ClaimedRow;
	pg_uuid_t *issued = NULL;

	if (tokens && !has_digest)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("this schema has no claim tokens"),
				 errhint("Run ALTER EXTENSION pepsi UPDATE.")));
	for (int i = 0; i < choice->count; i++)
		ids[i] = Int64GetDatum(choice->ids[i]);
	values[0] = PointerGetDatum(construct_array(ids, choice->count, INT8OID, 8, true, TYPALIGN_DOUBLE));
	values[1] = CStringGetTextDatum(stage);
	if (tokens)
	{
		Datum *digests = palloc(sizeof(Datum) * (choice->count + 1));

		issued = palloc(sizeof(pg_uuid_t) * (choice->count + 1));
		queue_new_claim_tokens(issued, choice->count);
		for (int i = 0; i < choice->count; i++)
			digests[i] = PointerGetDatum(queue_token_digest(&issued[i]));
		values[2] = PointerGetDatum(construct_array(digests, choice->count, BYTEAOID, -1, false,
													TYPALIGN_INT));
		nulls[2] = ' ';
	}
#define CLAIM_MARK_SQL(set, from, where)                       \
	"UPDATE pepsi.workqueue w SET status = 'running'" set from \
	" WHERE " where " AND (w.status = 'pending' AND w.stage = $2) IS TRUE RETURNING w.id, w.sender_key"
	queue_exec(tokens		? queue_plan_generic(&plans[0],
												 CLAIM_MARK_SQL(", claim_digest = u.digest",
																" FROM unnest($1, $3) AS u(id, digest)", "w.id = u.id"),
												 3, argtypes)
			   : has_digest ? queue_plan_generic(&plans[1],
												 CLAIM_MARK_SQL(", claim_digest = NULL", "", "w.id = ANY ($1)"), 3,
												 argtypes)
							: queue_plan_generic(&plans[2], CLAIM_MARK_SQL("", "", "w.id = ANY ($1)"), 3, argtypes),
			   values, nulls, false, 0);

	/* The rows chosen, each with its token; the UPDATE says which it claimed. */
	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(int64);
	ctl.entrysize = sizeof(ClaimedRow);
	ctl.hcxt = CurrentMemoryContext;
	claimed = hash_create("pepsi claimed rows", Max(choice->count, 16), &ctl,
						  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (int i = 0; i < choice->count; i++)
	{
		ClaimedRow *row = hash_search(claimed, &choice->ids[i], HASH_ENTER, NULL);

		row->returned = false;
		row->token = tokens ? &issued[i] : NULL;
	}
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		int64		id = queue_result_int64(r, 1);
		ClaimedRow *row = hash_search(claimed, &id, HASH_FIND, NULL);

		if (row == NULL)
			elog(ERROR, "the claim returned row %lld, which it did not choose", (long long) id);
		row->returned = true;
		row->sender = SPI_getvalue(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 2);
	}

	/* Return them in the order chosen: the FIFO share first, then fair order. */
	for (int i = 0; i < choice->count; i++)
	{
		ClaimedRow *row = hash_search(claimed, &choice->ids[i], HASH_FIND, NULL);
		Datum		outvalues[4];
		bool		outnulls[4] = {false, false, false, false};

		if (!row->returned)
			continue;
		outvalues[0] = Int64GetDatum(row->id);
		outvalues[1] = CStringGetTextDatum(stage);
		outvalues[2] = CStringGetTextDatum(row->sender);
		if (tokens)
			outvalues[3] = UUIDPGetDatum(row->token);
		tuplestore_putvalues(out, outdesc, outvalues, outnulls);
	}
}

/* Claim up to capacity rows of one stage into out. */
static void
claim_stage(const char *stage, int capacity, const SenderCacheSequence *sequence,
			FairAccount *account, int fifo_percent, double row_cost, Tuplestorestate *out,
			TupleDesc outdesc)
{
	SenderCache	   *cache = sender_cache_for_stage(stage);
	HTAB		   *heads;
	HASH_SEQ_STATUS scan;
	SenderHead	   *head;
	ClaimCandidate *candidates;
	int				ncandidates = 0;
	int			   *pick_order = palloc(sizeof(int) * (capacity + 1));
	ClaimChoice		choice;
	int				fifo_slots;
	ClaimWindow		window;
	bool			rebuilt = sender_cache_validate(cache, sequence);
	int64			read_from;

	/*
	 * The window is read between the cache's check and its catch-up: the
	 * catch-up need not read again what the window holds (every visible
	 * pending row up to the window's last, or all of them), and the
	 * senders of the window's rows are candidates of this very claim.
	 */
	claim_window_read(cache, stage, capacity, &window);
	if (!rebuilt
		&& sender_cache_catch_up(cache, window.count > 0 ? window.seqs[window.count - 1] - 1 : 0,
								 window.complete))
		claim_window_find_senders(cache, &window); /* rebuilt: the heads are new */
	/* The senders' reads start where the window's did; later claims, past its oldest row. */
	read_from = sender_cache_floor(cache);
	sender_cache_set_floor(cache, window.count > 0 ? window.seqs[0] : PG_INT64_MAX);
	heads = sender_cache_heads(cache);
	candidates = palloc(sizeof(ClaimCandidate) * (hash_get_num_entries(heads) + 1));
	hash_seq_init(&scan, heads);
	while ((head = hash_seq_search(&scan)) != NULL)
	{
		head->candidate = ncandidates;
		candidates[ncandidates].head = head;
		candidates[ncandidates].taken = 0;
		candidates[ncandidates].asked = 0;
		candidates[ncandidates].exhausted = false;
		ncandidates++;
	}
	fairshare_start_vtimes(candidates, ncandidates, account);
	claim_window_link(&window, ncandidates);

	claim_choice_init(&choice, capacity);
	fifo_slots = fairshare_fifo_slots(capacity, fifo_percent);
	if (fifo_slots > 0)
		claim_oldest_rows(candidates, &window, fifo_slots, row_cost, &choice);

	while (choice.count < capacity)
	{
		int picks = fairshare_assign(candidates, ncandidates, capacity - choice.count,
									 row_cost, pick_order);

		if (picks == 0
			|| !claim_fair_round(candidates, ncandidates, pick_order, picks, stage, read_from,
								 &window, &choice))
			break;
		CHECK_FOR_INTERRUPTS();
	}

	/*
	 * Work conservation: what the fair picks could not fill (their senders
	 * ran out, or the cache misses senders that are waiting) goes to the
	 * oldest rows, so no slot idles while the stage has pending rows.
	 */
	if (choice.count < capacity)
		claim_oldest_rows(candidates, &window, capacity - choice.count, row_cost, &choice);

	/* Senders with nothing left waiting leave the cache (see sendercache.c). */
	for (int i = 0; i < ncandidates; i++)
	{
		candidates[i].head->candidate = -1;
		if (candidates[i].exhausted)
			sender_cache_forget(cache, candidates[i].head);
	}
	if (choice.count > 0)
		claim_mark_running(stage, &choice, out, outdesc);
}

static Datum *
claim_text_array(ArrayType *array, const char *name, int *count)
{
	Datum *elems;
	bool  *nulls;

	if (ARR_NDIM(array) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name)));
	deconstruct_array(array, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, count);
	for (int i = 0; i < *count; i++)
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] is null", name, i + 1)));
	return elems;
}

static Datum *
claim_float_array(ArrayType *array, const char *name, int expected, const char *model)
{
	Datum *elems;
	bool  *nulls;
	int	   count;

	check_same_length(array, expected, name, model);
	deconstruct_array(array, FLOAT8OID, 8, true, TYPALIGN_DOUBLE, &elems, &nulls, &count);
	for (int i = 0; i < count; i++)
	{
		double value;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s[%d] is null", name, i + 1)));
		value = DatumGetFloat8(elems[i]);
		if (isnan(value) || isinf(value) || value < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s[%d] must be a finite amount of worker time, not negative",
							name, i + 1)));
	}
	return elems;
}

/*
 * Which of the stages given a capacity have a pending row at all, read in
 * one statement: pending[i] for stages[i].  A wake marks every stage the
 * dispatcher runs (a NOTIFY does not say where its rows went), and make
 * run's graph has fifteen, while a light sender's row waits at one; each
 * stage's claim_stage costs two or three statements even when it finds
 * nothing (the window, the cache's catch-up).  A stage found empty is
 * skipped as one given no capacity is.  Each is read from its floor, as
 * its window would be (a row below the floor is found by the floor's
 * periodic reset, there as here), or from 0 when the queue's rows were
 * renumbered (sender_cache_probe_floor), through a LATERAL probe of one row: the
 * start of the window's own index range read, never a scan of the queue.
 * A row committed after this read comes with a wake of its own, which
 * brings the next claim.
 */
static bool *
claim_stages_pending(Datum *stages, Datum *capacities, int nstages,
					 const SenderCacheSequence *sequence)
{
	static SPIPlanPtr plans[2];
	static const Oid  argtypes[] = {TEXTARRAYOID, INT8ARRAYOID};
	bool			 *pending = palloc0(sizeof(bool) * (nstages + 1));
	int				 *asked = palloc(sizeof(int) * (nstages + 1));
	Datum			 *names = palloc(sizeof(Datum) * (nstages + 1));
	Datum			 *floors = palloc(sizeof(Datum) * (nstages + 1));
	Datum			  values[2];
	int				  nasked = 0;

	for (int i = 0; i < nstages; i++)
		if (DatumGetInt32(capacities[i]) > 0)
		{
			SenderCache *cache = sender_cache_for_stage(TextDatumGetCString(stages[i]));

			names[nasked] = stages[i];
			floors[nasked] = Int64GetDatum(sender_cache_probe_floor(cache, sequence));
			asked[nasked++] = i;
		}
	if (nasked <= 1) /* the stage's own window tells as cheaply */
	{
		for (int i = 0; i < nasked; i++)
			pending[asked[i]] = true;
		return pending;
	}
	values[0] = PointerGetDatum(construct_array(names, nasked, TEXTOID, -1, false, TYPALIGN_INT));
	values[1] = PointerGetDatum(construct_array(floors, nasked, INT8OID, 8, true, TYPALIGN_DOUBLE));
#define CLAIM_STAGES_PENDING_SQL(pending)                                            \
	"SELECT u.n::int4 FROM unnest($1, $2) WITH ORDINALITY AS u(stage, floor, n),"    \
	" LATERAL (SELECT 1 FROM pepsi.workqueue w WHERE w.stage = u.stage AND " pending \
	" AND w.pending_seq >= u.floor ORDER BY w.pending_seq LIMIT 1) AS one"
	queue_exec(queue_plan_pending_generic(plans, CLAIM_STAGES_PENDING_SQL(QUEUE_PENDING),
										  CLAIM_STAGES_PENDING_SQL(QUEUE_PENDING_0_1), 2, argtypes),
			   values, NULL, true, 0);
	for (uint64 r = 0; r < SPI_processed; r++)
	{
		bool isnull;
		int	 n = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[r], SPI_tuptable->tupdesc, 1, &isnull));

		if (!isnull && n >= 1 && n <= nasked)
			pending[asked[n - 1]] = true;
	}
	return pending;
}

/*
 * workqueue_claim(stages, capacities, account_stages, account_senders,
 *                 account_used, fifo_percent, row_costs)
 *   RETURNS TABLE (id, stage, sender_key)
 */
Datum
workqueue_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo	   *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc			outdesc;
	Tuplestorestate	   *out;
	MemoryContext		per_query;
	MemoryContext		caller;
	Datum			   *stages;
	Datum			   *capacities;
	bool			   *capacity_nulls;
	int					nstages;
	int					ncapacities;
	Datum			   *account_stages = NULL;
	Datum			   *account_senders = NULL;
	Datum			   *account_used = NULL;
	int					naccount = 0;
	int					fifo_percent;
	Datum			   *row_costs = NULL;
	SenderCacheSequence sequence;
	bool			   *pending;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo)
		|| !(rsinfo->allowedModes & SFRM_Materialize))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("workqueue_claim must be called where a set can be returned"),
				 errhint("Call it in FROM: SELECT * FROM pepsi.workqueue_claim(...).")));
	if (get_call_result_type(fcinfo, NULL, &outdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "workqueue_claim must return a row type");

	if (PG_ARGISNULL(0) || PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", PG_ARGISNULL(0) ? "stages" : "capacities")));
	stages = claim_text_array(PG_GETARG_ARRAYTYPE_P(0), "stages", &nstages);
	check_same_length(PG_GETARG_ARRAYTYPE_P(1), nstages, "capacities", "stages");
	deconstruct_array(PG_GETARG_ARRAYTYPE_P(1), INT4OID, 4, true, TYPALIGN_INT,
					  &capacities, &capacity_nulls, &ncapacities);
	for (int i = 0; i < nstages; i++)
	{
		if (capacity_nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("capacities[%d] is null", i + 1)));
		if (DatumGetInt32(capacities[i]) < 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("capacities[%d] is negative (%d)", i + 1, DatumGetInt32(capacities[i])),
					 errdetail("A capacity is how many more rows the stage's workers can take now.")));
		check_stage_name(DatumGetTextPP(stages[i]), "stages element");
		for (int j = 0; j < i; j++)
			if (strcmp(TextDatumGetCString(stages[i]), TextDatumGetCString(stages[j])) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("stage \"%s\" appears twice in stages", TextDatumGetCString(stages[i])),
						 errdetail("Give each stage once, with its whole spare capacity.")));
	}

	if (PG_ARGISNULL(2) != PG_ARGISNULL(3) || PG_ARGISNULL(3) != PG_ARGISNULL(4))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("account_stages, account_senders and account_used must be given together"),
				 errdetail("They are parallel arrays: element i says how much worker time sender i used at stage i.")));
	if (!PG_ARGISNULL(2))
	{
		int nsenders;

		account_stages = claim_text_array(PG_GETARG_ARRAYTYPE_P(2), "account_stages", &naccount);
		check_same_length(PG_GETARG_ARRAYTYPE_P(3), naccount, "account_senders", "account_stages");
		account_senders = claim_text_array(PG_GETARG_ARRAYTYPE_P(3), "account_senders", &nsenders);
		account_used = claim_float_array(PG_GETARG_ARRAYTYPE_P(4), "account_used", naccount,
										 "account_stages");
	}

	if (PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("fifo_percent must not be null")));
	fifo_percent = PG_GETARG_INT32(5);
	if (fifo_percent < 0 || fifo_percent > 100)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("fifo_percent must be between 0 and 100, not %d", fifo_percent)));
	if (!PG_ARGISNULL(6))
		row_costs = claim_float_array(PG_GETARG_ARRAYTYPE_P(6), "row_costs", nstages, "stages");

	per_query = rsinfo->econtext->ecxt_per_query_memory;
	caller = MemoryContextSwitchTo(per_query);
	outdesc = CreateTupleDescCopy(outdesc);
	out = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(caller);

	SPI_connect();
	sender_cache_read_sequence(&sequence);
	pending = claim_stages_pending(stages, capacities, nstages, &sequence);
	for (int i = 0; i < nstages; i++)
	{
		char		*stage = TextDatumGetCString(stages[i]);
		int			 capacity = DatumGetInt32(capacities[i]);
		FairAccount *account;

		if (capacity == 0)
			continue;
		if (!pending[i])
		{
			/* As claim_stage leaves a window that found nothing. */
			sender_cache_set_floor(sender_cache_for_stage(stage), PG_INT64_MAX);
			continue;
		}
		account = fairshare_account(stage, account_stages, account_senders, account_used, naccount);
		claim_stage(stage, capacity, &sequence, account, fifo_percent,
					row_costs ? DatumGetFloat8(row_costs[i]) : 1.0, out, outdesc);
	}
	SPI_finish();

	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = out;
	rsinfo->setDesc = outdesc;
	return (Datum) 0;
}
