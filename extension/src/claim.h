/*
 * claim.h: the pieces of workqueue_claim (claim.c): the per-backend cache of
 * which senders have pending rows at a stage (sendercache.c) and the
 * fair-share policy that decides how many slots each sender gets
 * (fairshare.c).
 */
#ifndef PEPSI_CLAIM_H
#define PEPSI_CLAIM_H

#include "pepsi.h"

#include "utils/hsearch.h"

/* A sender known to have (had) pending rows at a stage. */
typedef struct SenderHead
{
	uint64 hash;	  /* hash key: of the full sender_key */
	char  *sender;	  /* the sender_key */
	int64  head_seq;  /* lower bound of its oldest pending row's pending_seq */
	int	   candidate; /* index in the current claim's candidates, or -1 */
} SenderHead;

typedef struct SenderCache SenderCache;

/*
 * The one hash of a sender_key, shared by the sender cache and the
 * fair-share accounting: a candidate's accounting is found by its head's
 * hash, so both must hash alike.
 */
extern uint64 sender_key_hash(const char *sender, size_t len);

/* What a sender cache is checked against before a claim (sendercache.c). */
typedef struct SenderCacheSequence
{
	Oid	  sequence; /* pepsi.pending_seq */
	Oid	  filenode; /* pepsi.workqueue's */
	int64 high;		/* the last value drawn from the sequence, or 0 */
} SenderCacheSequence;

extern SenderCache *sender_cache_for_stage(const char *stage);
extern void			sender_cache_read_sequence(SenderCacheSequence *state);
extern bool			sender_cache_validate(SenderCache *cache, const SenderCacheSequence *state);
extern bool			sender_cache_catch_up(SenderCache *cache, int64 read_through, bool read_all);
extern HTAB		   *sender_cache_heads(SenderCache *cache);
extern SenderHead  *sender_cache_lookup(SenderCache *cache, const char *sender);
extern SenderHead  *sender_cache_note(SenderCache *cache, const char *sender, int64 seq);
extern SenderHead  *sender_cache_found(SenderCache *cache, const char *sender, int64 seq);
extern void			sender_cache_forget(SenderCache *cache, SenderHead *head);
extern int64		sender_cache_floor(SenderCache *cache);
extern int64		sender_cache_probe_floor(SenderCache *cache, const SenderCacheSequence *state);
extern void			sender_cache_set_floor(SenderCache *cache, int64 oldest_pending);

/* One sender competing for a stage's slots in one claim. */
typedef struct ClaimCandidate
{
	SenderHead *head;
	double		vtime;	   /* virtual time: worker time used, plus this claim's charges */
	int			taken;	   /* rows of this sender chosen so far in this claim */
	int			asked;	   /* slots assigned in the current round */
	bool		exhausted; /* had fewer pending rows than it was asked for */
} ClaimCandidate;

/* The dispatcher's accounting for one stage: sender_key -> worker time used. */
typedef struct FairAccount FairAccount;

extern FairAccount *fairshare_account(const char *stage, Datum *stages, Datum *senders,
									  Datum *used, int count);
extern void			fairshare_start_vtimes(ClaimCandidate *candidates, int count, FairAccount *account);
extern int			fairshare_fifo_slots(int capacity, int fifo_percent);
extern int			fairshare_assign(ClaimCandidate *candidates, int count, int slots, double row_cost,
									 int *pick_order);

#endif /* PEPSI_CLAIM_H */
