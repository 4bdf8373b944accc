/*
 * fairshare.c: how a stage's free slots are shared among senders.
 *
 * The policy is CFS's: every sender has a virtual time, the worker time its
 * messages have used at the stage (measured and decayed by the dispatcher,
 * which passes it in).  Slots go one at a time to the sender with the least
 * virtual time, each slot charging it the stage's cost of one row, so equal
 * senders interleave and a sender far ahead waits until the others catch
 * up.  A sender the accounting does not know starts level with the
 * least-served sender that has pending rows (quiet time banks no credit),
 * and ties go to the sender whose oldest row has waited longest.
 */
#include "claim.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "utils/builtins.h"
#if PG_VERSION_NUM >= 150000
#include "common/pg_prng.h"
#endif

struct FairAccount
{
	HTAB *used; /* uint64 hash of sender_key -> FairUsed */
};

typedef struct FairUsed
{
	uint64 hash;
	double used;
} FairUsed;

uint64
sender_key_hash(const char *sender, size_t len)
{
	return hash_bytes_extended((const unsigned char *) sender, (int) len, 0);
}

/*
 * The accounting entries of one stage, from the parallel arrays of the
 * call.  Hashing the full key makes a collision between two senders
 * astronomically unlikely (64 bits) rather than impossible; its effect
 * would only be that they share one account.
 */
FairAccount *
fairshare_account(const char *stage, Datum *stages, Datum *senders, Datum *used, int count)
{
	FairAccount *account = palloc(sizeof(FairAccount));
	HASHCTL		 ctl;

	memset(&ctl, 0, sizeof(ctl));
	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(FairUsed);
	ctl.hcxt = CurrentMemoryContext;
	account->used = hash_create("pepsi fair-share accounting", Max(count, 16), &ctl,
								HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	for (int i = 0; i < count; i++)
	{
		text	 *entry_stage = DatumGetTextPP(stages[i]);
		text	 *sender = DatumGetTextPP(senders[i]);
		uint64	  hash;
		FairUsed *entry;
		bool	  found;

		if (strlen(stage) != VARSIZE_ANY_EXHDR(entry_stage)
			|| memcmp(stage, VARDATA_ANY(entry_stage), VARSIZE_ANY_EXHDR(entry_stage)) != 0)
			continue;
		hash = sender_key_hash(VARDATA_ANY(sender), VARSIZE_ANY_EXHDR(sender));
		entry = hash_search(account->used, &hash, HASH_ENTER, &found);
		entry->used = (found ? entry->used : 0) + DatumGetFloat8(used[i]);
	}
	return account;
}

/* Newcomers start level with the least-served accounted sender that is waiting. */
void
fairshare_start_vtimes(ClaimCandidate *candidates, int count, FairAccount *account)
{
	double least = -1;

	for (int i = 0; i < count; i++)
	{
		FairUsed *entry = hash_search(account->used, &candidates[i].head->hash, HASH_FIND, NULL);

		candidates[i].vtime = entry ? entry->used : -1;
		if (entry && (least < 0 || entry->used < least))
			least = entry->used;
	}
	if (least < 0)
		least = 0;
	for (int i = 0; i < count; i++)
		if (candidates[i].vtime < 0)
			candidates[i].vtime = least;
}

/*
 * The slots of a claim that go to the oldest rows regardless of sender.
 * The fraction of a slot is given with that probability, so a dispatcher
 * claiming one or two slots at a time still gives FIFO its share on
 * average, without every small claim going wholly to FIFO.
 */
int
fairshare_fifo_slots(int capacity, int fifo_percent)
{
	double exact = (double) capacity * fifo_percent / 100.0;
	int	   slots = (int) exact;
	double fraction = exact - slots;

#if PG_VERSION_NUM >= 150000
	if (fraction > 0 && pg_prng_double(&pg_global_prng_state) < fraction)
#else
	if (fraction > 0 && (double) random() / ((double) MAX_RANDOM_VALUE + 1) < fraction)
#endif
		slots++;
	return Min(slots, capacity);
}

/* Heap order: least virtual time first, then the longest-waiting oldest row. */
static bool
fairshare_before(const ClaimCandidate *a, const ClaimCandidate *b)
{
	if (a->vtime != b->vtime)
		return a->vtime < b->vtime;
	return a->head->head_seq < b->head->head_seq;
}

static void
fairshare_sift_down(ClaimCandidate *candidates, int *heap, int size, int at)
{
	for (;;)
	{
		int least = at;
		int left = 2 * at + 1;
		int right = left + 1;
		int swap;

		if (left < size && fairshare_before(&candidates[heap[left]], &candidates[heap[least]]))
			least = left;
		if (right < size && fairshare_before(&candidates[heap[right]], &candidates[heap[least]]))
			least = right;
		if (least == at)
			return;
		swap = heap[at];
		heap[at] = heap[least];
		heap[least] = swap;
		at = least;
	}
}

/*
 * Hand out up to slots slots among the candidates not exhausted, one at a
 * time to the least virtual time, charging row_cost for each.  Sets each
 * candidate's asked count and writes the candidate index of every slot, in
 * order, to pick_order.  Returns the number of slots handed out (0 when no
 * candidate is left).  Cost: O(count + slots log count), in memory.
 */
int
fairshare_assign(ClaimCandidate *candidates, int count, int slots, double row_cost,
				 int *pick_order)
{
	int *heap = palloc(sizeof(int) * (count + 1));
	int	 size = 0;
	int	 assigned = 0;

	for (int i = 0; i < count; i++)
	{
		candidates[i].asked = 0;
		if (!candidates[i].exhausted)
			heap[size++] = i;
	}
	for (int at = size / 2 - 1; at >= 0; at--)
		fairshare_sift_down(candidates, heap, size, at);

	while (assigned < slots && size > 0)
	{
		ClaimCandidate *least = &candidates[heap[0]];

		pick_order[assigned++] = heap[0];
		least->asked++;
		least->vtime += row_cost;
		fairshare_sift_down(candidates, heap, size, 0);
	}
	pfree(heap);
	return assigned;
}
